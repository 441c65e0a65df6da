"""The configuration engine on the real torch 2.13 config, through the installed .pth."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest
from conftest import Venv, fake_kfd

from rocm_autopatch import probe
from rocm_autopatch.config import profiles

READ_ALL = """
import json, threading
import torch, torch._inductor.config as ic, torch._dynamo.config as dc, rocm_autopatch
mods = {"inductor": ic, "dynamo": dc}
def read(key):
    ns, rest = key.split(".", 1)
    obj = mods[ns]
    for part in rest.split("."):
        obj = getattr(obj, part)
    return obj
def has(key):
    try:
        read(key)
        return True
    except AttributeError:
        return False
config = rocm_autopatch.report().config
keys = [c.key for c in config if has(c.key)]
lacks = {c.key: [c.status, c.reason] for c in config if not has(c.key)}
main = {k: read(k) for k in keys}
other = {}
t = threading.Thread(target=lambda: other.update({k: read(k) for k in keys})); t.start(); t.join()
r = rocm_autopatch.report().to_dict()
print(json.dumps({"main": main, "thread": other, "report": r, "lacks": lacks}))
"""


def _expected(profile: str) -> dict:
    expected = {s.key: s.value for s in profiles.PROFILES[profile]}
    # A cap, never a raise: torch's own min(32, CPUs) is already below 16 on small machines.
    expected["inductor.compile_threads"] = min(16, probe.usable_cpus())
    return expected


@pytest.mark.parametrize("profile", ["safe", "perf"])
def test_every_profile_key_reads_back_in_main_and_new_thread(torch_venv: Venv,
                                                             profile: str) -> None:
    out = torch_venv.json(READ_ALL, env={"ROCM_AUTOPATCH": "force",
                                         "ROCM_AUTOPATCH_PROFILE": profile})
    expected = {k: v for k, v in _expected(profile).items() if k not in out["lacks"]}
    assert set(out["main"]) == set(expected)
    # A key this torch lacks (autotune_cudagraph_benchmarking before 2.14) is skipped, said.
    for key, (status, reason) in out["lacks"].items():
        assert status == "skipped" and "not in this torch" in reason, (key, reason)
    if torch_venv.torch["release"] < (2, 14):
        assert "inductor.autotune_cudagraph_benchmarking" in out["lacks"]
    for key, value in expected.items():
        assert out["main"][key] == value, key
        assert out["thread"][key] == value, key
    report = out["report"]
    assert report["profile"] == profile and report["active"] and report["forced"]
    assert report["platform"] == torch_venv.torch["build"]
    assert report["torch_version"] == torch_venv.torch["version"]
    for entry in report["config"]:  # the record says what torch says
        if entry["key"] in out["lacks"]:
            continue
        assert entry["after"] == out["main"][entry["key"]]
        assert entry["status"] in ("applied", "unchanged")
        assert entry["source"] == "profile"
    statuses = {e["key"]: e["status"] for e in report["config"]}
    assert statuses["inductor.triton.cudagraph_trees"] == "applied"  # torch default True
    assert statuses["inductor.memory_planning"] == "unchanged"  # already off (FINDINGS)


def test_compile_in_a_worker_thread_sees_the_profile(torch_venv: Venv) -> None:
    code = """
import json, threading, torch
from torch._inductor.compile_fx import compile_fx
seen = {}
def spy(gm, example_inputs):   # a backend that reads the config Inductor will compile with
    import torch._inductor.config as ic
    seen.update(max_autotune=ic.max_autotune, backends=ic.max_autotune_gemm_backends,
                cudagraphs=ic.triton.cudagraphs, fusion=ic.max_fusion_size)
    return compile_fx(gm, example_inputs)
result = {}
def work():
    f = torch.compile(lambda x: torch.relu(x) * 2, backend=spy)
    x = torch.randn(16)
    result["close"] = torch.allclose(f(x), torch.relu(x) * 2)
t = threading.Thread(target=work); t.start(); t.join()
print(json.dumps({"seen": seen, **result}))
"""
    out = torch_venv.json(code, env={"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_PROFILE": "perf",
                                     "TORCHINDUCTOR_MAX_AUTOTUNE": "1"})
    assert out == {"seen": {"max_autotune": False, "backends": "ATEN", "cudagraphs": False,
                            "fusion": 128}, "close": True}


PRECEDENCE = """
import json, torch, torch._inductor.config as ic, rocm_autopatch
r = rocm_autopatch.report()
e = next(c for c in r.config if c.key == "inductor.max_autotune")
before_user = ic.max_autotune
ic.max_autotune = USER if USER is not None else ic.max_autotune   # the user's own code
print(json.dumps({"value": before_user, "after_user": ic.max_autotune,
                  "source": e.source if e else None, "warnings": r.warnings}))
