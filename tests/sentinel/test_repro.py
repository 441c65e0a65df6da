"""A graph the sentinel finds wrong gets a repro directory (issue 26, first part), through
the installed wheel: its ``repro.py`` alone reproduces the failure in an interpreter that
does not have rocm-autopatch, and says so by its exit status; a healthy program writes
nothing; a directory that cannot be written costs the program nothing. The miscompile is
torch's own fault injection (``cpp.inject_relu_bug_TESTING_ONLY``: relu(x) computed as
x + 1), an Inductor setting that torch's repro carries, as a real bug's conditions would
be carried by the configuration and inputs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import Venv, clean_env, new_venv

JOB = r'''
import json, torch
import torch._inductor.config as c
if BUGGY:
    c.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"
m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
f = torch.compile(m)
with torch.no_grad():
    y = f(torch.randn(32, 64))
import rocm_autopatch
graphs = [g for g in rocm_autopatch.report().verify["graphs"] if g["status"] != "pending"]
print(json.dumps([{"status": g["status"], "repro": g.get("repro")} for g in graphs]))
'''


def _job(venv: Venv, buggy: bool, **env: str) -> tuple:
    proc = venv.run(JOB.replace("BUGGY", str(buggy)),
                    env={"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_VERIFY": "check", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_the_repro_directory_alone_reproduces_without_the_package(
        torch_venv: Venv, torch_links: Path, tmp_path: Path) -> None:
    root = tmp_path / "repros"
    (graph,), err = _job(torch_venv, True, ROCM_AUTOPATCH_VERIFY_DIR=str(root))
    assert graph["status"] == "failed"
    folder = Path(graph["repro"])
    assert folder.parent == root and f"/{folder.name} (attach it to an issue" in err
    assert sorted(p.name for p in folder.iterdir()) == ["env.json", "inputs", "repro.py"]
    env = json.loads((folder / "env.json").read_text())
    assert env["torch"] and env["verdict"]["status"] == "failed" and env["config_applied"]
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) < 2**20
    # A Python with torch and nothing of rocm-autopatch.
    bare = new_venv(tmp_path / "bare", torch_links)
    assert not bare.has("rocm_autopatch")
    run = subprocess.run([bare.python, str(folder / "repro.py")], capture_output=True,
                         text=True, timeout=600, cwd=str(tmp_path), env=clean_env())
    assert run.returncode == 1 and "REPRODUCED" in run.stdout, run.stdout + run.stderr[-2000:]
    # Without the fault (the setting torch's repro carries), it says so and exits 0.
    fixed = folder / "repro_fixed.py"
    fixed.write_text((folder / "repro.py").read_text().replace(
        "inject_relu_bug_TESTING_ONLY = 'accuracy'", "inject_relu_bug_TESTING_ONLY = None"))
    run = subprocess.run([bare.python, str(fixed)], capture_output=True, text=True,
                         timeout=600, cwd=str(tmp_path), env=clean_env())
    assert run.returncode == 0 and "not reproduced" in run.stdout, run.stderr[-2000:]


def test_a_healthy_program_writes_nothing(torch_venv: Venv, tmp_path: Path) -> None:
    root = tmp_path / "repros"
    graphs, err = _job(torch_venv, False, ROCM_AUTOPATCH_VERIFY_DIR=str(root))
    assert {g["status"] for g in graphs} == {"passed"} and not root.exists()


def test_a_repro_that_cannot_be_written_costs_nothing(torch_venv: Venv,
                                                      tmp_path: Path) -> None:
    (graph,), err = _job(torch_venv, True,
                         ROCM_AUTOPATCH_VERIFY_DIR="/proc/rocm-autopatch-cannot-be-here")
    assert graph["status"] == "failed" and graph["repro"] == ""
    assert "ROCM_AUTOPATCH_VERIFY_DIR: the repro of a wrong graph could not be written" in err
    assert "TORCHDYNAMO_REPRO_AFTER=aot" in err  # the warning falls back to torch's minifier


def test_bad_values_of_the_new_variables_warn(torch_venv: Venv) -> None:
    graphs, err = _job(torch_venv, False, ROCM_AUTOPATCH_VERIFY_BUDGET="lots")
    assert err.count("ROCM_AUTOPATCH_VERIFY_BUDGET='lots' is not understood") == 1
    assert "a share from 0 to 1" in err and {g["status"] for g in graphs} == {"passed"}
