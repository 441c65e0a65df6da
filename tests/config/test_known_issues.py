"""Known issues of the AMD stack (issue 45), judged against a Triton, ROCm and GPU that the
tests fake (no AMD GPU here): in this process for the judgement, and through the installed
wheel for what is set in the environment before Inductor's compile workers start and what
the doctor flags. A fake Triton is a dist-info with no package (torch sees no Triton); a
fake GPU a KFD topology (``ROCM_AUTOPATCH_KFD_TOPOLOGY``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from conftest import Venv, doctor

from rocm_autopatch.config import known_issues

SEVERITY = ("not needed", "kept off", "red")


def _status(triton: Optional[str], archs: List[str], hip: Optional[str] = None,
            templates: bool = False, environ: Optional[Dict[str, str]] = None
            ) -> Dict[str, str]:
    """Each issue's status by name (Triton pipelining is two reports: the most severe)."""
    found = known_issues.judge(triton, hip, archs, templates, environ or {})
    assert all(row["ref"] and row["what"] for row in found)
    out: Dict[str, str] = {}
    for row in found:
        out[row["name"]] = max(out.get(row["name"], "not needed"), row["status"],
                               key=SEVERITY.index)
    return out


@pytest.mark.fast
@pytest.mark.parametrize("triton, templates, environ, status", [
    ("3.8.0", True, {}, "red"),  # the race, Inductor's templates autotuned
    ("3.5.1+rocm7.1.0.git123", True, {}, "red"),
    ("3.8.0", False, {}, "kept off"),  # GEMMs on ATen (both profiles)
    ("3.8.0", True, {"TRITON_HIP_USE_BLOCK_PINGPONG": "0"}, "kept off"),
    ("3.9.0", True, {}, "not needed"),  # fixed after 3.8.0 (triton PR 11765)
    ("3.2.0", True, {}, "not needed"),  # before pingpong was on by default
    (None, True, {}, "not needed"),
])
def test_the_gfx942_pingpong_race_by_triton_templates_and_variable(
        triton: Optional[str], templates: bool, environ: Dict[str, str], status: str) -> None:
    assert _status(triton, ["gfx942"], templates=templates,
                   environ=environ)["Triton block pingpong"] == status
    assert _status(triton, ["gfx950"], templates=templates,
                   environ=environ)["Triton block pingpong"] == "not needed"


@pytest.mark.fast
def test_library_issues_by_rocm_architecture_and_tf32() -> None:
    split_k = "hipBLASLt bf16 split-K"
    assert _status("3.8.0", ["gfx950"], hip="7.13.26183-abc")[split_k] == "red"
    assert _status("3.8.0", ["gfx950"], hip="7.12.60610")[split_k] == "red"
    assert _status("3.8.0", ["gfx950"], hip="7.2.53211")[split_k] == "not needed"
    assert _status("3.8.0", ["gfx942"], hip="7.13.26183")[split_k] == "not needed"
    tf32 = "hipBLASLt TF32 NT"
    assert _status(None, ["gfx950"])[tf32] == "kept off"
    assert _status(None, ["gfx950"], environ={"HIPBLASLT_ALLOW_TF32": "1"})[tf32] == "red"
    assert _status(None, ["gfx942"], environ={"HIPBLASLT_ALLOW_TF32": "1"})[tf32] == \
        "not needed"
    nan = "gfx950 bf16 NaN"
    assert _status("3.8.0+git3bb23dde", ["gfx950"])[nan] == "red"  # a development build
    assert _status("3.8.0", ["gfx950"])[nan] == "not needed"  # the release has the fix
    assert _status("3.7.1", ["gfx950"])[nan] == "not needed"
    pipelining = "Triton pipelining"
    assert _status("3.7.0+amd.rocm7.0.0.git89002410", ["gfx950"], templates=True
                   )[pipelining] == "red"
    assert _status("3.7.0", ["gfx950"])[pipelining] == "kept off"


def _fake(tmp_path: Path, arch_version: int, triton: str) -> Dict[str, str]:
    """A KFD topology with one GPU, and a Triton that torch cannot import."""
    node = tmp_path / "kfd" / "1"
    node.mkdir(parents=True)
    node.joinpath("properties").write_text(f"gfx_target_version {arch_version}\n")
    dist = tmp_path / "site" / f"triton-{triton}.dist-info"
    dist.mkdir(parents=True)
    dist.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: triton\n"
                                         f"Version: {triton}\n")
    return {"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_KFD_TOPOLOGY": str(tmp_path / "kfd"),
            "PYTHONPATH": str(tmp_path / "site")}


PROBE = """
import json, os, torch._inductor.config, rocm_autopatch
r = rocm_autopatch.report()
print(json.dumps({"var": os.environ.get("TRITON_HIP_USE_BLOCK_PINGPONG"),
                  "fix": r.fixes.get("triton_pingpong"), "warnings": r.warnings}))
"""
TEMPLATES = {"INDUCTOR_MAX_AUTOTUNE": "1", "INDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "ATEN,TRITON"}


def test_pingpong_is_turned_off_before_the_workers_start_only_where_it_can_bite(
        torch_venv: Venv, tmp_path: Path) -> None:
    """On gfx942 with Triton 3.8.0: set where a user keeps Triton GEMM templates autotuned
    (before any compile: at Inductor's config import), not where GEMMs stay on ATen (the
    profiles), never over the user's own value (then a red flag); never on Triton 3.9."""
    env = _fake(tmp_path, 90402, "3.8.0")
    kept = torch_venv.json(PROBE, env={**env, **TEMPLATES})
    assert kept["var"] == "0" and kept["fix"]["status"] == "applied"
    assert any("TRITON_HIP_USE_BLOCK_PINGPONG=0 set" in w for w in kept["warnings"])
    profile = torch_venv.json(PROBE, env=env)
    assert profile["var"] is None and profile["fix"]["status"] == "not needed"
    assert "GEMMs run on ATen" in profile["fix"]["reason"]
    users = torch_venv.json(PROBE, env={**env, **TEMPLATES, "TRITON_HIP_USE_BLOCK_PINGPONG": "1"})
    assert users["var"] == "1" and users["fix"]["status"] == "skipped"
    flagged = doctor(torch_venv, env={**env, **TEMPLATES, "TRITON_HIP_USE_BLOCK_PINGPONG": "1"})
    assert flagged.returncode == 1 and "! Triton block pingpong: " in flagged.stdout
    fixed = _fake(tmp_path / "later", 90402, "3.9.0")
    assert torch_venv.json(PROBE, env={**fixed, **TEMPLATES})["var"] is None


def test_the_doctor_flags_tf32_on_gfx950_and_lists_every_issue_it_judged(
        torch_venv: Venv, tmp_path: Path) -> None:
    env = _fake(tmp_path, 90500, "3.8.0")
    plain = doctor(torch_venv, "--json", env=env)
    assert plain.returncode == 0, plain.stdout[-2000:]
    names = {row["name"] for row in json.loads(plain.stdout)["known_issues"]}
    assert names == {issue.name for issue in known_issues.ISSUES}
    tf32 = doctor(torch_venv, env={**env, "HIPBLASLT_ALLOW_TF32": "1"})
    assert tf32.returncode == 1
    assert "! hipBLASLt TF32 NT: gfx950" in tf32.stdout
    assert "ROCm/rocm-libraries#12226" in tf32.stdout