ic.max_autotune = before_user  # put back: another program may share the process (FORCED)
"""
LIMIT = """
import json, torch._dynamo.config as dc, rocm_autopatch
before_user = dc.recompile_limit
dc.recompile_limit = 1024              # what SGLang does after import
e = next(c for c in rocm_autopatch.report().config if c.key == "dynamo.recompile_limit")
print(json.dumps({"now": dc.recompile_limit, "alias": dc.cache_size_limit, "wanted": e.wanted}))
dc.recompile_limit = before_user  # put back: another program may share the process (FORCED)
"""
# The programs run under ROCM_AUTOPATCH=force and nothing else, in one process (one
# interpreter importing torch, not three): each in a namespace of its own, what it printed
# its own, an exception its own; each puts back the config it assigned.
FORCED = [PRECEDENCE.replace("USER", "None"), PRECEDENCE.replace("USER", "True"), LIMIT]
SHARED = """
import contextlib, io, json, sys, traceback
found = []
for code in json.loads(sys.argv[1]):
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(code, {"__name__": "__main__"})
        found.append(json.loads(printed.getvalue().splitlines()[-1]))
    except Exception:
        found.append({"error": traceback.format_exc()})
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def forced(torch_venv: Venv) -> Callable[..., dict]:
    """``forced(code, **env)``: what ``code`` printed under ROCM_AUTOPATCH=force and ``env``;
    the programs of ``FORCED`` (with no ``env``) from their one shared process."""
    shared: List[dict] = []

    def get(code: str, **env: str) -> dict:
        if env or code not in FORCED:
            return torch_venv.json(code, env={"ROCM_AUTOPATCH": "force", **env})
        if not shared:
            shared.extend(torch_venv.json(SHARED, json.dumps(FORCED),
                                          env={"ROCM_AUTOPATCH": "force"}))
        out = shared[FORCED.index(code)]
        assert "error" not in out, out["error"][-3000:]
        return out

    return get


