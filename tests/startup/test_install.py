"""The installed wheel: the .pth in site-packages, start-up behaviour, every process kind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Optional

import pytest
from conftest import ROOT, Venv, clean_env, make_venv, new_venv

import _rocm_autopatch_start
from rocm_autopatch.config import profiles

OURS = "sorted(m for m in sys.modules if m.startswith(('rocm_autopatch', '_rocm_autopatch')))"

APPLIED = """
import json, sys, threading
import torch, torch._inductor.config as ic, torch._dynamo.config as dc
def values():
    return {"max_autotune": ic.max_autotune, "backends": ic.max_autotune_gemm_backends,
            "cudagraphs": ic.triton.cudagraphs, "trees": ic.triton.cudagraph_trees,
            "recompile_limit": dc.recompile_limit}
seen = {}
t = threading.Thread(target=lambda: seen.update(values())); t.start(); t.join()
print(json.dumps({"main": values(), "thread": seen, "ours": %s,
                  "guard": torch.compile.__code__.co_filename.rsplit("/", 1)[-1]}))
""" % OURS

SAFE_CORE = {"max_autotune": False, "backends": "ATEN", "cudagraphs": False, "trees": False,
             "recompile_limit": 128}

SNAPSHOT = """
import json, sys, types
import torch, torch._inductor.config as ic, torch._dynamo.config as dc
def norm(v):  # sets print in hash-seed order
    return sorted(map(repr, v)) if isinstance(v, (set, frozenset)) else repr(v)
snap = {k: norm(v) for k, v in sorted(ic.get_config_copy().items())}
snap.update({"dynamo." + k: norm(v) for k, v in sorted(dc.get_config_copy().items())})
c = torch.compile
finders = [getattr(f, "__name__", "?") for f in sys.meta_path]
print(json.dumps({"config": snap, "compile": [type(c).__name__, c.__module__,
                  c.__code__.co_filename], "finders": finders,
                  "watching": sorted(getattr(getattr(sys.meta_path[0].find_spec, "__self__",
                                                     None), "hooks", {})),
                  "ours": %s}))
