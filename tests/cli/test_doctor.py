"""`rocm-autopatch doctor`: the real installed console script, in subprocesses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Callable, Dict

import pytest
from conftest import ROOT, Venv, clean_env, doctor

import rocm_autopatch
from rocm_autopatch.cli import doctor_text
from rocm_autopatch.config import profiles

SECTIONS = ["Install", "Platform", "Environment",
            "Configuration (key: before -> after, source, status)",
            "torch.compile rewrites and fixes"]
def flat(text: str) -> str:
    """Text with its wrapping undone (a phrase the doctor wraps at 80 columns reads whole)."""
    return " ".join(text.split())


STANDIN = str(ROOT / "tests" / "standin_rocm_torch")


def safe_keys() -> set:
    return {s.key for s in profiles.SAFE}


@pytest.fixture(scope="module")
def collected(torch_venv: Venv) -> Callable[..., subprocess.CompletedProcess]:
    """``collected(**env)``: ``rocm-autopatch doctor --json`` in ``env``, run once for the
    tests of this module that read that environment. Its text views are ``text(proc)``: the
    doctor collects one document and prints it as JSON or renders it with
    ``doctor_text.render`` (cli/main.py), with the same exit status."""
    done: Dict[tuple, subprocess.CompletedProcess] = {}

    def get(**env: str) -> subprocess.CompletedProcess:
        key = tuple(sorted(env.items()))
        if key not in done:
            done[key] = doctor(torch_venv, "--json", env=env)
        return done[key]

    return get


def text(proc: subprocess.CompletedProcess, verbose: bool = False) -> str:
    """What ``rocm-autopatch doctor [--verbose]`` prints of the document ``proc`` printed."""
    return doctor_text.render(json.loads(proc.stdout), verbose)


@pytest.mark.parametrize("mode", ["auto", "force"])
def test_the_default_view_fits_one_screen_and_the_verbose_one_has_every_section(
        torch_venv: Venv, collected: Callable[..., subprocess.CompletedProcess],
        mode: str) -> None:
    """issue 44: 77 lines on a CPU build and 122 forced, with a last line that did not list
    the red flags. By default: at most 50 lines of at most 80 columns (a path whole on its
    own line excepted), what is active and what it changed, red flags last; --verbose: every
    section, each changed key with its reason and public source."""
    proc = collected(ROCM_AUTOPATCH=mode)
    assert proc.returncode == 0, proc.stderr
    shown = text(proc)
    lines = shown.splitlines()
    assert len(lines) <= 50, shown
    # Past 80 columns only a path kept whole on its own line (a path is never split): the
    # venv of a checkout at a deep path (CI's) makes the install paths longer than that.
    wide = [line for line in lines if len(line) > 80]
    assert all(line.strip().startswith("/") and " " not in line.strip() for line in wide), wide
    assert "Traceback" not in proc.stdout + proc.stderr + shown
    assert "\x1b[" not in shown  # no colour codes
    assert f"      {torch_venv.site}" in lines
    build = torch_venv.torch["build"]
    assert f"torch {torch_venv.torch['version']} ({build}" in shown
    assert lines[-2].startswith("healthy") and "--verbose" in lines[-2] + lines[-1]
    verbose = text(proc, verbose=True)
    vlines = verbose.splitlines()
    assert [line for line in vlines if line in SECTIONS] == SECTIONS
    assert f"    {torch_venv.site}" in vlines
    assert "start-up: .pth runs" in verbose
    said = "activated by: .pth" if mode == "force" else "start-up: .pth"
    assert f"{said} (reached by: .pth, doctor" in verbose
    assert vlines[-1] == "healthy"
    if mode == "force":
        assert lines[0].startswith(f"rocm-autopatch {rocm_autopatch.__version__} doctor: "
                                   "active, profile safe")
        assert "  inductor.triton.cudagraph_trees: True -> False" in lines
        assert "compile_watchdog" in flat(shown.split("What it changed")[1])
        assert "inductor.triton.cudagraph_trees: True -> False, profile, applied" in verbose
        assert "why: the CUDA-graph-trees implementation" in verbose
        # unchanged keys: one line in --verbose, a count by default
        assert "inductor.max_autotune: False -> False" not in verbose
        assert "already as the profile wants (unchanged): " in verbose
        assert "more keys already had the safe value" in shown
    else:  # an inactive process says nothing was applied
        assert "not active" in lines[0] and f"{build} build; nothing changed" in shown
        assert ", applied" not in verbose.split("Configuration")[1]  # no key changed
        for title in ("Configuration (key: before -> after, source, status)",
                      "torch.compile rewrites and fixes"):
            assert vlines[vlines.index(title) + 1].startswith("  nothing applied:"), title
        assert "activated by" not in verbose
        assert "found no ROCm build and applied nothing" in verbose


@pytest.mark.parametrize("broken", ["cache", "watchdog"])
def test_a_promise_it_cannot_keep_is_a_red_flag(
        torch_venv: Venv, collected: Callable[..., subprocess.CompletedProcess],
        tmp_path: Path, broken: str) -> None:
    """issue 44: with a cache directory it cannot write the doctor said healthy (exit 0),
    the failure 81 lines up, and still advised setting the variable that was set."""
    env = {"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_CACHE": "/proc/nope"}
    if broken == "watchdog":  # a watchdog that cannot start its thread
        env = {"ROCM_AUTOPATCH": "force", "PYTHONPATH": str(tmp_path)}
        (tmp_path / "sitecustomize.py").write_text(
            "import threading\n"
            "class NoThread(threading.Timer):\n"
            "    def start(self):\n"
            "        raise RuntimeError('can\\'t start new thread')\n"
            "threading.Timer = NoThread\n")
    proc = collected(**env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = text(proc).splitlines()
    flags = lines[lines.index(next(ln for ln in lines if ln.startswith("Red flags"))):]
    name = "compile_cache" if broken == "cache" else "compile_watchdog"
    assert any(ln.startswith(f"  ! {name} failed: ") for ln in flags), lines
    verbose = text(proc, verbose=True)
    # The program still compiles, and runs (the broken promise costs it nothing).
    ran = torch_venv.run("import torch; print(float(torch.compile(lambda x: x * 2)"
                         "(torch.ones(2)).sum()))", env=env)
    assert ran.returncode == 0 and ran.stdout.strip() == "4.0", ran.stderr[-2000:]
    if broken == "cache":
        assert "ROCM_AUTOPATCH_CACHE is set but could not be used" in flat(verbose)
        assert "ROCM_AUTOPATCH_CACHE=DIR keeps them" not in flat(verbose)


def test_long_install_paths_are_printed_whole(torch_venv: Venv, tmp_path: Path) -> None:
    """A venv deeper than 80 columns (CI's was): its paths stay copyable, the rest still fits."""
    deep = tmp_path / ("d" * 90) / "venv"
    deep.parent.mkdir()
    deep.symlink_to(torch_venv.path)
    proc = subprocess.run([str(deep / "bin" / "python"), "-m", "rocm_autopatch", "doctor"],
                          capture_output=True, text=True, env=clean_env(), timeout=600,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    site = f"      {deep / torch_venv.site.relative_to(torch_venv.path)}"
    lines = proc.stdout.splitlines()
    assert site in lines and len(site) > 80
    assert max(len(line) for line in lines if line != site) <= 80


def test_json_schema(torch_venv: Venv,
                     collected: Callable[..., subprocess.CompletedProcess]) -> None:
    proc = collected(ROCM_AUTOPATCH="force")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= {"install", "python", "report", "gpus", "environment", "left_out",
                         "healthy"}
    inst = data["install"]
    assert set(inst) == {"distributions", "duplicate", "site_processed", "autoload",
                         "started_before_doctor", "will_run", "activation", "mode"}
    assert inst["will_run"] and inst["started_before_doctor"] and not inst["duplicate"]
    assert inst["mode"] == "force"
    (dist,) = inst["distributions"]
    assert dist["location"] == str(torch_venv.site) and dist["in_use"] and not dist["editable"]
    assert dist["installer"] == "pip" and dist["version"] == rocm_autopatch.__version__
    assert dist["startup_files"]["rocm_autopatch.pth"] == {
        "path": str(torch_venv.site / "rocm_autopatch.pth"), "exists": True, "runs": True}
    assert dist["entry_points"] == ["rocm_autopatch = _rocm_autopatch_start:autoload"]
    # The .pth ran at start-up; the doctor's own start() and torch's autoload found it there.
    assert inst["activation"] == {"via": ".pth", "reached": [
        ".pth", "doctor", "torch.backends entry point"]}
    report = data["report"]
    assert report["active"] is True and report["forced"]
    assert report["platform"] == torch_venv.torch["build"]
    assert {c["key"] for c in report["config"]} == safe_keys()
    for entry in report["config"]:
        assert set(entry) >= {"key", "before", "after", "source", "status", "reason",
                              "why", "ref"}
        assert entry["status"] in ("applied", "unchanged", "skipped", "failed")
        assert entry["why"] and entry["ref"]  # every rule says why, with its evidence
        assert "seed" not in entry["why"] + entry["ref"] and "FINDINGS" not in entry["ref"]
    assert set(report["fixes"]) == {"compile_guard", "compile_watchdog", "capture_policy",
                                    "capture_rng", "capture_error", "numerics_sentinel",
                                    "triton_pingpong"}
    assert report["fixes"]["triton_pingpong"]["status"] == "not needed"  # no AMD GPU here
    assert {k["status"] for k in data["known_issues"]} == {"not needed"}
    assert report["fixes"]["numerics_sentinel"]["status"] == "off"
    assert data["tunableop"]["status"] == "off"  # safe
    assert {"HSA_NO_SCRATCH_RECLAIM", "TORCH_BLAS_PREFER_HIPBLASLT"} <= set(data["left_out"])
    assert all(fix.get("ref") for name, fix in report["fixes"].items()
               if name != "compile_watchdog")
    assert data["gpus"] == [] and data["healthy"] is True
    # What this torch offers to skip Dynamo on a warm start, looked up on it (torch 2.13:
    # both), each with why it is not used
    has = torch_venv.run("import importlib.util, torch._dynamo.config as c; print("
                         "hasattr(c, 'caching_precompile'), "
                         "importlib.util.find_spec('torch._dynamo.aot_compile') is not None)")
    expected = {name for name, present in zip(("caching_precompile", "aot_compile"),
                                              has.stdout.split()) if present == "True"}
    skipping = data["caches"]["skipping_dynamo"]
    assert set(skipping) == expected and all("not used" in why for why in skipping.values())


def test_profile_perf_shows_perf_without_touching_other_processes(torch_venv: Venv) -> None:
    data = json.loads(doctor(torch_venv, "--json", "--profile", "perf",
                             env={"ROCM_AUTOPATCH": "force"}).stdout)
    keys = {c["key"] for c in data["report"]["config"]}
    assert data["report"]["profile"] == "perf"
    assert keys == {s.key for s in profiles.PROFILES["perf"]}
    assert keys > safe_keys()
    # TunableOp: perf's, but only with a directory to keep its results in
    assert data["tunableop"]["status"] == "skipped"
    assert "ROCM_AUTOPATCH_CACHE" in data["tunableop"]["reason"]
    assert {k["status"] for k in data["known_issues"]} == {"not needed"}  # no AMD GPU here
    # Nothing global: a program run afterwards still gets the default profile.
    after = torch_venv.json("import json, torch._inductor.config as ic, rocm_autopatch; "
                            "print(json.dumps(rocm_autopatch.report().profile))",
                            env={"ROCM_AUTOPATCH": "force"})
    assert after == "safe"


def test_red_flag_on_rocm_with_the_package_off_exits_1(
        collected: Callable[..., subprocess.CompletedProcess]) -> None:
    """STAND-IN ROCm torch (no ROCm build here): ROCM_AUTOPATCH=0 leaves autotuning on."""
    proc = collected(ROCM_AUTOPATCH="0", TORCHINDUCTOR_MAX_AUTOTUNE="1", PYTHONPATH=STANDIN)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    shown = text(proc)
    assert "! TORCHINDUCTOR_MAX_AUTOTUNE=1" in shown
    assert "fix: unset" in shown and "(rocm, HIP" in shown
    assert any(line.startswith("Red flags (") for line in shown.splitlines())
    assert "Traceback" not in proc.stdout + proc.stderr + shown
    data = json.loads(proc.stdout)
    assert data["healthy"] is False
    assert [r["flag"] for r in data["environment"] if r["name"] == "TORCHINDUCTOR_MAX_AUTOTUNE"
            ] == ["red"]
    if not data["gpus"]:  # this machine: a ROCm build (the stand-in) and no AMD GPU
        assert any("without an AMD GPU" in note for note in data["notes"])
        assert "! a ROCm build of torch on a machine without an AMD GPU" in shown


def test_red_flag_neutralised_by_the_package(torch_venv: Venv) -> None:
    proc = doctor(torch_venv, env={"ROCM_AUTOPATCH": "force", "TORCHINDUCTOR_MAX_AUTOTUNE": "1"})
    assert proc.returncode == 0, proc.stdout
    assert "~ TORCHINDUCTOR_MAX_AUTOTUNE=1" in proc.stdout
    assert "overridden by rocm-autopatch" in proc.stdout


def test_red_flag_kept_by_a_user_override_exits_1(torch_venv: Venv) -> None:
    proc = doctor(torch_venv, env={"ROCM_AUTOPATCH": "force", "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
                                   "INDUCTOR_MAX_AUTOTUNE": "1"})
    assert proc.returncode == 1
    assert "! TORCHINDUCTOR_MAX_AUTOTUNE=1" in proc.stdout


def test_not_a_red_flag_on_a_cpu_build(torch_venv: Venv) -> None:
    proc = doctor(torch_venv, env={"ROCM_AUTOPATCH": "0", "TORCHINDUCTOR_MAX_AUTOTUNE": "1"})
    assert proc.returncode == 0
    assert "turned off by ROCM_AUTOPATCH=0" in proc.stdout


def test_gpu_arch_from_a_fake_kfd_topology(
        collected: Callable[..., subprocess.CompletedProcess], tmp_path: Path) -> None:
    for node, version in (("0", 0), ("1", 90402), ("2", 90010), ("3", 120001)):
        (tmp_path / node).mkdir()
        (tmp_path / node / "properties").write_text(
            f"cpu_cores_count 0\ngfx_target_version {version}\nsimd_count 304\n")
    (tmp_path / "4").mkdir()  # a node without properties is skipped, not an error
    proc = collected(ROCM_AUTOPATCH_KFD_TOPOLOGY=str(tmp_path))
    assert proc.returncode == 0
    assert ("GPUs (KFD): gfx942 (MI300X/MI300A/MI325X), gfx90a (MI210/MI250/MI250X), "
            "gfx1201 (unknown)") in text(proc, verbose=True).replace("\n     ", "")
    data = json.loads(proc.stdout)
    assert [g["arch"] for g in data["gpus"]] == ["gfx942", "gfx90a", "gfx1201"]


def test_usage_errors_exit_2(torch_venv: Venv) -> None:
    script = str(torch_venv.path / "bin" / "rocm-autopatch")
    for args in ([], ["nonsense"], ["doctor", "--profile", "fast"], ["run"]):
        proc = subprocess.run([script, *args], capture_output=True, text=True, env=clean_env())
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_module_form_matches_console_script(torch_venv: Venv) -> None:
    proc = subprocess.run([torch_venv.python, "-m", "rocm_autopatch", "doctor", "--json"],
                          capture_output=True, text=True, env=clean_env(), cwd=str(torch_venv.path))
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["install"]["will_run"] is True


def test_allowed_cudagraphs_are_kept_as_torch_makes_them_and_said_so(
        collected: Callable[..., subprocess.CompletedProcess]) -> None:
    proc = collected(ROCM_AUTOPATCH="force", ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS="1",
                     TORCHINDUCTOR_CUDAGRAPHS="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the user's choice: no red flag
    data = json.loads(proc.stdout)
    config = {c["key"]: c for c in data["report"]["config"]}
    for key in ("inductor.triton.cudagraphs", "inductor.triton.cudagraph_trees"):
        assert config[key]["status"] == "skipped" and config[key]["after"] is True, key
        assert "torch's own value is kept" in config[key]["reason"]
    guard = data["report"]["fixes"]["compile_guard"]["reason"]
    assert "triton.cudagraph" not in guard.split("truthy options dropped:")[1].split(";")[0]
    assert "kept: CUDA graphs" in guard
    (row,) = [r for r in data["environment"] if r["name"] == "TORCHINDUCTOR_CUDAGRAPHS"]
    assert row["flag"] == "kept"
    assert "= TORCHINDUCTOR_CUDAGRAPHS=1" in text(proc)


def test_safe_keeps_template_gemm_backends_flydsl_included_out(
        torch_venv: Venv, collected: Callable[..., subprocess.CompletedProcess]) -> None:
    """An image that lists FlyDSL (torch 2.15's ROCm GEMM backend, used only when listed
    in max_autotune_gemm_backends with autotuning on) and turns autotuning on."""
    env = {"ROCM_AUTOPATCH": "force", "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
           "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "ATEN,TRITON,FLYDSL"}
    for hatch in ({}, {"INDUCTOR_MAX_AUTOTUNE": "1"}):  # tuning kept: backends still ATen
        data = json.loads(collected(**env, **hatch).stdout)
        gemm = data["gemm_backends"]
        assert gemm["listed"] == ["ATEN"] and gemm["templates_used"] == []
        assert gemm["flydsl_candidate"] is False
        assert gemm["flydsl_in_this_torch"] == (torch_venv.torch["release"] >= (2, 15))
    assert "GEMM backends listed: ATEN; GEMMs run on ATen (no autotuning)" in text(
        collected(**env), verbose=True)
    plain = json.loads(collected(**{**env, "ROCM_AUTOPATCH": "0"}).stdout)
    assert "FLYDSL" in plain["gemm_backends"]["listed"]  # without us, torch would list it


@pytest.mark.fast
def test_a_rocm_build_without_an_amd_gpu_is_said() -> None:
    from rocm_autopatch.cli import doctor as doctor_module

    assert doctor_module.notes({"platform": "rocm"}, []) and \
        "without an AMD GPU" in doctor_module.notes({"platform": "rocm"}, [])[0]
    assert doctor_module.notes({"platform": "rocm"}, [{"arch": "gfx942"}]) == []
    assert doctor_module.notes({"platform": "cpu"}, []) == []
