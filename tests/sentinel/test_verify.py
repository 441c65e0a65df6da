"""The numerics sentinel (ROCM_AUTOPATCH_VERIFY) on real CPU compiles of the installed wheel.

The miscompile is torch's own fault injection in Inductor's C++ code generation
(``cpp.inject_relu_bug_TESTING_ONLY = "accuracy"``: relu(x) computed as x + 1), driven by
scripts/verify_repro.py; what the sentinel reports is held to torch's own logs of the same
run (``TORCH_LOGS``).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Dict, Tuple

import pytest
from conftest import ROOT, Venv, clean_env

SCRIPT = (ROOT / "scripts" / "verify_repro.py").read_text()
CALL_LINE = SCRIPT.splitlines().index("        got = [compiled(x) for x in xs]") + 1


def run(venv: Venv, tmp_path: Path, scenario: str, **env: str
        ) -> Tuple[dict, subprocess.CompletedProcess]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([venv.python, str(script), scenario], capture_output=True, text=True,
                          env=clean_env(**{"ROCM_AUTOPATCH": "force", **env}), cwd=str(tmp_path),
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


def warnings(proc: subprocess.CompletedProcess) -> list:
    """The sentinel's warnings: a first line naming the graph, then its indented lines."""
    found: list = []
    for line in proc.stderr.splitlines():
        if "numerics:" in line:
            found.append(line)
        elif found and line.startswith("  ") and found[-1] is not None:
            found[-1] += "\n" + line
        elif found:
            found.append(None)  # the block ended
    return [w for w in found if w is not None]


def graphs(data: dict) -> Dict[str, dict]:
    return {g["graph"]: g for g in data["verify"]["graphs"]}


# Healthy scenarios of one mode in one process (one interpreter importing torch, not one
# per scenario): each case from a fresh Dynamo (its compile ids going on from the last
# case's, unique in the process as the sentinel names graphs by them), its graphs those
# the report gained in the case, its stderr its own, an exception its own.
BATCH = """
import json, os, sys, tempfile, traceback
import torch
from torch._dynamo import convert_frame
import job  # scripts/verify_repro.py
import rocm_autopatch

for name in sys.argv[1:]:
    next_id = convert_frame.FRAME_COUNTER
    torch._dynamo.reset()
    convert_frame.FRAME_COUNTER = next_id
    done = len(rocm_autopatch.report().verify.get("graphs", []))
    sys.stderr.flush()
    stderr = os.dup(2)
    with tempfile.TemporaryFile("w+") as said:
        os.dup2(said.fileno(), 2)
        try:
            case = {"out": job.scenario(name)}
        except Exception:
            case = {"error": traceback.format_exc()}
        finally:
            sys.stderr.flush()
            os.dup2(stderr, 2)
        said.seek(0)
        graphs = rocm_autopatch.report().verify.get("graphs", [])[done:]
        case.update(verify={"graphs": graphs}, stderr=said.read())
    print("@@ " + json.dumps({"case": name, **case}), flush=True)
"""
BATCHED = {"check": ["dropout", "batchnorm", "kvcache", "held_batchnorm"],
           "fallback": ["batchnorm", "kvcache", "held_batchnorm", "no_fp64"]}


@pytest.fixture(scope="module")
def batched(torch_venv: Venv, tmp_path_factory: pytest.TempPathFactory
            ) -> Dict[str, Tuple[Dict[str, dict], subprocess.CompletedProcess]]:
    """{mode: ({scenario: what it printed, with its stderr}, the process)}: the healthy
    scenarios of ``BATCHED``, one process per ``ROCM_AUTOPATCH_VERIFY`` mode."""
    found = {}
    for how, names in BATCHED.items():
        folder = tmp_path_factory.mktemp(f"verify-{how}")
        (folder / "job.py").write_text(SCRIPT)
        (folder / "batch.py").write_text(BATCH)
        proc = subprocess.run([torch_venv.python, "batch.py", *names], capture_output=True,
                              text=True, cwd=str(folder), timeout=900, env=clean_env(
                                  ROCM_AUTOPATCH="force", ROCM_AUTOPATCH_VERIFY=how))
        cases = [json.loads(line[3:]) for line in proc.stdout.splitlines()
                 if line.startswith("@@ ")]
        found[how] = ({case.pop("case"): case for case in cases}, proc)
    return found