""" % OURS


def test_wheel_puts_both_startup_files_at_the_root(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "rocm_autopatch.pth" in names and "rocm_autopatch.start" in names
    pth = zipfile.ZipFile(wheel).read("rocm_autopatch.pth").decode().splitlines()
    # site runs only lines that start with "import"; a second line would be a path.
    assert len(pth) == 1 and pth[0].startswith("import ")
    # The trigger is written into the line (no module to load at start-up), generated from
    # the start-up module: the file in the wheel is what `python _rocm_autopatch_start.py`
    # prints for this checkout.
    assert pth[0] + "\n" == _rocm_autopatch_start.pth_line()
    start = zipfile.ZipFile(wheel).read("rocm_autopatch.start").decode().split()
    assert start == ["_rocm_autopatch_start:start"]
    # The start-up module is a top-level module beside the package (one file to load).
    assert "_rocm_autopatch_start.py" in names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[torch.backends]\nrocm_autopatch = _rocm_autopatch_start:autoload" in text


def test_wheel_requires_nothing_outside_the_test_extra(wheel: Path) -> None:
    """torch above all (pip would swap a ROCm torch for a CUDA one), but nothing else either."""
    zf = zipfile.ZipFile(wheel)
    (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line for line in zf.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    assert requires and all("extra ==" in line for line in requires), requires


def test_files_land_in_site_packages(torch_venv: Venv) -> None:
    assert (torch_venv.site / "rocm_autopatch.pth").is_file()
    assert (torch_venv.site / "rocm_autopatch.start").is_file()


def test_force_applies_safe_core_in_every_thread(torch_venv: Venv) -> None:
    out = torch_venv.json(APPLIED, env={"ROCM_AUTOPATCH": "force"})
    assert out["main"] == SAFE_CORE
    assert out["thread"] == SAFE_CORE
    assert out["guard"] == "compile_options.py"


@pytest.mark.fast
@pytest.mark.parametrize("value", ["0", "OFF", "false", "No", " off ", "FALSE"])
def test_every_spelling_of_off_stops_the_trigger_and_the_bootstrap(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """The words of off, read where they act: the .pth line's trigger (the text the wheel
    writes) installs nothing, and the bootstrap's parse says off; "auto" installs it. The
    subprocess test below proves two spellings end to end (one a process each, issue 42)."""
    import sys

    from rocm_autopatch.startup import bootstrap

    assert bootstrap.parse_mode(value) == "off"
    saved, finders = getattr(sys, "_rocm_autopatch", None), list(sys.meta_path)
    try:
        for mode, installs in ((value, False), ("auto", True)):
            if hasattr(sys, "_rocm_autopatch"):
                del sys._rocm_autopatch  # as in a process the .pth has not run in yet
            monkeypatch.setenv("ROCM_AUTOPATCH", mode)
            # VIA set: the trigger installs itself and fires nothing, even where this
            # process has imported torch (start() fires it itself)
            exec(_rocm_autopatch_start.TRIGGER, {"VIA": "test"})
            assert hasattr(sys, "_rocm_autopatch") is installs, mode
            assert (len(sys.meta_path) == len(finders) + 1) is installs, mode
            sys.meta_path[:] = finders
    finally:
        sys.meta_path[:] = finders
        if hasattr(sys, "_rocm_autopatch"):
            del sys._rocm_autopatch
        if saved is not None:
            sys._rocm_autopatch = saved


@pytest.mark.parametrize("value", ["0", "No"])
def test_off_means_nothing_of_ours_runs_beyond_a_check(torch_venv: Venv, value: str) -> None:
    out = torch_venv.json(SNAPSHOT, env={"ROCM_AUTOPATCH": value})
    # torch's autoload imports the entry point's module, which reads ROCM_AUTOPATCH and stops.
    assert out["ours"] == ["_rocm_autopatch_start"]
    assert "rocm_autopatch_trigger" not in out["finders"]
    assert out["compile"][2].endswith(f"torch{os.sep}__init__.py")  # torch's own compile
    quiet = torch_venv.json(SNAPSHOT, env={"ROCM_AUTOPATCH": value,
                                           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert quiet["ours"] == [] and quiet["config"] == out["config"]


def test_cpu_build_without_force_sees_the_same_torch(torch_venv: Venv) -> None:
    with_package = torch_venv.json(SNAPSHOT)
    without = torch_venv.json(SNAPSHOT, env={"ROCM_AUTOPATCH": "0"})
    assert with_package["config"] == without["config"]
    assert with_package["compile"] == without["compile"]
    assert with_package["compile"][0] == "function"
    # Once torch turned out not to be a ROCm build the trigger watches nothing more (it
    # stays in sys.meta_path, emptied: removing it could make another thread skip a finder).
    assert with_package["finders"][0] == "rocm_autopatch_trigger"
    assert with_package["watching"] == []
    assert with_package["finders"][1:] == without["finders"]
    # Deciding loads these few; the profiles, logging and fixes are never loaded here.
    assert with_package["ours"] == ["_rocm_autopatch_start", "rocm_autopatch",
                                    "rocm_autopatch.probe", "rocm_autopatch.record",
                                    "rocm_autopatch.startup",
                                    "rocm_autopatch.startup.bootstrap",
                                    "rocm_autopatch.startup.post_import",
                                    "rocm_autopatch.startup.wiring"]


@pytest.mark.parametrize("mode", ["auto", "force"])
def test_program_without_torch_loads_no_module_of_ours(torch_venv: Venv, mode: str) -> None:
    code = f"""import json, sys
