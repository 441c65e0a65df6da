"""Activation under every installer and layout: the .pth, torch's backend autoload (the
``torch.backends`` entry point), both at once, a ``--target`` install on ``PYTHONPATH``, uv,
and a double install (user site and a venv). Real wheels, real installers, real torch.

torch is not installed again for each layout: a directory of links to the cached torch
venv's packages (everything but rocm-autopatch) is put on ``sys.path`` by a path-only .pth,
so each new environment holds the real torch 2.13 and exactly the copies of rocm-autopatch
that the test installs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from conftest import Venv, clean_env, new_venv

from rocm_autopatch.config import profiles

ENTRY = "torch.backends entry point"
OURS = "sorted(m for m in sys.modules if m.startswith(('rocm_autopatch', '_rocm_autopatch')))"

# What a process saw: the trigger before torch, then what torch ended up with.
PROBE = """
import json, sys
before = sys.meta_path.count(getattr(sys, "_rocm_autopatch", None))
import torch, torch._inductor.config as ic, torch._dynamo.config as dc
import torch._dynamo.convert_frame as cf
import rocm_autopatch
r = rocm_autopatch.report()
print(json.dumps({"trigger_before_torch": before, "active": r.active,
                  "activation": r.activation, "keys": len(r.config), "errors": r.errors,
                  "recompile_limit": dc.recompile_limit,
                  "backends": ic.max_autotune_gemm_backends,
                  "guard": torch.compile.__code__.co_filename.rsplit("/", 1)[-1],
                  "guard_inner": torch.compile.__wrapped__.__code__.co_filename.rsplit("/", 1)[-1]
                  if hasattr(torch.compile, "__wrapped__") else None,
                  "frame_hook_inner_ours": getattr(getattr(cf._compile, "__wrapped__", None),
                                                   "__rocm_autopatch__", False),
                  "package": rocm_autopatch.__file__}))
"""

UNTOUCHED = """
import json, sys
import torch, torch._dynamo.config as dc
print(json.dumps({"ours": %s, "recompile_limit": dc.recompile_limit,
                  "guard": torch.compile.__code__.co_filename.rsplit("/", 1)[-1]}))
