"""From a wrong graph to the compiler step that makes it wrong, and a fix the next run uses
(issue 26), through the installed wheel, with real compiles in real subprocesses.

The miscompiles stand in for a torch bug, and must be in every fresh interpreter the
bisection starts, as a bug in torch would be:
- a wrong decomposition of silu in Inductor's table, installed by a ``sitecustomize`` on
  the children's PYTHONPATH (a patch made in the program alone would not be in them);
- torch's own fault injection, ``cpp.inject_relu_bug_TESTING_ONLY`` (relu(x) as x + 1 in
  the C++ code Inductor generates), an Inductor setting the repro carries.
A wrong lowering named by ``rocm-autopatch bisect`` and healed the next run is the README
demo's part 3, which test_docs runs and checks.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import Venv, clean_env

SITECUSTOMIZE = '''
# A torch whose Inductor decomposition of silu is wrong (stands in for a torch bug).
import torch
from torch._inductor import decomposition as d
d.decompositions[torch.ops.aten.silu.default] = lambda x: x * torch.sigmoid(x) * 1.5
# The first check of a fix dies before its verdict (a step that crashed, as a machine under
# pressure can make one): it is no evidence against the fix, and is run again. The crash is
# where a step applies the fix: a step may be a fork of an interpreter started long before.
import os
marker = os.environ.get("CRASH_FIX_CHECK_ONCE")
if marker:
    from rocm_autopatch.sentinel.healing import fixes
    applied = fixes.applied

    def crash_once(*args, **kwargs):
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
        return applied(*args, **kwargs)

    fixes.applied = crash_once
'''

JOB = r'''
import json, sys, torch
import torch._inductor.config as c
if "relu" in sys.argv:
    c.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.SiLU(), torch.nn.Linear(64, 64),
                        torch.nn.ReLU(), torch.nn.Linear(64, 8))
f = torch.compile(m)
x = torch.randn(32, 64)
with torch.no_grad():
    for _ in range(3):
        y = f(x)
    ok = bool((y - m(x)).abs().max() < 1e-4)
import rocm_autopatch
graphs = rocm_autopatch.report().verify["graphs"]
print(json.dumps({"ok": ok, "graphs": [{k: g.get(k) for k in ("status", "reason", "repro",
                                                             "healed", "bisect")}
                                       for g in graphs]}))
'''


def _env(tmp: Path, **extra: str) -> dict:
    # CI set, as every CI service sets it: torch's make_fallback then refuses an op that
    # torch._decomp can decompose unless asked with warn=False; a healed decomposition must
    # fall back all the same (it once failed in CI only).
    return {"CI": "true", "ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_VERIFY": "fallback",
            "ROCM_AUTOPATCH_VERIFY_DIR": str(tmp / "repros"),
            "ROCM_AUTOPATCH_FIXES": str(tmp / "fixes.json"),
            # One cache directory for every run: a healed compile must not be served the
            # wrong kernel the first run cached.
            "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor-cache"), **extra}


def _job(venv: Venv, env: dict, *args: str) -> dict:
    return venv.json(JOB, *args, env=env)


def _cli(venv: Venv, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv.path / "bin" / "rocm-autopatch"), *args],
                          capture_output=True, text=True, env=clean_env(**env), timeout=900)


@pytest.fixture()
def buggy_torch(tmp_path: Path) -> Path:
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return inject


@pytest.mark.heavy(80)
def test_a_wrong_decomposition_is_bisected_at_exit_and_healed_next_run(
        torch_venv: Venv, tmp_path: Path, buggy_torch: Path) -> None:
    env = _env(tmp_path, PYTHONPATH=str(buggy_torch), ROCM_AUTOPATCH_VERIFY_BISECT="600",
               ROCM_AUTOPATCH_REPORT=str(tmp_path / "report.json"),
               CRASH_FIX_CHECK_ONCE=str(tmp_path / "crashed"))
    first = _job(torch_venv, env)
    (graph,) = first["graphs"]
    assert first["ok"] and graph["status"] == "fell back", first
    folder = Path(graph["repro"])
    # The repro names the program's kernel cache, which its bisection's steps start from.
    from rocm_autopatch.sentinel.healing import steps

    assert steps.program_kernels(str(folder / "repro.py")) == str(tmp_path / "inductor-cache")
    # Started at exit: the compile report, written after it, says so.
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verify"]["graphs"][0]["bisect"]["status"] == "started in the background"
    # The program did not wait for it: the bisection takes several compiles.
    assert not (folder / "bisect.json").exists()
    deadline = time.monotonic() + 600
    while not (folder / "bisect.json").exists() and time.monotonic() < deadline:
        time.sleep(2)
    result = json.loads((folder / "bisect.json").read_text())
    assert result["status"] == "found", ((folder / "bisect-run.log").read_text()[-2000:]
                                         + (folder / "bisect.log").read_text()[-2000:])
    assert result["answer"].startswith("the decomposition of aten.silu.default (application ")
    assert result["change"] == {"kind": "skip", "backend": "aot_eager_decomp_partition",
                                "subsystem": "decomposition",
                                "target": "<OpOverload(op='aten.silu', overload='default')>"}
    # The knobs: each said not to apply to a CPU graph (strict numerics: not in torch 2.13
    # or 2.14's form), and why.
    assert [t["outcome"].split(":")[0] for t in result["tried"]] == ["not tried"] * 6
    progress = (folder / "bisect-run.log").read_text()
    assert "rocm-autopatch bisect: step 1 " in progress and "applications" in progress
    assert (tmp_path / "crashed").exists() and "(again: the last run gave no verdict)" in progress
    # A CPU graph: every step a fork of one interpreter that had imported torch.
    assert result["forked"] == result["steps"], result
    store = json.loads((tmp_path / "fixes.json").read_text())
    (fix,) = store["fixes"]
    assert fix["fingerprint"] == folder.name and fix["change"] == result["change"]
    # The doctor shows the answer beside the graph.
    view = _cli(torch_venv, "doctor", "--report", str(tmp_path / "report.json"), env={})
    assert "bisect: the decomposition of aten.silu.default" in " ".join(view.stdout.split())

    # The next run compiles that graph healed, checks it, and it passes: it runs compiled.
    # (Had the cache served the first run's kernel, the check would have failed.)
    second = _job(torch_venv, _env(tmp_path, PYTHONPATH=str(buggy_torch)))
    (graph,) = second["graphs"]
    assert second["ok"] and graph["status"] == "passed", second
    assert graph["healed"] == ("the decomposition of aten.silu.default left out (the op runs "
                               "as ATen's)")
    doctor = _cli(torch_venv, "doctor", "--verbose", env=_env(tmp_path))
    assert f"graph {folder.name}: the decomposition of aten.silu.default" in doctor.stdout
    gone = _cli(torch_venv, "forget", "--all", env=_env(tmp_path))
    assert gone.returncode == 0 and gone.stdout.startswith("forgot 1 fix")
    assert json.loads((tmp_path / "fixes.json").read_text())["fixes"] == []


@pytest.mark.heavy(28)
def test_bisect_says_when_there_is_nothing_to_find(torch_venv: Venv, tmp_path: Path) -> None:
    """A repro that no longer reproduces (here: torch's fault injection taken out) gets a
    plain answer and nothing is remembered; a directory that is not a repro is refused."""
    env = _env(tmp_path, ROCM_AUTOPATCH_VERIFY_BISECT="0")
    (graph,) = _job(torch_venv, env, "relu")["graphs"]
    repro = Path(graph["repro"]) / "repro.py"
    repro.write_text(repro.read_text().replace("inject_relu_bug_TESTING_ONLY = 'accuracy'",
                                               "inject_relu_bug_TESTING_ONLY = None"))
    run = _cli(torch_venv, "bisect", graph["repro"], env=env)
    assert run.returncode == 1 and run.stdout.startswith(
        "rocm-autopatch bisect: not reproduced: the repro's compiled graph matches eager")
    assert not (tmp_path / "fixes.json").exists()
    assert _cli(torch_venv, "bisect", str(tmp_path), env=env).returncode == 2


def test_bad_values_of_the_new_variables_warn_once(torch_venv: Venv, tmp_path: Path) -> None:
    (tmp_path / "fixes.json").write_text("{not json")
    env = _env(tmp_path, ROCM_AUTOPATCH_VERIFY_BISECT="soon")
    del env["TORCHINDUCTOR_CACHE_DIR"]  # a healthy graph: the suite's shared kernel cache
    proc = torch_venv.run(JOB, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("ROCM_AUTOPATCH_VERIFY_BISECT='soon' is not understood") == 1
    assert proc.stderr.count(f"ROCM_AUTOPATCH_FIXES: {tmp_path / 'fixes.json'} could not be "
                             "read") == 1


FAKE_REPRO = '''
import os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
if open(os.path.join(here, "mode")).read() == "sleep":
    with open(os.path.join(here, "pid"), "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(300)
from torch._inductor import cpu_vec_isa  # the ISAs picked once by the warm interpreter
print("not reproduced: a stand-in repro, pid", os.getpid(), "parent", os.getppid(),
      "isas", cpu_vec_isa.valid_vec_isa_list.cache_info().currsize,
      "cache-dir", os.path.basename(os.environ["TORCHINDUCTOR_CACHE_DIR"]),
      "found", int(os.path.exists(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "k.so"))),
      "bisector", int(os.path.exists(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"],
                                                  "bisect"))))
open(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "built.so"), "w").close()
sys.exit(0)
'''

STEPS = r'''
import json, os, sys, time
from rocm_autopatch.sentinel.healing.steps import OutOfTime, Runner
folder = sys.argv[1]
mode = os.path.join(folder, "mode")
with open(mode, "w") as fh:
    fh.write("ok")
log = open(os.path.join(folder, "log"), "w")
runner = Runner(folder, 300, lambda line: None, log, device="cpu")
first = [runner.good("warm"), runner.last, runner.server.pid]
os.killpg(runner.server.pid, 9)  # the warm interpreter dies
runner.server.wait()
second = [runner.good("after it died"), runner.last, runner.forked, runner.fork]
runner.close()
with open(mode, "w") as fh:
    fh.write("sleep")
runner = Runner(folder, 12, lambda line: None, log, device="cpu")
try:
    runner.good("a step that never ends")
    ended = "returned"
except OutOfTime:
    ended = "out of time"
runner.close()
pid = int(open(os.path.join(folder, "pid")).read())
try:
    os.kill(pid, 0)
    alive = True
except ProcessLookupError:
    alive = False
print(json.dumps({"first": first, "second": second, "ended": ended, "alive": alive,
                  "forked": runner.forked}))
'''


def test_a_cpu_graphs_steps_fork_from_a_warm_interpreter_and_stay_bounded(
        torch_venv: Venv, tmp_path: Path) -> None:
    """A CPU graph's steps are forks of one interpreter that imported torch and picked the
    CPU's vector ISA: each one's verdict is read; if that interpreter dies, the steps go on
    in fresh interpreters; a step that never ends is killed at the limit, with what it
    started."""
    # The program's kernel cache, pinned as torch pins it in a repro (``repro._fill``): a
    # kernel, and the state torch's own bisector left there (its command line's).
    program = tmp_path / "program-kernels"
    (program / "bisect").mkdir(parents=True)
    (program / "bisect" / "bisect_status.txt").write_text("inductor\n")
    (program / "k.so").write_text("a kernel")
    pin = f"os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', {str(program)!r})\n"
    (tmp_path / "repro.py").write_text(FAKE_REPRO.replace("import os, sys, time\n",
                                                          "import os, sys, time\n" + pin))
    out = torch_venv.json(STEPS, str(tmp_path))
    ok, last, server = out["first"]
    assert ok and last.startswith("not reproduced: a stand-in repro")
    # Its steps find the program's kernels, in a directory of their own (what they build
    # stays out of the program's cache), without the program's bisector state.
    said = last.split("cache-dir ")[1].split()
    assert said[0] == "inductor" and said[1:5] == ["found", "1", "bisector", "0"], last
    assert sorted(p.name for p in program.iterdir()) == ["bisect", "k.so"]
    assert last.split("parent ")[1].split()[0] == str(server)  # forked by the warm one
    assert last.split("isas ")[1].split()[0] == "1"  # no step probes the CPU again
    ok, last, forked, fork = out["second"]
    assert ok and forked == 1 and fork is False
    assert f"parent {server}" not in last  # a fresh interpreter
    assert last.split("isas ")[1].split()[0] == "0"
    assert "could not run the step" in (tmp_path / "log").read_text()
    assert out["ended"] == "out of time" and out["forked"] == 1 and out["alive"] is False


@pytest.mark.fast
def test_a_bisections_kernel_cache_links_the_programs_kernels_and_nothing_else(
        tmp_path: Path) -> None:
    from rocm_autopatch.sentinel.healing import steps

    program, own = tmp_path / "program", tmp_path / "own"
    (program / "bisect").mkdir(parents=True)
    (program / "bisect" / "bisect_status.txt").write_text("inductor")
    (program / "ab").mkdir()
    (program / "ab" / "k.so").write_text("a kernel")
    (program / "ab" / "k.so.lock").write_text("")
    assert steps.seed(str(program), str(own)) == 1
    assert sorted(str(p.relative_to(own)) for p in own.rglob("*")) == ["ab", "ab/k.so"]
    assert (own / "ab" / "k.so").stat().st_ino == (program / "ab" / "k.so").stat().st_ino
    assert steps.seed(None, str(tmp_path / "empty")) == 0 and (tmp_path / "empty").is_dir()
    # Every variable a knob sets is one a repro's pin yields to.
    from rocm_autopatch.sentinel.healing import bisect

    names = {k.change["name"] for k in bisect.KNOBS if k.change["kind"] == "env"}
    assert names and names <= steps.STEP_VARIABLES
    from rocm_autopatch.sentinel.healing import repro

    pins = ("os.environ['TRITON_HIP_USE_BLOCK_PINGPONG'] = '1'\n"
            "os.environ['TORCHINDUCTOR_CACHE_DIR'] = '/tmp/k'\n"
            "os.environ['TORCHINDUCTOR_MAX_AUTOTUNE'] = '1'\n")  # as torch writes them
    assert repro.yielding(pins).splitlines() == [
        "os.environ.setdefault('TRITON_HIP_USE_BLOCK_PINGPONG', '1')",
        "os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', '/tmp/k')",
        "os.environ['TORCHINDUCTOR_MAX_AUTOTUNE'] = '1'"]  # the program's, kept


@pytest.mark.fast
def test_the_programs_kernel_cache_is_read_from_the_repro_where_it_exists(
        tmp_path: Path) -> None:
    from rocm_autopatch.sentinel.healing import steps

    repro = tmp_path / "repro.py"
    repro.write_text("import os\nos.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', "
                     f"{str(tmp_path)!r})\n")
    assert steps.program_kernels(str(repro)) == str(tmp_path)
    repro.write_text("import os\nos.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', "
                     f"{str(tmp_path / 'elsewhere')!r})\n")  # sent from another machine
    assert steps.program_kernels(str(repro)) is None
    repro.write_text("import os\n")
    assert steps.program_kernels(str(repro)) is None
    assert steps.program_kernels(str(tmp_path / "missing.py")) is None


@pytest.mark.fast
def test_the_pipelining_knob_builds_inductors_rocm_templates_with_one_stage() -> None:
    """No Inductor key bounds num_stages; the knob (and a fix remembered from it) makes the
    ROCm template heuristics of the running torch take 1 (their default is Triton's AMD
    backend's, 2), and leaves torch as it was afterwards."""
    import torch._inductor.utils as inductor_utils

    from rocm_autopatch.sentinel.healing import bisect, fixes

    knob = next(k for k in bisect.KNOBS if k.change == {"kind": "stages1"})
    assert "triton-lang/triton#9815" in knob.ref
    if not hasattr(inductor_utils, "get_backend_num_stages"):  # torch 2.4: no such heuristic
        with fixes.applied({"change": knob.change}):  # nothing to change, nothing raised
            pass
        pytest.skip("this torch has no get_backend_num_stages (torch 2.4)")
    before = inductor_utils.get_backend_num_stages
    with fixes.applied({"change": knob.change}):
        from torch._inductor.template_heuristics.triton import ROCmConfigHeuristic

        heuristic = ROCmConfigHeuristic()
        assert heuristic.default_num_stages == 1
        assert {c.num_stages for c in heuristic.mm_configs} == {1}
    assert inductor_utils.get_backend_num_stages is before
    assert fixes.describe(knob.change).startswith("Triton software pipelining off")


@pytest.mark.fast
def test_strict_numerics_is_tried_only_where_it_reaches_pointwise_math() -> None:
    """issue 45: Inductor's strict numerics (pytorch PR 195640) is the last knob a
    bisection tries and remembers, compiled instead of eager: where the running torch's
    ``numerics`` has torch 2.15's modes. 2.14's "strict" orders NVIDIA sums only; 2.13 has
    no such key (the running torch of this suite says which)."""
    import types
    from typing import Literal

    import torch._inductor.config as config

    from rocm_autopatch.sentinel.healing import bisect, fixes

    def fake(annotation: object) -> types.ModuleType:
        module = types.ModuleType("fake_inductor_config")
        module._config = {"numerics": types.SimpleNamespace(value_type=annotation)}
        return module

    modes_2_15 = Literal["default", "strict_pointwise", "strict_reduction", "strict"]
    assert bisect._strict({}, "", fake(modes_2_15)) == ""
    assert "NVIDIA CUDA sums only" in bisect._strict({}, "", fake(Literal["default",
                                                                          "strict"]))
    here = bisect._strict({}, "")
    if "numerics" not in config._config:  # torch 2.13: no key
        assert "no strict numerics" in here
    (knob,) = [k for k in bisect.KNOBS if k.change.get("key") == "numerics"]
    assert bisect.KNOBS[-1] is knob and knob.change["value"] == "strict"
    assert fixes.describe(knob.change) == "inductor config numerics='strict'"


@pytest.mark.fast
def test_questions_whose_compile_is_the_repros_own_are_answered_without_a_run(
        tmp_path: Path) -> None:
    """torch's CompilerBisector asks three questions whose compile is step 1's again: the
    inductor stage with nothing off, CUDA graphs off (a graph on the CPU) and
    fallback_random=True (a repro's graph has no random op). They are answered "wrong"
    without a run; every other question runs. The bisector's real state files decide."""
    cb = pytest.importorskip("torch._inductor.compiler_bisector")  # (not in torch 2.4)

    from rocm_autopatch.sentinel.healing import bisect

    saved = cb.CompilerBisector.in_process_cache
    cb.CompilerBisector.in_process_cache = str(tmp_path)
    try:
        def ask(backend: str, subsystem: str = "", state: str = "test_disable",
                on_gpu: bool = False) -> str:
            cb.CompilerBisector.update_bisect_status(backend, subsystem)
            if subsystem:
                system = next(s for s in cb.BACKENDS[backend] if s.name == subsystem)
                cb.CompilerBisector.update_run_state(backend, system, state)
            return bisect._known_wrong(cb.CompilerBisector, on_gpu)

        assert ask("inductor") == "the compile step 1 ran"
        assert ask("inductor", "cudagraphs").startswith("a graph on the CPU")
        assert ask("inductor", "cudagraphs", on_gpu=True) == ""
        assert ask("inductor", "inductor_fallback_random") == "a repro's graph calls no random op"
        for backend in ("eager", "aot_eager", "aot_eager_decomp_partition"):
            assert ask(backend) == ""
        for subsystem in ("lowerings", "post_grad_passes", "inductor_emulate_precision_casts"):
            assert ask("inductor", subsystem) == ""
        # Counting or bisecting applications always runs (each run moves the count).
        assert ask("inductor", "lowerings", "find_max_bounds") == ""
        assert ask("inductor", "lowerings", "bisect") == ""
    finally:
        cb.CompilerBisector.in_process_cache = saved