@pytest.mark.parametrize("env, user, value, after_user, source", [
    ({}, None, False, False, "profile"),                                   # profile
    ({"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}, None, False, False, "profile"),  # profile > env
    ({"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "INDUCTOR_MAX_AUTOTUNE": "1"}, None, True, True,
     "override"),                                                          # override > profile
    ({"INDUCTOR_MAX_AUTOTUNE": "1"}, False, True, False, "override"),      # user > override
    ({}, True, False, True, "profile"),                                    # user > profile
])
def test_precedence(forced: Callable[..., dict], env, user, value, after_user,
                    source) -> None:
    out = forced(PRECEDENCE.replace("USER", repr(user)), **env)
    assert (out["value"], out["after_user"], out["source"]) == (value, after_user, source)
    hostile = [w for w in out["warnings"] if "TORCHINDUCTOR_MAX_AUTOTUNE=1" in w]
    if env.get("TORCHINDUCTOR_MAX_AUTOTUNE") and source == "profile":
        assert len(hostile) == 1 and "INDUCTOR_MAX_AUTOTUNE=1" in hostile[0]
    else:
        assert hostile == []


def test_hostile_environment_one_warning_per_variable(torch_venv: Venv) -> None:
    hostile = {"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE": "1",
               "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM": "1", "TORCHINDUCTOR_CUDAGRAPHS": "1",
               "TORCHINDUCTOR_MEMORY_PLANNING": "1"}
    code = READ_ALL.replace("print(json.dumps({", "import torch._inductor.config\n"
                            "print(json.dumps({")
    proc = torch_venv.run(code, env={"ROCM_AUTOPATCH": "force", **hostile})
    assert proc.returncode == 0, proc.stderr
    for var in hostile:
        assert proc.stderr.count(f"{var}=1 is set") == 1, var
    import json

    main = json.loads(proc.stdout.splitlines()[-1])["main"]
    assert main["inductor.max_autotune"] is False
    assert main["inductor.max_autotune_pointwise"] is False
    assert main["inductor.max_autotune_gemm"] is False
    assert main["inductor.triton.cudagraphs"] is False
    assert main["inductor.memory_planning"] is False


OVERRIDES = """
import json, torch, torch._inductor.config as ic, rocm_autopatch
r = rocm_autopatch.report()
print(json.dumps({"fusion": ic.max_fusion_size, "coord": ic.coordinate_descent_tuning,
                  "graphs": ic.triton.cudagraphs, "multi": ic.triton.multi_kernel,
                  "freezing": ic.freezing, "group": ic.group_fusion,
                  "config": {c.key: [c.status, c.source, c.reason] for c in r.config},
                  "warnings": r.warnings}))
"""


def test_seed_names_and_generic_overrides(torch_venv: Venv) -> None:
    out = torch_venv.json(OVERRIDES, env={
        "ROCM_AUTOPATCH": "force", "INDUCTOR_MAX_FUSION_SIZE": "96",
        "INDUCTOR_COORD_DESCENT": "yes", "INDUCTOR_TRITON__CUDAGRAPHS": "on",
        "INDUCTOR_TRITON_MULTI_KERNEL": "2", "INDUCTOR_FREEZING": "1",
        "INDUCTOR_GROUP_FUSION": "1"})
    assert out["fusion"] == 96 and out["coord"] is True and out["graphs"] is True
    assert out["multi"] == 2 and out["freezing"] is True
    assert out["config"]["inductor.max_fusion_size"][:2] == ["applied", "override"]
    # group_fusion is a deprecated no-op in 2.13: reported as such, not "applied".
    assert out["group"] is False
    assert out["config"]["inductor.group_fusion"][0] == "skipped"
    assert "no-op" in out["config"]["inductor.group_fusion"][2]
    assert out["warnings"] == []


BAD_INPUT = [  # (variable, value, what its one warning must say is accepted)
    ("INDUCTOR_MAX_FUSION_SIZE", "lots", "an integer"),
    ("INDUCTOR_MAX_AUTOTUNE", "maybe", "a boolean"),
    ("INDUCTOR_TRITON__MULTI_KERNEL", "5", "one of 0, 1, 2, 3"),
    ("INDUCTOR_MAX_AUTOTUN", "1", "INDUCTOR_MAX_AUTOTUNE"),   # unknown key: closest names
    ("ROCM_AUTOPATCH_PROFILE", "fast", "safe, perf"),
    ("ROCM_AUTOPATCH_LOG", "loud", "debug, info, warning, error, off"),
]


def test_bad_input_warns_once_and_keeps_going(torch_venv: Venv) -> None:
    """Every bad value at once, in one process (one per value took 31 CPU s of the suite,
    issue 42): each gets exactly one warning, naming its variable and what is accepted,
    and none stops another or the program."""
    proc = torch_venv.run(OVERRIDES, env={"ROCM_AUTOPATCH": "force",
                                          **{var: raw for var, raw, _ in BAD_INPUT}})
    assert proc.returncode == 0, proc.stderr
    import json

    out = json.loads(proc.stdout.splitlines()[-1])
    ours = [line for line in proc.stderr.splitlines() if line.startswith("rocm-autopatch")]
    assert len(ours) == len(BAD_INPUT), ours
    for var, _raw, accepted in BAD_INPUT:
        (said,) = [line for line in ours if line.split("WARNING: ", 1)[-1].startswith(
            (f"{var}=", f"{var} "))]
        assert accepted in said, said
    assert out["fusion"] == 64 and out["graphs"] is False and out["multi"] == 0
    assert out["config"]["inductor.max_autotune"][0] in ("applied", "unchanged")
    assert len(out["warnings"]) == len(BAD_INPUT)  # the report holds each once too


def test_limit_is_raised_never_lowered(forced: Callable[..., dict]) -> None:
    out = forced(LIMIT)
    assert out == {"now": 1024, "alias": 1024, "wanted": 128}


def test_info_log_prints_one_summary_per_config_module(torch_venv: Venv) -> None:
    proc = torch_venv.run("import torch._inductor.config, torch._dynamo.config",
                          env={"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_LOG": "info"})
    lines = [x for x in proc.stderr.splitlines() if x.startswith("rocm-autopatch: INFO")]
    assert len(lines) == 2 and "inductor config, safe profile" in "".join(lines)
    quiet = torch_venv.run("import torch._inductor.config", env={"ROCM_AUTOPATCH": "force"})
    assert "rocm-autopatch" not in quiet.stderr
    ranked = torch_venv.run("import torch._inductor.config",
                            env={"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_LOG": "info",
                                 "RANK": "3"})
    assert "rocm-autopatch" not in ranked.stderr


THREADS = """
import json, torch, torch._inductor.config as ic, rocm_autopatch
c = next(c for c in rocm_autopatch.report().config if c.key == "inductor.compile_threads")
print(json.dumps({"value": ic.compile_threads, "entry": c.to_dict()}))
"""


QUOTAS = [  # a FAKE cgroup directory's files (a container's CPU quota) -> the CPUs it allows
    ({"cpu.max": "100000 100000"}, 1.0),                                # cgroup v2, 1 CPU
    ({"cpu.max": "max 100000"}, None),                                  # v2, no quota
    ({"cpu/cpu.cfs_quota_us": "50000", "cpu/cpu.cfs_period_us": "100000"}, 0.5),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),  # v1, none
    ({"cpu/cpu.cfs_quota_us": "250000", "cpu/cpu.cfs_period_us": "100000"}, 2.5),
    ({"cpu.max": "9" * 400 + " 100000"}, None),  # absurd: no usable quota, nothing raised
    ({"cpu.max": "1 0"}, None),                   # a zero period
]


def _fake_cgroup(root: Path, files: Dict[str, str]) -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    return str(root)


@pytest.mark.fast
@pytest.mark.parametrize("files, limit", QUOTAS)
def test_usable_cpus_reads_each_kind_of_cgroup_quota(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: Dict[str, str],
        limit: Optional[float]) -> None:
    root = _fake_cgroup(tmp_path, files)
    assert probe.cgroup_cpu_limit(root) == limit
    # 64 CPUs in the affinity mask: the quota, rounded up, is what bounds the count
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)), raising=False)
    assert probe.usable_cpus(root) == (64 if limit is None else math.ceil(limit))