print(json.dumps({{'ours': {OURS}, 'first': getattr(sys.meta_path[0], '__name__', '?')}}))"""
    out = torch_venv.json(code, env={"ROCM_AUTOPATCH": mode})
    assert out == {"ours": [], "first": "rocm_autopatch_trigger"}


def test_bad_mode_warns_once_at_import_torch_and_continues(torch_venv: Venv) -> None:
    # Only a process that imports torch is affected by the variable, so only it warns:
    # pip and every other tool on the machine stay silent.
    quiet = torch_venv.run("print('fine')", env={"ROCM_AUTOPATCH": "banana"})
    assert quiet.returncode == 0 and quiet.stdout == "fine\n" and quiet.stderr == ""
    proc = torch_venv.run("import torch; print('fine')", env={"ROCM_AUTOPATCH": "banana"})
    assert proc.returncode == 0
    assert proc.stdout == "fine\n"
    assert proc.stderr.count("ROCM_AUTOPATCH='banana'") == 1
    assert "force" in proc.stderr and "auto" in proc.stderr


def test_python_S_runs_untouched(torch_venv: Venv) -> None:
    out = torch_venv.json(f"import json, sys; print(json.dumps({{'ours': {OURS}}}))",
                          flags=["-S"], env={"ROCM_AUTOPATCH": "force"})
    assert out["ours"] == []


def test_python_I_still_gets_the_hook(torch_venv: Venv) -> None:
    out = torch_venv.json(APPLIED, flags=["-I"], env={"ROCM_AUTOPATCH": "force"})
    assert out["main"] == SAFE_CORE and out["guard"] == "compile_options.py"


def test_torch_imported_by_an_earlier_pth(wheel: Path, torch_links: Path, torch_venv: Venv,
                                         tmp_path: Path) -> None:
    """A .pth sorted before ours imports torch (in a venv of its own: the shared one's
    processes must not all import torch at start)."""
    env = new_venv(tmp_path / "venv", torch_links)
    subprocess.run([torch_venv.python, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(env.site), str(wheel)], check=True, env=clean_env())
    (env.site / "torch_links.pth").rename(env.site / "aaa_links.pth")  # torch findable first
    (env.site / "aab_imports_torch.pth").write_text("import torch\n")
    assert sorted(p.name for p in env.site.glob("*.pth")) == [
        "aaa_links.pth", "aab_imports_torch.pth", "rocm_autopatch.pth"]
    out = env.json(APPLIED, env={"ROCM_AUTOPATCH": "force"})
    assert out["main"] == SAFE_CORE and out["guard"] == "compile_options.py"


def test_two_threads_importing_torch_at_once(torch_venv: Venv) -> None:
    code = """
import json, threading, importlib
barrier = threading.Barrier(2)
def worker():
    barrier.wait()
    importlib.import_module("torch._inductor.config")
    importlib.import_module("torch._dynamo.config")
threads = [threading.Thread(target=worker) for _ in range(2)]
[t.start() for t in threads]; [t.join() for t in threads]
import torch, rocm_autopatch
r = rocm_autopatch.report()
print(json.dumps({"errors": r.errors, "keys": len(r.config),
                  "guard": torch.compile.__code__.co_filename.rsplit("/", 1)[-1],
                  "inner": type(torch.compile.__wrapped__).__name__,
                  "max_autotune": torch._inductor.config.max_autotune}))
"""
    out = torch_venv.json(code, env={"ROCM_AUTOPATCH": "force"})
    assert out == {"errors": [], "keys": len(profiles.keys("safe")), "guard": "compile_options.py",
                   "inner": "function", "max_autotune": False}


def test_idempotent_bootstrap_hooks_and_reload(torch_venv: Venv) -> None:
    # torch's config modules refuse importlib.reload (with or without us), so the
    # reload case is convert_frame: re-executed, it gets its fix again, exactly once.
    code = """
import importlib, json, sys
import _rocm_autopatch_start as s
s.start(); s.start("test")
import rocm_autopatch.startup.bootstrap as b
b.start("test"); b.activate()
import torch, torch._inductor.config as ic, torch._dynamo.convert_frame as cf
b.activate()
finders = sys.meta_path.count(getattr(sys, "_rocm_autopatch", None))
s = importlib.reload(s); s.start()
finders += sys.meta_path.count(getattr(sys, "_rocm_autopatch", None)) - 1
import rocm_autopatch.startup.wiring as hooks
hooks.on_torch(torch); hooks.on_inductor_config(ic)   # hooks firing twice change nothing
cf = importlib.reload(cf)
print(json.dumps({"finders": finders, "max_autotune": ic.max_autotune,
                  "inner": type(torch.compile.__wrapped__).__name__,
                  "fix_marked": getattr(cf._compile, "__rocm_autopatch__", False),
                  "fix_inner_marked": getattr(cf._compile.__wrapped__, "__rocm_autopatch__", False),
                  "keys": len(__import__("rocm_autopatch").report().config),
                  "errors": __import__("rocm_autopatch").report().errors,
                  "activation": __import__("rocm_autopatch").report().activation}))