def scenario(batched: dict, how: str, name: str) -> Tuple[dict, str]:
    """One batched scenario's result and its stderr (the process's own outside every case
    after it); fails with its error, or the process's, where it has no result."""
    cases, proc = batched[how]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert name in cases, proc.stderr[-4000:]
    case = cases[name]
    assert "error" not in case, case["error"][-4000:]
    return case, case["stderr"] + proc.stderr


def test_a_miscompile_is_caught_named_as_torch_names_it_and_flagged(torch_venv: Venv,
                                                                     tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    data, proc = run(torch_venv, tmp_path, "bug", ROCM_AUTOPATCH_VERIFY="check",
                     ROCM_AUTOPATCH_REPORT=str(report), TORCH_LOGS="+dynamo,graph_code")
    # check: the program's results are the compiled ones, wrong, unchanged.
    assert all(d > 0.1 for d in data["out"]["diffs"]), data["out"]
    (g,) = data["verify"]["graphs"]
    assert g["status"] == "failed" and g["calls_checked"] == 1
    m = g["mismatch"]
    assert m["what"] == "output" and m["compiled_error"] > 0.1 > 1e-3 > m["eager_error"]
    # torch's criterion: the compiled error against float64 far above eager's.
    assert m["compiled_rmse"] > 100 * m["eager_rmse"] and "RMSE" in m["detail"]
    assert data["verify"]["totals"] == {"pending": 0, "passed": 0, "failed": 1,
                                        "fell back": 0, "skipped": 0}
    # the sentinel counts the captures begun through the real graph classes (2.13 has two)
    assert data["captures_counted"] and all(data["captures_counted"])
    # Named as torch names it in its own log of this run: the compile id of the traced
    # graph, and the innermost user frame of its "start compiling" stack.
    logged = set(re.findall(r"\] \[(\d+/\d+)\] \[__graph_code\] TRACED GRAPH", proc.stderr))
    assert logged == {g["graph"]} == {"0/0"}
    stack = proc.stderr.split("[0/0] torchdynamo start compiling")[1].split("Step 1")[0]
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', stack)
    file, line, name = [f for f in frames if "/site-packages/torch/" not in f[0]][-1]
    assert g["where"] == f"{name} ({file}:{line})"
    assert f"({tmp_path / 'job.py'}:{CALL_LINE})" in g["where"]
    (warning,) = warnings(proc)
    # The warning says the same place with the path short: the script is in the program's
    # working directory.
    assert f"numerics: graph 0/0 of {name} (job.py:{line}) computes wrong numbers" in warning
    assert f"largest error against float64 {m['compiled_error']:.3g}" in warning
    assert "compiled ones, unchanged" in warning and "ROCM_AUTOPATCH_VERIFY=fallback" in warning
    # The compile report carries it, and the job view makes it a red flag (exit 1).
    assert json.loads(report.read_text())["verify"]["graphs"][0]["status"] == "failed"
    view = subprocess.run([str(torch_venv.path / "bin" / "rocm-autopatch"), "doctor",
                           "--report", str(report)], capture_output=True, text=True,
                          env=clean_env(), timeout=300)
    assert view.returncode == 1, view.stdout + view.stderr
    assert "computes wrong numbers" in view.stdout and "1 failed" in view.stdout


def test_fallback_gives_eagers_numbers_for_the_rest_of_the_run(torch_venv: Venv,
                                                               tmp_path: Path) -> None:
    data, proc = run(torch_venv, tmp_path, "bug", ROCM_AUTOPATCH_VERIFY="fallback")
    assert data["out"]["diffs"] == [0.0, 0.0, 0.0]  # the checked call and the two after
    (g,) = data["verify"]["graphs"]
    assert g["status"] == "fell back" and g["calls_checked"] == 1
    (warning,) = warnings(proc)
    assert "results: eager's from this call on, for this graph only" in warning


def test_healthy_graphs_pass_with_no_false_alarm_in_fp32_and_bf16(torch_venv: Venv,
                                                                  tmp_path: Path) -> None:
    data, proc = run(torch_venv, tmp_path, "healthy", ROCM_AUTOPATCH_VERIFY="check",
                     ROCM_AUTOPATCH_VERIFY_CALLS="2", TORCH_LOGS="graph_code")
    assert data["out"]["fp32"] == [0.0] * 3 and max(data["out"]["bf16"]) < 0.05
    found = graphs(data)
    logged = set(re.findall(r"\] \[(\d+/\d+)\] \[__graph_code\] TRACED GRAPH", proc.stderr))
    assert set(found) == logged and len(found) == 2  # fp32, then the bf16 recompile
    for g in found.values():
        assert g["status"] == "passed" and g["calls_checked"] == 2, g
        assert g["backward"].startswith("not applicable: gradients are off")
    assert warnings(proc) == []


def test_random_graph_is_skipped_and_the_programs_results_are_unchanged(
        torch_venv: Venv, tmp_path: Path, batched: dict) -> None:
    data, _ = scenario(batched, "check", "dropout")
    plain, _ = run(torch_venv, tmp_path, "dropout", ROCM_AUTOPATCH="0")
    assert data["out"] == plain["out"]  # same dropout mask, same random stream after
    (g,) = data["verify"]["graphs"]
    assert g["status"] == "skipped" and "random ops (bernoulli_)" in g["reason"]
    assert g["calls_checked"] == 0


@pytest.mark.parametrize("how", ["check", "fallback"])
def test_written_buffers_advance_exactly_once(batched: dict, how: str) -> None:
    bn, _ = scenario(batched, how, "batchnorm")
    out = bn["out"]
    assert out["num_batches_tracked"] == [3, 3]  # 3 steps, not 6
    assert out["running_mean"] < 1e-6 and out["running_var"] < 1e-6
    assert out["losses"]["compiled"] == pytest.approx(out["losses"]["eager"], rel=1e-6)
    (g,) = bn["verify"]["graphs"]
    assert g["status"] == "passed"
    assert re.fullmatch(r"passed \(\d+ gradients\)", g["backward"]), g["backward"]
    kv, _ = scenario(batched, how, "kvcache")
    assert kv["out"]["cache"] == 0.0 and kv["out"]["rows_written"] == 6
    assert max(kv["out"]["outs"]) < 1e-5
    assert [g["status"] for g in kv["verify"]["graphs"]] == ["passed"]


@pytest.mark.parametrize("how", ["check", "fallback"])
def test_buffers_the_graph_holds_itself_advance_exactly_once(torch_venv: Venv,
                                                             tmp_path: Path, batched: dict,
                                                             how: str) -> None:
    # Dynamo's graphs on torch 2.4 hold the module's parameters and buffers as attributes,
    # not inputs (the check advanced batch norm's statistics twice there: 6 batches tracked
    # for 3, found by scripts/compat.sh). The same graph reaches compile_fx here through
    # torch._inductor.compile on a symbolically traced model.
    data, _ = scenario(batched, how, "held_batchnorm")
    out = data["out"]
    assert out["num_batches_tracked"] == [3, 3]
    assert out["running_mean"] < 1e-6 and out["running_var"] < 1e-6
    assert out["losses"]["compiled"] == pytest.approx(out["losses"]["eager"], rel=1e-6)
    (g,) = data["verify"]["graphs"]
    assert g["status"] == "passed"
    assert g["backward"].startswith("not checked: the graph holds its module's parameters")
    # With the miscompile: eager's training, the state advanced once, under fallback.
    bug, _ = run(torch_venv, tmp_path, "held_batchnorm_bug", ROCM_AUTOPATCH_VERIFY=how)
    (g,) = bug["verify"]["graphs"]
    assert bug["out"]["num_batches_tracked"] == [3, 3]
    if how == "fallback":
        assert g["status"] == "fell back"
        assert bug["out"]["losses"]["compiled"] == bug["out"]["losses"]["eager"]
        assert bug["out"]["running_mean"] == 0.0 and bug["out"]["weights"] == 0.0
    else:
        assert g["status"] == "failed"
        assert bug["out"]["losses"]["compiled"] != bug["out"]["losses"]["eager"]


def test_training_with_a_miscompile_falls_back_to_eagers_losses(torch_venv: Venv,
                                                                tmp_path: Path) -> None:
    data, _ = run(torch_venv, tmp_path, "train_bug", ROCM_AUTOPATCH_VERIFY="fallback")
    out = data["out"]
    # Gradients flow through the eager result to the real parameters: identical training.
    assert out["losses"]["compiled"] == out["losses"]["eager"] and out["weights"] == 0.0
    (g,) = data["verify"]["graphs"]
    assert g["status"] == "fell back"
    assert g["backward"] == "not checked: the forward pass already differs"
    checked, _ = run(torch_venv, tmp_path, "train_bug", ROCM_AUTOPATCH_VERIFY="check")
    assert checked["out"]["losses"]["compiled"] != checked["out"]["losses"]["eager"]


def test_a_graph_without_a_float64_reference_is_skipped_and_the_program_goes_on(
        batched: dict) -> None:
    """A custom op without a float64 kernel: not run again at all since the sentinel stopped
    re-running custom ops (they may have side effects); the program goes on either way."""
    data, stderr = scenario(batched, "fallback", "no_fp64")
    assert data["out"]["diff"] < 1e-5  # the compiled result, returned as is
    (g,) = data["verify"]["graphs"]
    assert g["status"] == "skipped" and "verify_repro::scale" in g["reason"]
    assert "side effects" in g["reason"] and "Traceback" not in stderr


# Unset and "0" through the wheel; every word of off is read in test_settings (issue 42).
@pytest.mark.parametrize("value", [None, "0"])
def test_off_loads_nothing_and_wraps_nothing(torch_venv: Venv, tmp_path: Path,
                                             value: str) -> None:
    env = {} if value is None else {"ROCM_AUTOPATCH_VERIFY": value}
    data, proc = run(torch_venv, tmp_path, "healthy", **env)
    assert data["loaded"] == [] and data["compile_fx_wrapped"] is False
    assert data["verify"] == {} and warnings(proc) == []


def test_bad_values_warn_once_and_name_what_is_accepted(torch_venv: Venv,
                                                        tmp_path: Path) -> None:
    """A misspelt mode leaves the sentinel off (its default), and says so once."""
    data, proc = run(torch_venv, tmp_path, "healthy", ROCM_AUTOPATCH_VERIFY="maybe")
    assert data["verify"] == {} and data["compile_fx_wrapped"] is False
    (said,) = [line for line in proc.stderr.splitlines() if "not understood" in line]
    assert "ROCM_AUTOPATCH_VERIFY='maybe'" in said and "fallback" in said
    assert "Using off" in said
    data, proc = run(torch_venv, tmp_path, "healthy", ROCM_AUTOPATCH_VERIFY="check",
                     ROCM_AUTOPATCH_VERIFY_CALLS="-2")
    assert data["verify"]["mode"] == "check" and data["verify"]["calls"] == 1
    (said,) = [line for line in proc.stderr.splitlines() if "not understood" in line]
    assert "ROCM_AUTOPATCH_VERIFY_CALLS='-2'" in said and ">= 1" in said


@pytest.mark.heavy(65)
def test_real_models_raise_no_false_alarm(torch_venv: Venv, tmp_path: Path) -> None:
    """transformers' GPT-2, Llama and ViT at small sizes, fp32 and bf16: all compared."""
    torch_venv.needs("transformers")
    data, proc = run(torch_venv, tmp_path, "models", ROCM_AUTOPATCH_VERIFY="check")
    assert len(data["out"]) == 6
    totals = data["verify"]["totals"]
    assert totals == {"pending": 0, "passed": 6, "failed": 0, "fell back": 0,
                      "skipped": 0}, data["verify"]["graphs"]
    assert warnings(proc) == []


@pytest.mark.fast
def test_nonfinite_values_the_compiled_graph_introduces_are_flagged() -> None:
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel.judging import judge

    ref = torch.ones(4, 4)
    res = ref.clone()
    res[0, 0] = float("nan")
    (bad,) = judge.compare([ref], [res], [ref.double()], judge.TOL_FORWARD).bad
    assert bad.nonfinite == 1
    assert judge.compare([ref], [ref.clone()], [ref.double()], judge.TOL_FORWARD).bad == []
    # NaN in both (eager's own) is not the compiled graph's doing.
    both = ref.clone()
    both[1, 1] = float("nan")
    assert judge.compare([both], [both.clone()], [both.double()], judge.TOL_FORWARD).bad == []


DECODE = """
import torch._inductor.config as config
config.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"  # relu(x) computed as x + 1
import json, torch, rocm_autopatch
from transformers import OPTConfig, OPTForCausalLM
torch.manual_seed(0)
cfg = OPTConfig(vocab_size=256, hidden_size=128, ffn_dim=512, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=128)
model = OPTForCausalLM(cfg).eval()
ids = torch.randint(4, 256, (1, 8))
forward = torch.compile(model.forward)
with torch.no_grad():
    for _ in range(4):
        ids = torch.cat([ids, forward(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
print(json.dumps(rocm_autopatch.report().verify))
"""


def test_one_bug_in_a_decode_gets_one_short_warning_and_one_repro(torch_venv: Venv,
                                                                  tmp_path: Path) -> None:
    """issue 44: an injected miscompile in a four-step decode printed 14 lines, some of 400
    characters, two blocks for two shapes of one graph with a fingerprint each, and three
    sizes for one error. Now: the shapes share a fingerprint (one repro directory), one
    block of at most six lines of at most 120 characters names the user's line (transformers'
    forward, called from the script), and the figure it gives is the record's and the
    repro's."""
    torch_venv.needs("transformers")
    (tmp_path / "decode.py").write_text(DECODE)
    repros = tmp_path / "repros"
    proc = subprocess.run([torch_venv.python, "decode.py"], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=900, env=clean_env(
                              ROCM_AUTOPATCH="force", ROCM_AUTOPATCH_VERIFY="check",
                              ROCM_AUTOPATCH_VERIFY_DIR=str(repros)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    verify = json.loads(proc.stdout.strip().splitlines()[-1])
    wrong = [g for g in verify["graphs"] if g["status"] == "failed"]
    assert len(wrong) >= 2 and len({g["graph"] for g in wrong}) == len(wrong)  # shapes
    assert len({g["repro"] for g in wrong}) == 1 and len(list(repros.iterdir())) == 1
    (block,) = warnings(proc)
    lines = block.splitlines()
    assert len(lines) <= 6 and max(map(len, lines)) <= 120, block
    assert lines[0].endswith("computes wrong numbers") and "decode.py:" in lines[0]
    assert "into transformers' " in lines[0]
    first = wrong[0]["mismatch"]
    figure = f"largest error against float64 {first['compiled_error']:.3g}"
    assert figure in block
    said = [line for line in proc.stderr.splitlines() if line.startswith("rocm-autopatch:")]
    assert len(said) == 3, proc.stderr  # what changed, the warning's first line, the verdict
    # The repro (the first shape's, as the warning named it) prints the same figure for the
    # same output, on the inputs it saved.
    (folder,) = repros.iterdir()
    again = subprocess.run([torch_venv.python, "repro.py"], capture_output=True, text=True,
                           cwd=str(folder), timeout=900, env=clean_env())
    assert again.returncode == 1, again.stdout + again.stderr[-3000:]
    assert "REPRODUCED" in again.stdout and "largest error against float64" in again.stdout
    assert f"output {first['index']}: {figure}, eager's " in again.stdout, again.stdout
