"""Hostile input and odd processes, through the installed wheel in real subprocesses: each
test reproduces a defect found by trying the package as a careful or hostile user would
(issue 23), and failed before its fix."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import Venv, clean_env

FORCE = {"ROCM_AUTOPATCH": "force"}


def flat(text: str) -> str:
    """Doctor text with its 80-column wrapping undone (where it wraps depends on how deep
    the temporary directory is)."""
    return " ".join(text.split())


def ours(stderr: str) -> list:
    return [ln for ln in stderr.splitlines() if ln.startswith("rocm-autopatch")]


def doctor(venv_: Venv, *args: str, env: dict = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv_.path / "bin" / "rocm-autopatch"), "doctor", *args],
                          capture_output=True, text=True, env=clean_env(**(env or {})),
                          timeout=300)


def test_torch_imported_through_a_lazy_loader_is_guarded(torch_venv: Venv) -> None:
    """importlib.util.LazyLoader runs torch's body at its first attribute access: the hooks
    saw a module that looked imported and had neither torch.version nor torch.compile."""
    code = """
import importlib.util, json, sys
spec = importlib.util.find_spec("torch")
spec.loader = importlib.util.LazyLoader(spec.loader)
torch = importlib.util.module_from_spec(spec)
sys.modules["torch"] = torch
spec.loader.exec_module(torch)
f = torch.compile(lambda x: x + 1, mode="reduce-overhead")
ok = bool((f(torch.ones(2)) == 2).all())
import rocm_autopatch
r = rocm_autopatch.report()
print(json.dumps({"active": r.active, "ok": ok,
                  "guarded": hasattr(torch.compile, "__rocm_autopatch__"),
                  "rewrites": [w.after for w in r.compile_rewrites]}))
"""
    out = torch_venv.json(code, env=FORCE)
    assert out == {"active": True, "ok": True, "guarded": True,
                   "rewrites": [{"mode": "default"}]}


def test_a_full_stderr_changes_no_exit_status(torch_venv: Venv) -> None:
    """``2>/dev/full`` with a warning due: the text stayed in stderr's buffer and the final
    flush at exit failed (exit 120). PYTHONUNBUFFERED, which the tests set, hid it."""
    env = {k: v for k, v in clean_env(**FORCE, ROCM_AUTOPATCH_PROFILE="junk").items()
           if k != "PYTHONUNBUFFERED"}
    for code in ("import torch, torch._inductor.config",
                 "import torch; torch.compile(lambda x: x, mode='max-autotune')"):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([torch_venv.python, "-c", code], stderr=full,
                                  env=env, timeout=300, cwd=str(torch_venv.path))
        assert proc.returncode == 0, code


def _report_job(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\n" + body)
    return script


# Dynamo's eager backend: a real frame compile (the report counts it), without Inductor's
# seconds of C++ compiling.
COMPILE = ("import torch\n"
           "f = torch.compile(lambda x: torch.sin(x) + 1, backend='eager')\n"
           "f(torch.randn(4))\n")


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


@pytest.mark.parametrize("value", ["²", "../escape", "a/b", "7" * 300])
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


def test_selftest_refuses_a_directory_before_running_and_creates_a_missing_one(
        torch_venv: Venv, tmp_path: Path) -> None:
    selftest = str(torch_venv.path / "bin" / "rocm-autopatch")
    proc = subprocess.run([selftest, "selftest", "--json", str(tmp_path)], capture_output=True,
                          text=True, env=clean_env(), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is a directory" in proc.stderr and "each check" not in proc.stdout  # none ran
    target = tmp_path / "new" / "deeper" / "st.json"
    proc = subprocess.run([selftest, "selftest", "--only", "capture", "--json", str(target)],
                          capture_output=True, text=True, env=clean_env(), timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(target.read_text())["checks"].keys() == {"capture"}


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
            "d = json.load(open(sys.argv[1])); "
            "print(json.dumps({'schema': d['schema'], 'missing': s.missing(d), "
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


def test_the_doctor_audits_the_users_environment_only(torch_venv: Venv) -> None:
    proc = doctor(torch_venv, "--json", env={**FORCE, "VIRTUAL_ENV_PROMPT": "(venv)",
                                             "OMP_NUM_THREADS": "4"})
    names = [row["name"] for row in json.loads(proc.stdout)["environment"]]
    assert "VIRTUAL_ENV_PROMPT" not in names and "OMP_NUM_THREADS" in names
    assert "TORCHINDUCTOR_CACHE_DIR" not in names  # torch sets it in the doctor's process
    proc = doctor(torch_venv, "--json", env={**FORCE, "TORCHINDUCTOR_CACHE_DIR": "/x"})
    rows = {row["name"]: row for row in json.loads(proc.stdout)["environment"]}
    assert rows["TORCHINDUCTOR_CACHE_DIR"]["value"] == "/x"
    assert rows["ROCM_AUTOPATCH"]["note"]  # ours say what they mean


def test_the_doctor_without_torch_says_so_and_is_not_healthy(wheel: Path,
                                                             tmp_path: Path) -> None:
    env_dir = tmp_path / "no-torch"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--no-deps", str(wheel)], check=True, env=clean_env(), timeout=300)
    proc = subprocess.run([str(env_dir / "bin" / "rocm-autopatch"), "doctor"],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 1, proc.stdout
    assert "torch cannot be imported by this Python" in flat(proc.stdout)
    assert "install it where your torch is" in flat(proc.stdout)
    assert "\nhealthy" not in proc.stdout


CHECKED = "import torch\nf = torch.compile(lambda x: torch.relu(x) * 2)\nf(torch.randn(8))\n"


@pytest.mark.parametrize("value, log, said", [("check", "", True), ("yes", "", True),
                                              ("fallback", "info", True),
                                              ("check", "off", False)])
def test_the_sentinel_says_what_it_checked_at_exit(torch_venv: Venv, value: str, log: str,
                                                   said: bool) -> None:
    proc = torch_venv.run(CHECKED, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": value,
                                        "ROCM_AUTOPATCH_LOG": log})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in ours(proc.stderr) if "ROCM_AUTOPATCH_VERIFY=" in ln]
    mode = "fallback" if value == "fallback" else "check"
    assert lines == ([f"rocm-autopatch: ROCM_AUTOPATCH_VERIFY={mode}: 1 graph compiled: "
                      "1 passed, 0 wrong, 0 not compared"] if said else [])
    assert proc.stdout == ""


def test_an_override_names_its_variable_as_its_reason(torch_venv: Venv) -> None:
    code = ("import json, torch._inductor.config, rocm_autopatch\n"
            "e = rocm_autopatch.report().config_entry('inductor.max_autotune')\n"
            "print(json.dumps({'source': e.source, 'why': e.why, 'ref': e.ref}))")
    out = torch_venv.json(code, env={**FORCE, "INDUCTOR_MAX_AUTOTUNE": "1"})
    assert out["source"] == "override" and out["ref"] == ""
    assert out["why"].startswith("set by INDUCTOR_MAX_AUTOTUNE='1' in the environment")
    assert "GEMM autotuning" not in out["why"]
    text = doctor(torch_venv, env={**FORCE, "INDUCTOR_MAX_AUTOTUNE": "1"}).stdout
    assert "why: set by INDUCTOR_MAX_AUTOTUNE='1'" in flat(text)


if sys.platform != "linux":  # /dev/full, fork and /proc are Linux's
    pytestmark = pytest.mark.skip("Linux only")