# Through the wheel, a quota and none (a process each: the parse's cases are above, issue 42).
@pytest.mark.parametrize("files, expected", [(QUOTAS[0][0], 1), (QUOTAS[1][0], None)])
def test_compile_threads_capped_by_the_cgroup_quota(torch_venv: Venv, tmp_path, files,
                                                    expected) -> None:
    _fake_cgroup(tmp_path, files)
    out = torch_venv.json(THREADS, env={"ROCM_AUTOPATCH": "force",
                                        "ROCM_AUTOPATCH_CGROUP_ROOT": str(tmp_path)})
    torch_default = out["entry"]["before"]  # decide_compile_threads of the torch under test
    cpus = min(16, probe.usable_cpus(str(tmp_path)))
    assert out["value"] == min(expected or cpus, torch_default)
    assert out["entry"]["after"] == out["value"]
    assert out["entry"]["status"] == ("applied" if out["value"] < torch_default else
                                      "unchanged")
    assert "PR 191493" in out["entry"]["ref"]


def test_an_absurd_quota_stops_no_other_key(torch_venv: Venv, tmp_path) -> None:
    (tmp_path / "cpu.max").write_text("9" * 400 + " 100000\n")
    out = torch_venv.json(READ_ALL, env={"ROCM_AUTOPATCH": "force",
                                         "ROCM_AUTOPATCH_CGROUP_ROOT": str(tmp_path)})
    statuses = {c["key"]: c["status"] for c in out["report"]["config"]
                if c["key"] not in out["lacks"]}
    assert set(statuses) | set(out["lacks"]) == set(_expected("safe"))
    assert out["report"]["errors"] == []
    assert all(s in ("applied", "unchanged") for s in statuses.values()), statuses


