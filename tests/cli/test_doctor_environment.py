"""The doctor and selftest against a user's environment, through the installed wheel
(issue 23): the audit of the user's variables only, a venv without torch, an override's
reason, ``selftest --json`` given a directory or a missing one."""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

from conftest import Venv, clean_env, doctor, flat

FORCE = {"ROCM_AUTOPATCH": "force"}


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


def test_an_override_names_its_variable_as_its_reason(torch_venv: Venv) -> None:
    code = ("import json, torch._inductor.config, rocm_autopatch\n"
            "e = next(c for c in rocm_autopatch.report().config\n"
            "         if c.key == 'inductor.max_autotune')\n"
            "print(json.dumps({'source': e.source, 'why': e.why, 'ref': e.ref}))")
    out = torch_venv.json(code, env={**FORCE, "INDUCTOR_MAX_AUTOTUNE": "1"})
    assert out["source"] == "override" and out["ref"] == ""
    assert out["why"].startswith("set by INDUCTOR_MAX_AUTOTUNE='1' in the environment")
    assert "GEMM autotuning" not in out["why"]
    text = doctor(torch_venv, "--verbose", env={**FORCE, "INDUCTOR_MAX_AUTOTUNE": "1"}).stdout
    assert "why: set by INDUCTOR_MAX_AUTOTUNE='1'" in flat(text)

