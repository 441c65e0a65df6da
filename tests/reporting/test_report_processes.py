"""The compile report's odd processes and inputs, through the installed wheel (issue 23):
a parent that imports torch after forking, two shell-started processes with one path,
``RANK`` values that are not ranks, a failed compile in the job view, the writer against
the declared schema, every guard failure of a recompile against ``TORCH_LOGS=recompiles``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Venv, clean_env, doctor, flat

FORCE = {"ROCM_AUTOPATCH": "force"}


def ours(stderr: str) -> list:
    return [ln for ln in stderr.splitlines() if ln.startswith("rocm-autopatch")]


def _report_job(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\n" + body)
    return script


# Dynamo's eager backend: a real frame compile (the report counts it), without Inductor's
# seconds of C++ compiling.
COMPILE = ("import torch\n"
           "f = torch.compile(lambda x: torch.sin(x) + 1, backend='eager')\n"
           "f(torch.randn(4))\n")


if sys.platform != "linux":  # /dev/full, fork and /proc are Linux's
    pytestmark = pytest.mark.skip("Linux only")


def test_a_parent_that_imports_torch_after_forking_keeps_its_childs_report(
        torch_venv: Venv, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    script = _report_job(tmp_path, f"""
pid = os.fork()
if pid == 0:
    exec({COMPILE!r})
    sys.exit(0)
os.waitpid(pid, 0)
exec({COMPILE!r})
print(pid)
""")
    proc = subprocess.run([torch_venv.python, str(script)], capture_output=True, text=True,
                          env=clean_env(**FORCE, ROCM_AUTOPATCH_REPORT=str(path)), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    child = int(proc.stdout.split()[-1])
    written = {json.loads(p.read_text())["process"]["pid"] for p in tmp_path.glob("r*.json")}
    assert len(written) == 2 and child in written
    (said,) = [ln for ln in ours(proc.stderr) if "both are kept" in ln]
    assert f"pid {child}" in said and str(path) in said


def test_two_processes_a_shell_starts_with_one_path_both_keep_their_report(
        torch_venv: Venv, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    script = _report_job(tmp_path, COMPILE + "time.sleep(float(sys.argv[1]))\n")
    env = clean_env(**FORCE, ROCM_AUTOPATCH_REPORT=str(path))
    procs = [subprocess.Popen([torch_venv.python, str(script), delay], env=env,
                              stderr=subprocess.PIPE, text=True) for delay in ("0", "3")]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    pids = {json.loads(p.read_text())["process"]["pid"] for p in tmp_path.glob("r*.json")}
    assert pids == {p.pid for p in procs}
    said = [ln for err in errs for ln in ours(err) if "both are kept" in ln]
    assert len(said) == 1 and all(f"pid {p.pid}" in said[0] for p in procs)


# Two of the bad ranks through the wheel (a compile and a doctor each); the parse of every
# one of them, "a/b" and 300 digits too, is test_settings' (issue 42).
@pytest.mark.parametrize("value", ["²", "../escape"])
def test_a_rank_that_is_not_a_number_names_the_variable_and_keeps_the_report(
        torch_venv: Venv, tmp_path: Path, value: str) -> None:
    out = tmp_path / "reports"
    script = _report_job(tmp_path, COMPILE)
    proc = subprocess.run([torch_venv.python, str(script)], capture_output=True, text=True,
                          env=clean_env(**FORCE, RANK=value,
                                        ROCM_AUTOPATCH_REPORT=f"{out}/r-{{rank}}.json"),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (written,) = out.iterdir()  # nothing outside the template's directory, nothing deeper
    pid = json.loads(written.read_text())["process"]["pid"]
    assert written.name == f"r-{pid}.json" and not (tmp_path / "escape").exists()
    (said,) = [ln for ln in ours(proc.stderr) if "RANK=" in ln]
    assert f"RANK={value!r} is not understood" in said and "non-negative integer" in said
    view = doctor(torch_venv, "--report", str(written))
    assert view.returncode == 0 and "Traceback" not in view.stderr, view.stderr


def test_the_job_view_flags_a_compile_that_failed(torch_venv: Venv, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    script = _report_job(tmp_path, """
import torch
def bad(gm, example_inputs):
    raise RuntimeError("this backend always fails")
try:
    torch.compile(lambda x: x.sin(), backend=bad)(torch.ones(2))
except Exception:
    pass
torch.compile(lambda x: x.cos(), backend="eager")(torch.ones(2))
""")
    proc = subprocess.run([torch_venv.python, str(script)], capture_output=True, text=True,
                          env=clean_env(**FORCE, ROCM_AUTOPATCH_REPORT=str(path)), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(path.read_text())["compile"]["failed"]
    view = doctor(torch_venv, "--report", str(path))
    assert view.returncode == 1, view.stdout
    assert "failed to compile" in view.stdout and "this backend always fails" in flat(view.stdout)
    assert "\nhealthy" not in view.stdout


def test_the_writer_writes_every_field_the_schema_declares(torch_venv: Venv,
                                                            tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    script = _report_job(tmp_path, COMPILE.replace("backend='eager'", "dynamic=True") +
                         "f(torch.randn(8))\n")  # an Inductor graph: the sentinel's fields
    proc = subprocess.run([torch_venv.python, str(script)], capture_output=True, text=True,
                          env=clean_env(**FORCE, ROCM_AUTOPATCH_REPORT=str(path),
                                        ROCM_AUTOPATCH_VERIFY="check"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code = ("import json, sys; from rocm_autopatch.reporting import schema as s; "
            "from rocm_autopatch.sentinel import report_part as v; "
            "d = json.load(open(sys.argv[1])); "
            "print(json.dumps({'schema': d['schema'], "
            "'missing': s.missing(d) + [('verify.graphs', k) for k in v.missing(d['verify'])], "
            "'extra': sorted(set(d['compile']) - set(s.COMPILE)), "
            "'graphs': len(d['verify']['graphs'])}))")
    found = torch_venv.run(code, str(path))
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {"schema": 4, "missing": [], "extra": [], "graphs": 1}


def test_a_recompile_keeps_every_guard_failure_torch_logs(torch_venv: Venv,
                                                           tmp_path: Path) -> None:
    """The third dtype fails the guards of both earlier entries: TORCH_LOGS=recompiles lists
    both; torch's CompilationMetrics keep only the first."""
    path = tmp_path / "r.json"
    script = _report_job(tmp_path, """
import torch
f = torch.compile(lambda x: x * 2, backend="eager")
for dtype in (torch.float32, torch.float64, torch.float16):
    f(torch.ones(3, dtype=dtype))
""")
    proc = subprocess.run([torch_venv.python, str(script)], capture_output=True, text=True,
                          env=clean_env(**FORCE, ROCM_AUTOPATCH_REPORT=str(path),
                                        TORCH_LOGS="recompiles"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = re.findall(r"\[__recompiles\]\s+- (\d+/\d+: .+)$", proc.stderr, re.MULTILINE)
    assert len(logged) == 3  # 1 for the second call, 2 for the third
    top = json.loads(path.read_text())["compile"]["recompiles"]["top"]
    reported = [line.strip() for r in top for line in r["reason"].splitlines()]
    assert sorted(reported) == sorted(logged)

