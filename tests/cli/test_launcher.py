"""`rocm-autopatch run`: the target sees what it would see run directly, plus the package."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from conftest import Venv, clean_env

PROBE = """
import json, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__,
                  "file": globals().get("__file__"), "spec": getattr(__spec__, "name", None),
                  "loader": type(__loader__).__name__, "no_site": sys.flags.no_site,
                  "main_is_module": sys.modules["__main__"].__dict__ is globals()}))
if "--exit" in sys.argv:
    sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]))
if "--fail" in sys.argv:
    def inner():
        raise ValueError("boom")
    inner()
"""

PATCHED = """
import json, sys, torch, torch._inductor.config as ic, rocm_autopatch
print(json.dumps({"guard": torch.compile.__code__.co_filename.rsplit("/", 1)[-1],
                  "max_autotune": ic.max_autotune,
                  "backends": ic.max_autotune_gemm_backends, "no_site": sys.flags.no_site,
                  "profile": rocm_autopatch.report().profile, "argv": sys.argv}))
"""


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "probe.py").write_text(PROBE)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "probe.py").write_text(PROBE)
    (tmp_path / "scripts" / "patched.py").write_text(PATCHED)
    return tmp_path


def run(venv: Venv, argv: List[str], launcher: bool, cwd: Path,
        env: Optional[Dict[str, str]] = None, profile: Optional[str] = None
        ) -> subprocess.CompletedProcess:
    cmd = [venv.python, *argv]
    if launcher:
        cmd = [str(venv.path / "bin" / "rocm-autopatch"), "run",
               *(["--profile", profile] if profile else []), "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=str(cwd), timeout=600,
                          env=clean_env(**(env or {"ROCM_AUTOPATCH": "force"})))


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [
    ["scripts/probe.py", "a", "--b", "c"],
    ["-S", "scripts/probe.py", "x"],
    ["-I", "scripts/probe.py"],
    ["-m", "pkg.probe", "-x", "1"],
    ["-S", "-m", "pkg.probe"],
    ["-um", "pkg.probe"],
    ["-c", PROBE, "arg"],
    ["-S", "-c", PROBE],
    ["-W", "ignore", "-X", "utf8", "scripts/probe.py"],
], ids=["script", "S-script", "I-script", "module", "S-module", "clustered-m", "c", "S-c",
        "options-with-values"])
def test_same_argv_path0_and_main_as_running_directly(torch_venv: Venv, project: Path,
                                                      argv: List[str]) -> None:
    direct = run(torch_venv, argv, launcher=False, cwd=project)
    launched = run(torch_venv, argv, launcher=True, cwd=project)
    assert direct.returncode == launched.returncode == 0, launched.stderr
    assert last_json(launched) == last_json(direct)


def test_python_S_target_gets_the_package(torch_venv: Venv, project: Path) -> None:
    direct = run(torch_venv, ["-S", "scripts/patched.py"], launcher=False, cwd=project)
    assert direct.returncode != 0 and "No module named" in direct.stderr  # no site, no torch
    out = last_json(run(torch_venv, ["-S", "scripts/patched.py", "q"], launcher=True,
                        cwd=project))
    assert out == {"guard": "compile_options.py", "max_autotune": False, "backends": "ATEN",
                   "no_site": 1, "profile": "safe", "argv": ["scripts/patched.py", "q"]}


def test_profile_option_reaches_the_target(torch_venv: Venv, project: Path) -> None:
    out = last_json(run(torch_venv, ["-S", "scripts/patched.py"], launcher=True, cwd=project,
                        profile="perf"))
    assert out["profile"] == "perf"


@pytest.mark.parametrize("code", [0, 3, 255])
def test_exit_status(torch_venv: Venv, project: Path, code: int) -> None:
    argv = ["scripts/probe.py", "--exit", str(code)]
    assert run(torch_venv, argv, launcher=True, cwd=project).returncode == code
    assert run(torch_venv, argv, launcher=False, cwd=project).returncode == code


@pytest.mark.parametrize("argv", [["scripts/probe.py", "--fail"], ["-m", "pkg.probe", "--fail"],
                                  ["-c", "1/0"]], ids=["script", "module", "c"])
def test_failing_target_traceback_unchanged(torch_venv: Venv, project: Path,
                                            argv: List[str]) -> None:
    direct = run(torch_venv, argv, launcher=False, cwd=project)
    launched = run(torch_venv, argv, launcher=True, cwd=project)
    assert direct.returncode == launched.returncode == 1
    assert launched.stderr == direct.stderr
    assert "launcher" not in launched.stderr and launched.stderr.startswith("Traceback")


def test_keyboard_interrupt_dies_of_sigint_like_python(torch_venv: Venv, project: Path) -> None:
    (project / "scripts" / "wait.py").write_text(
        "import sys, time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    results = []
    for launcher in (False, True):
        cmd = [torch_venv.python, "scripts/wait.py"]
        if launcher:
            cmd = [str(torch_venv.path / "bin" / "rocm-autopatch"), "run", "--", *cmd]
        # SIGINT restored to its default for the child: a shell's background job (`cmd &`,
        # as CI may start the suite) runs with SIGINT ignored, and Python then installs no
        # KeyboardInterrupt handler, with or without the launcher.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=str(project), env=clean_env(ROCM_AUTOPATCH="force"),
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        results.append((proc.returncode, err.strip().splitlines()[-1]))
    assert results[0] == results[1] == (-signal.SIGINT, "KeyboardInterrupt")


def test_a_command_that_is_not_python_runs_unchanged(torch_venv: Venv, tmp_path: Path) -> None:
    proc = subprocess.run([str(torch_venv.path / "bin" / "rocm-autopatch"), "run", "--", "sh",
                           "-c", "echo $ROCM_AUTOPATCH_PROFILE; exit 7"], capture_output=True,
                          text=True, env=clean_env(), cwd=str(tmp_path))
    assert proc.returncode == 7 and proc.stdout == "\n"
    missing = subprocess.run([str(torch_venv.path / "bin" / "rocm-autopatch"), "run", "--",
                              "no-such-program-xyz"], capture_output=True, text=True,
                             env=clean_env())
    assert missing.returncode == 127 and "cannot run" in missing.stderr


@pytest.mark.parametrize("target", ["no/such.py", "pkg"], ids=["missing-script",
                                                              "directory-without-main"])
def test_a_target_python_cannot_run_fails_as_python_does(torch_venv: Venv, project: Path,
                                                          target: str) -> None:
    direct = run(torch_venv, [target], launcher=False, cwd=project)
    launched = run(torch_venv, [target], launcher=True, cwd=project)
    assert direct.returncode in (1, 2) and "Traceback" not in direct.stderr
    assert (launched.returncode, launched.stderr) == (direct.returncode, direct.stderr)


@pytest.mark.parametrize("name", ["log", "settings", "record", "text", "frames", "files"])
def test_the_target_imports_what_it_would_import_run_directly(torch_venv: Venv, project: Path,
                                                              name: str) -> None:
    """issue 44: the launcher once put the package's own folder on sys.path, so a user's
    ``import log`` (or ``settings``, ``text``...) imported ours. A module of that name that
    the user lacks fails as it does run directly, and no entry inside the package is on
    sys.path, under ``-S`` too (where the launcher adds the directory holding it)."""
    (project / "scripts" / "mine.py").write_text(
        "import json, sys, importlib.util\n"
        f"print(json.dumps({{'found': importlib.util.find_spec({name!r}) is not None,\n"
        "                  'inside': [p for p in sys.path if p.rstrip('/').endswith("
        "'rocm_autopatch') or '/rocm_autopatch/' in p]}))\n")
    for argv in (["scripts/mine.py"], ["-S", "scripts/mine.py"]):
        direct = run(torch_venv, argv, launcher=False, cwd=project)
        launched = run(torch_venv, argv, launcher=True, cwd=project)
        assert last_json(launched) == last_json(direct) == {"found": False, "inside": []}, argv