def test_compile_threads_set_by_the_user_is_kept(torch_venv: Venv, tmp_path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    out = torch_venv.json(THREADS, env={"ROCM_AUTOPATCH": "force",
                                        "ROCM_AUTOPATCH_CGROUP_ROOT": str(tmp_path),
                                        "TORCHINDUCTOR_COMPILE_THREADS": "2"})
    assert out["value"] == 2
    assert out["entry"]["status"] == "skipped" and "your value is kept" in \
        out["entry"]["reason"]


ARCH = """
import json, torch, torch._inductor.config as ic, rocm_autopatch
c = next(c for c in rocm_autopatch.report().config if c.key == "inductor.coordinate_descent_tuning")
print(json.dumps({"value": ic.coordinate_descent_tuning, "entry": c.to_dict()}))
"""


@pytest.mark.fast
@pytest.mark.parametrize("target, tuned", [(120001, False), (110000, False), (90402, True),
                                           (None, True)])
def test_perf_coordinate_descent_is_decided_by_the_gpu_arch(tmp_path: Path, target, tuned
                                                            ) -> None:
    """gfx1201, gfx1100, gfx942, none: the rule's decision on each (in this process)."""
    from rocm_autopatch.config import applier

    (setting,) = [s for s in profiles.PERF_EXTRA
                  if s.key == "inductor.coordinate_descent_tuning"]
    root = fake_kfd(tmp_path, target or 0)  # a node of gfx target 0 is no GPU
    why = applier._condition_fails(setting, lambda: probe.arch_names(root))
    assert (why == "") is tuned, why
    if not tuned:
        assert "not used on gfx1" in why and "pytorch#193658" in why


# Through the wheel, one arch it is left out on and one it is kept on (a process each, 4
# before: the decision's cases are above, issue 42).
@pytest.mark.parametrize("target, tuned", [(120001, False), (90402, True)])
def test_perf_coordinate_descent_depends_on_the_gpu_arch(torch_venv: Venv, tmp_path,
                                                         target, tuned) -> None:
    """A FAKE KFD topology stands for the GPU (gfx1201, gfx942)."""
    fake_kfd(tmp_path, target)
    out = torch_venv.json(ARCH, env={"ROCM_AUTOPATCH": "force",
                                     "ROCM_AUTOPATCH_PROFILE": "perf",
                                     "ROCM_AUTOPATCH_KFD_TOPOLOGY": str(tmp_path)})
    assert out["value"] is tuned
    if not tuned:
        assert "not used on gfx1" in out["entry"]["reason"]
        assert "pytorch#193658" in out["entry"]["reason"]


@pytest.mark.fast
def test_multi_kernel_warm_start_failure_needs_both_code_paths(tmp_path) -> None:
    """perf leaves multi_kernel out only where torch's multi_kernel.py reads fn.cache_key and
    Triton's jit.py takes _hash_lock (the two halves of the failure); the finders read the
    installed torch, not an import."""
    from rocm_autopatch.config import broken_settings

    torch_side, triton_side, other = (tmp_path / n for n in ("mk.py", "jit.py", "none.py"))
    torch_side.write_text("key = f'{k.fn.cache_key}{k.size_hints!r}'\n")
    triton_side.write_text("with self._hash_lock:\n    pass\n")
    other.write_text("pass\n")

    def check(torch_file, triton_file):
        return broken_settings.multi_kernel_warm_start(lambda _: torch_file,
                                                       lambda _: triton_file)

    assert "FX graph cache" in check(str(torch_side), str(triton_side))
    assert check(str(torch_side), str(other)) == ""
    assert check(str(other), str(triton_side)) == ""
    assert check(str(torch_side), None) == ""  # no Triton installed (a CPU build)
    found = broken_settings._torch_file("torch/_inductor/codegen/multi_kernel.py")
    assert found is not None and found.endswith("multi_kernel.py")


STAND_IN_TRITON = """
import functools, json, sys
from rocm_autopatch.config import broken_settings
# A STAND-IN for a Triton install (none exists on the CPU machine): its jit.py with the
# _hash_lock of triton-lang/triton PR 7974; torch's side is the installed torch's own file.
broken_settings.FAILURES["multi_kernel_warm_start"] = functools.partial(
    broken_settings.multi_kernel_warm_start, triton_file=lambda _: sys.argv[1])
import torch, torch._inductor.config as c, rocm_autopatch
(entry,) = [e for e in rocm_autopatch.report().config if e.key.endswith("multi_kernel")]
print(json.dumps({"value": c.triton.multi_kernel, "entry": entry.to_dict()}))
"""


def test_perf_leaves_multi_kernel_out_where_its_warm_start_fails(torch_venv: Venv,
                                                                 tmp_path) -> None:
    jit = tmp_path / "jit.py"
    jit.write_text("self._hash_lock = threading.RLock()\n")
    out = torch_venv.json(STAND_IN_TRITON, str(jit), env={"ROCM_AUTOPATCH": "force",
                                                          "ROCM_AUTOPATCH_PROFILE": "perf"})
    assert out["value"] == 0, out  # torch's default, not perf's 1
    assert out["entry"]["status"] == "skipped" and "FX graph cache" in out["entry"]["reason"]
    jit.write_text("pass\n")  # a Triton without the lock: perf sets it
    out = torch_venv.json(STAND_IN_TRITON, str(jit), env={"ROCM_AUTOPATCH": "force",
                                                          "ROCM_AUTOPATCH_PROFILE": "perf"})
    assert out["value"] == 1 and out["entry"]["status"] == "applied", out