"""
    out = torch_venv.json(code, env={"ROCM_AUTOPATCH": "force"})
    assert out == {"finders": 1, "max_autotune": False, "inner": "function", "fix_marked": True,
                   "fix_inner_marked": False, "keys": len(profiles.keys("safe")), "errors": [],
                   "activation": {"via": ".pth", "reached": [
                       ".pth", ".start", "test", "torch.backends entry point"]}}


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_multiprocessing_children_are_patched(torch_venv: Venv, method: str) -> None:
    code = f"""
import json, multiprocessing as mp
def child(q):
    import torch, torch._inductor.config as ic, torch._dynamo.config as dc
    q.put([ic.max_autotune, ic.max_autotune_gemm_backends, dc.recompile_limit,
           torch.compile.__code__.co_filename.rsplit("/", 1)[-1]])
if __name__ == "__main__":
    ctx = mp.get_context("{method}")
    q = ctx.Queue(); p = ctx.Process(target=child, args=(q,)); p.start()
    got = q.get(timeout=300); p.join()
    print(json.dumps({{"child": got, "exit": p.exitcode}}))
"""
    script = Path(torch_venv.path) / f"mp_{method}.py"
    script.write_text(code)
    proc = subprocess.run([torch_venv.python, str(script)], capture_output=True, text=True,
                          env=clean_env(ROCM_AUTOPATCH="force"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out == {"child": [False, "ATEN", 128, "compile_options.py"], "exit": 0}


def test_pip_still_works_with_the_pth(torch_venv: Venv) -> None:
    for env in ({}, {"ROCM_AUTOPATCH": "force"}):
        proc = subprocess.run([torch_venv.python, "-m", "pip", "list"], capture_output=True,
                              text=True, env=clean_env(**env), timeout=300)
        assert proc.returncode == 0
        assert "rocm-autopatch" in proc.stdout and "rocm" not in proc.stderr.lower()


def test_real_compile_matches_eager_under_force(torch_venv: Venv) -> None:
    code = """
import json, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)
compiled = torch.compile(model)
print(json.dumps({"close": torch.allclose(compiled(x), model(x), atol=1e-5),
                  "guard": torch.compile.__code__.co_filename.rsplit("/", 1)[-1]}))
"""
    assert torch_venv.json(code, env={"ROCM_AUTOPATCH": "force"}) == {
        "close": True, "guard": "compile_options.py"}


def test_uninstall_removes_both_files(wheel: Path, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("uninstall") / "venv"
    make_venv(path, [])
    python = str(path / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, env=clean_env())
    small = Venv(path)
    assert (small.site / "rocm_autopatch.pth").exists()
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "rocm-autopatch"],
                   check=True, env=clean_env())
    assert not (small.site / "rocm_autopatch.pth").exists()
    assert not (small.site / "rocm_autopatch.start").exists()
    assert not (small.site / "rocm_autopatch").exists()


def find_python(version: str) -> Optional[str]:
    pyenv = Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser() / "versions"
    for exe in sorted(pyenv.glob(f"{version}.*/bin/python{version}")):
        return str(exe)
    return shutil.which(f"python{version}")


STANDIN = ROOT / "tests" / "standin_rocm_torch"


@pytest.mark.parametrize("version", ["3.9", "3.10", "3.12", "3.13"])
def test_bootstrap_on_other_pythons_with_a_standin_rocm_torch(
        wheel: Path, tmp_path_factory, version: str) -> None:
    """No torch wheel for these Pythons here: a clearly named stand-in plays a ROCm build."""
    exe = find_python(version)
    if exe is None:
        pytest.skip(f"python{version} not available")
    path = tmp_path_factory.mktemp(f"py{version}") / "venv"
    subprocess.run([exe, "-m", "venv", "--without-pip", str(path)], check=True)
    target = Venv(path)
    with zipfile.ZipFile(wheel) as zf:  # a pure-Python wheel install is an unzip
        zf.extractall(target.site)
    code = """