""" % OURS


def base_python(torch_venv: Venv) -> str:
    cfg = dict(line.split(" = ", 1) for line in
               (torch_venv.path / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    return cfg["executable"]


def uv(*args: str, env: Dict[str, str] = None) -> None:
    subprocess.run([sys.executable, "-m", "uv", *args], check=True, capture_output=True,
                   env=clean_env(**(env or {})))


def summary_lines(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if "config, safe profile" in line]


def test_target_install_on_pythonpath_activates_through_torchs_autoload(
        wheel: Path, torch_links: Path, torch_venv: Venv, tmp_path: Path) -> None:
    """No .pth is processed on PYTHONPATH (pytest-cov#90): torch's autoload activates."""
    target = tmp_path / "target"
    subprocess.run([torch_venv.python, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, env=clean_env())
    assert (target / "rocm_autopatch.pth").is_file()  # there, and never run by site
    env = new_venv(tmp_path / "venv", torch_links)
    out = env.json(PROBE, env={"PYTHONPATH": str(target), "ROCM_AUTOPATCH": "force"})
    assert out["trigger_before_torch"] == 0
    assert out["activation"] == {"via": ENTRY, "reached": [ENTRY]}
    assert out["active"] and out["errors"] == [] and out["keys"] == len(profiles.keys("safe"))
    assert out["recompile_limit"] == 128 and out["backends"] == "ATEN"
    assert out["guard"] == "compile_options.py" and out["guard_inner"] == "__init__.py"
    assert out["package"].startswith(str(target))
    # Autoload off: this layout has no other path; the launcher is the way (README).
    off = env.json(UNTOUCHED, env={"PYTHONPATH": str(target), "ROCM_AUTOPATCH": "force",
                                   "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert off == {"ours": [], "recompile_limit": 8, "guard": "__init__.py"}
    # Opted out: the entry point's module reads ROCM_AUTOPATCH and does nothing more.
    opted_out = env.json(UNTOUCHED, env={"PYTHONPATH": str(target), "ROCM_AUTOPATCH": "0"})
    assert opted_out == {"ours": ["_rocm_autopatch_start"], "recompile_limit": 8,
                         "guard": "__init__.py"}
    # A CPU build without force: decided, nothing changed, the hook stops watching.
    auto = env.json(PROBE, env={"PYTHONPATH": str(target)})
    assert auto["active"] is False and auto["recompile_limit"] == 8
    assert auto["guard"] == "__init__.py" and auto["activation"]["via"] == ENTRY


def test_pth_and_entry_point_together_apply_and_say_everything_once(torch_venv: Venv) -> None:
    proc = torch_venv.run(PROBE, env={"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_LOG": "info"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["trigger_before_torch"] == 1
    assert out["activation"] == {"via": ".pth", "reached": [".pth", ENTRY]}
    assert out["keys"] == len(profiles.keys("safe")) and out["errors"] == []
    # Wrapped once each: the guard wraps torch's own compile, the frame hook torch's _compile.
    assert out["guard"] == "compile_options.py" and out["guard_inner"] == "__init__.py"
    assert out["frame_hook_inner_ours"] is False
    assert [line.split(" config, ")[0].split()[-1]
            for line in summary_lines(proc.stderr)] == ["dynamo", "inductor"]


def test_autoload_off_leaves_the_pth_path_working(torch_venv: Venv) -> None:
    out = torch_venv.json(PROBE, env={"ROCM_AUTOPATCH": "force",
                                      "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out["activation"] == {"via": ".pth", "reached": [".pth"]}
    assert out["active"] and out["recompile_limit"] == 128 and out["guard"] == "compile_options.py"


def test_uv_install_has_both_startup_files_in_purelib_and_activates(
        wheel: Path, torch_links: Path, torch_venv: Venv, tmp_path: Path) -> None:
    path = tmp_path / "uv-venv"
    uv("venv", "-q", "--python", base_python(torch_venv), str(path))
    uv("pip", "install", "-q", "--offline", "--no-deps", "--python", str(path / "bin" / "python"),
       str(wheel))
    env = Venv(path)
    assert (env.site / "rocm_autopatch.pth").is_file()
    assert (env.site / "rocm_autopatch.start").is_file()
    assert (env.site / "_rocm_autopatch_start.py").is_file()
    # uv writes no bytecode unless asked: the no-cache case of every start.
    assert not list((env.site / "rocm_autopatch").glob("__pycache__/*.pyc"))
    (env.site / "torch_links.pth").write_text(f"{torch_links}\n")
    out = env.json(PROBE, env={"ROCM_AUTOPATCH": "force", "PYTHONDONTWRITEBYTECODE": "1"})
    assert out["trigger_before_torch"] == 1
    assert out["activation"] == {"via": ".pth", "reached": [".pth", ENTRY]}
    assert out["active"] and out["recompile_limit"] == 128 and out["guard"] == "compile_options.py"
    assert out["package"].startswith(str(env.site))
    doctor = json.loads(subprocess.run(
        [env.python, "-m", "rocm_autopatch", "doctor", "--json"], capture_output=True,
        text=True, env=clean_env(ROCM_AUTOPATCH="force"), cwd=str(tmp_path)).stdout)
    (dist,) = doctor["install"]["distributions"]
    assert dist["installer"] == "uv" and dist["in_use"]
    assert dist["startup_files"]["rocm_autopatch.pth"]["runs"] is True


def test_double_install_user_site_and_venv_applies_once(
        wheel: Path, torch_links: Path, torch_venv: Venv, tmp_path: Path) -> None:
    """pip --user with the base Python, and again into a venv that sees system and user
    site (--system-site-packages): both .pth files run, the package applies once."""
    user_base = tmp_path / "userbase"
    user_env = {"PYTHONUSERBASE": str(user_base)}
    subprocess.run([base_python(torch_venv), "-m", "pip", "install", "-q", "--user",
                    "--no-deps", "--disable-pip-version-check", str(wheel)], check=True,
                   env=clean_env(**user_env))
    env = new_venv(tmp_path / "venv", torch_links, system_site=True)
    uv("pip", "install", "-q", "--offline", "--no-deps", "--python", env.python, str(wheel))
    proc = env.run(PROBE, env={**user_env, "ROCM_AUTOPATCH": "force",
                               "ROCM_AUTOPATCH_LOG": "info"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["trigger_before_torch"] == 1
    assert out["activation"] == {"via": ".pth", "reached": [".pth", ENTRY]}
    assert out["keys"] == len(profiles.keys("safe")) and out["errors"] == []
    assert out["guard_inner"] == "__init__.py" and out["frame_hook_inner_ours"] is False
    assert len(summary_lines(proc.stderr)) == 2  # dynamo and inductor, once each
    doctor = subprocess.run([env.python, "-m", "rocm_autopatch", "doctor", "--json"],
                            capture_output=True, text=True, cwd=str(tmp_path),
                            env=clean_env(**user_env, ROCM_AUTOPATCH="force"))
    inst = json.loads(doctor.stdout)["install"]
    assert inst["duplicate"] is True
    locations = {d["location"]: d for d in inst["distributions"]}
    assert set(locations) == {str(env.site), str(next(user_base.glob(
        "lib/python3*/site-packages")))}
    assert {d["installer"] for d in inst["distributions"]} == {"pip", "uv"}
    assert [d["in_use"] for d in inst["distributions"]] == [True, False]  # sys.path order
    assert inst["distributions"][0]["location"] == str(Path(out["package"]).parent.parent)
    text = subprocess.run([env.python, "-m", "rocm_autopatch", "doctor"], capture_output=True,
                          text=True, cwd=str(tmp_path),
                          env=clean_env(**user_env, ROCM_AUTOPATCH="force")).stdout
    assert "! installed 2 times" in text


def test_import_torch_runs_with_torchs_own_loader(torch_venv: Venv) -> None:
    """Where torch calls us back (its backend autoload), its import is not wrapped: what
    ``find_spec`` says and what ``import torch`` runs are torch's own, and the package
    still activates, through the entry point, before any program code sees torch."""
    code = ("import importlib.util, json, sys\n"
            "loader = importlib.util.find_spec('torch').loader\n"
            "import torch, rocm_autopatch\n"
            "r = rocm_autopatch.report()\n"
            "print(json.dumps({'loader': type(loader).__module__ + '.' + type(loader).__name__,"
            " 'module_loader': type(torch.__loader__).__name__, 'active': r.active,"
            " 'reached': r.activation['reached'],"
            " 'guarded': torch.compile.__module__ == 'rocm_autopatch.guards.compile_options'"
            " or hasattr(torch.compile, '__rocm_autopatch__')}))\n")
    out = torch_venv.json(code, env={"ROCM_AUTOPATCH": "force"})
    assert out["loader"].endswith(".SourceFileLoader") and "rocm" not in out["loader"]
    assert out["module_loader"] == "SourceFileLoader"
    assert out["active"] and out["guarded"]
    assert out["reached"] == [".pth", ENTRY]


def test_a_failing_import_torch_looks_as_it_does_without_the_package(
        torch_venv: Venv, tmp_path: Path) -> None:
    """A STAND-IN for a torch whose import fails (a missing ROCm library): it has torch's
    autoload switch, then raises. The traceback is the one Python prints without us."""
    fake = tmp_path / "broken" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "def _is_device_backend_autoload_enabled():\n    return True\n\n"
        "raise OSError('libamdhip64.so: cannot open shared object file: No such file or "
        "directory')\n")
    runs = {}
    for mode in ("auto", "force", "0"):
        proc = subprocess.run([torch_venv.python, "-c", "import torch"], capture_output=True,
                              text=True, cwd=str(tmp_path), timeout=120,
                              env=clean_env(ROCM_AUTOPATCH=mode,
                                            PYTHONPATH=str(fake.parent)))
        assert proc.returncode == 1 and "libamdhip64.so" in proc.stderr
        runs[mode] = proc.stderr
    assert runs["auto"] == runs["force"] == runs["0"]
    assert "rocm_autopatch" not in runs["auto"]


SAY_WHAT = """
import json, torch, rocm_autopatch
f = torch.compile(lambda x: x * 2 + 1)
f(torch.ones(4)); f(torch.ones(5))  # a second compile (a new shape) says nothing more
r = rocm_autopatch.report()
print(json.dumps([c.key for c in r.config if c.status == "applied"]))
"""


@pytest.mark.parametrize("level", ["", "error"])
def test_a_process_that_compiles_is_told_once_what_changed(torch_venv: Venv,
                                                           level: str) -> None:
    """issue 44: the README says it says once, on stderr, what it changed; by default a
    plain torch.compile under force said nothing. Now one line at the end of the first
    compile names the keys the record lists as applied (not as a warning), and
    ``ROCM_AUTOPATCH_LOG=error`` silences it; a CPU build without force says nothing."""
    env = {"ROCM_AUTOPATCH": "force", **({"ROCM_AUTOPATCH_LOG": level} if level else {})}
    proc = torch_venv.run(SAY_WHAT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    applied = json.loads(proc.stdout.splitlines()[-1])
    said = [line for line in proc.stderr.splitlines() if "safe profile: changed" in line]
    if level == "error":
        assert said == []
    else:
        assert 0 < len(applied) <= 3 and len(said) == 1, proc.stderr
        names = ", ".join(key.split(".", 1)[1] for key in applied)
        assert said[0] == (f"rocm-autopatch: safe profile: changed {names} (why: "
                           "rocm-autopatch doctor; undo: ROCM_AUTOPATCH=0)")
    if not level:  # the same process for either level: run once
        quiet = torch_venv.run(SAY_WHAT, env={"ROCM_AUTOPATCH": ""})
        assert quiet.returncode == 0 and "rocm-autopatch" not in quiet.stderr, quiet.stderr


PENDING = """
import json, torch, rocm_autopatch
r = rocm_autopatch.report()
first = {c.key: c.status for c in r.config}
import torch._dynamo.config, torch._inductor.config
print(json.dumps({"first": first, "then": {c.key: c.status for c in r.config},
                  "repr": repr(r), "public": sorted(n for n in dir(r) if not n.startswith("_"))}))
"""


def test_the_record_says_from_import_torch_what_will_apply(torch_venv: Venv) -> None:
    """issue 44: ``report().config`` was empty right after ``import torch`` (Inductor's
    config, imported lazily, had not been applied yet). Every key of the profile is listed
    ``pending`` from ``import torch`` on, and none once torch imported its config; the
    record's repr is a few short lines; its public names are its fields and to_dict."""
    out = json.loads(torch_venv.run(PENDING, env={"ROCM_AUTOPATCH": "force"}).stdout)
    assert set(out["first"]) == set(profiles.keys("safe"))
    assert set(out["first"].values()) == {"pending"}
    assert set(out["then"]) == set(profiles.keys("safe"))
    assert "pending" not in out["then"].values()
    lines = out["repr"].splitlines()
    assert 3 <= len(lines) <= 8 and max(map(len, lines)) <= 120, out["repr"]
    assert "to_dict()" in out["repr"]
    fields = ["activation", "active", "compile_rewrites", "config", "eager_in_capture",
              "errors", "fixes", "forced", "hip_version", "mode", "platform", "profile",
              "reason", "torch_version", "verify", "warnings"]
    assert out["public"] == sorted(fields + ["to_dict"])