import json, sys
import torch
compiled = torch.compile(lambda x: x, mode="reduce-overhead")
import rocm_autopatch
r = rocm_autopatch.report()
print(json.dumps({"received": torch.RECEIVED, "platform": r.platform, "active": r.active,
                  "py": sys.version_info[:2]}))
"""
    proc = subprocess.run([target.python, "-c", code], capture_output=True, text=True,
                          env=clean_env(PYTHONPATH=STANDIN))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["received"] == [{"mode": "default"}]
    assert out["platform"] == "rocm" and out["active"] is True
    assert out["py"] == [int(p) for p in version.split(".")]


@pytest.mark.heavy(27)
def test_a_closed_stderr_changes_no_exit_status_and_switches_nothing_off(
        torch_venv: Venv, tmp_path: Path) -> None:
    """stderr a pipe whose reader is gone: our warnings must not change the exit status,
    crash the doctor, or turn a warning at start-up into "inactive"."""
    code = ("import json, torch, rocm_autopatch; torch.compile(lambda x: x + 1)(torch.ones(2)); "
            "r = rocm_autopatch.report(); print(json.dumps({'mode': r.mode, 'active': r.active,"
            " 'errors': r.errors, 'guarded': hasattr(torch.compile, '__rocm_autopatch__')}))")
    doctor = [str(torch_venv.path / "bin" / "rocm-autopatch"), "doctor", "--report",
              str(tmp_path / "missing.json")]
    cases = [([torch_venv.python, "-c", code], {"ROCM_AUTOPATCH": "bogus"}),
             ([torch_venv.python, "-c", code], {"ROCM_AUTOPATCH": "force",
                                                "ROCM_AUTOPATCH_PROFILE": "bogus",
                                                "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
                                                "ROCM_AUTOPATCH_REPORT": "/dev/null/r.json"}),
             (doctor, {})]
    for cmd, env in cases:
        seen = []
        for closed in (False, True):
            read, write = os.pipe()
            if closed:
                os.close(read)
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=write, text=True,
                                  env=clean_env(**env), cwd=str(tmp_path), timeout=300)
            os.close(write)
            if not closed:
                os.close(read)
            seen.append((proc.returncode, proc.stdout))
        assert seen[0] == seen[1], (cmd[-1], env, seen)
    assert seen[0][0] == 2  # the doctor: no readable report, closed stderr or not


def test_the_sdist_builds_the_same_wheel_and_the_version_is_written_once(
        wheel: Path, tmp_path: Path, torch_venv: Venv) -> None:
    """``python -m build`` makes the sdist, then the wheel from it: that wheel must equal the
    one built from the checkout, start-up files included."""
    import sys

    import rocm_autopatch

    out = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                    str(ROOT)], check=True, env=clean_env(), capture_output=True)
    (sdist,) = out.glob("rocm_autopatch-*.tar.gz")
    (built,) = out.glob("rocm_autopatch-*.whl")
    direct, from_sdist = zipfile.ZipFile(wheel), zipfile.ZipFile(built)
    names = sorted(direct.namelist())
    assert names == sorted(from_sdist.namelist())
    for name in names:
        if not name.endswith("/RECORD"):
            assert direct.read(name) == from_sdist.read(name), name
    assert {"rocm_autopatch.pth", "rocm_autopatch.start", "_rocm_autopatch_start.py"} <= set(
        names)
    version = rocm_autopatch.__version__
    assert sdist.name == f"rocm_autopatch-{version}.tar.gz"
    (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert f"\nVersion: {version}\n" in direct.read(meta).decode()
    assert not re.search(r"^version\s*=", (ROOT / "pyproject.toml").read_text(),
                         re.MULTILINE)  # written in one place only
    said = subprocess.run([str(torch_venv.path / "bin" / "rocm-autopatch"), "--version"],
                          capture_output=True, text=True, env=clean_env())
    assert (said.returncode, said.stdout.strip()) == (0, f"rocm-autopatch {version}")
