"""The GPU run (tests/gpu/gpu_checks.py) as tests; skipped where no CUDA/HIP device is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.fixture(scope="module")
def results() -> dict:
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_checks.py"))],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_reduce_overhead_makes_no_inductor_cuda_graph(results: dict) -> None:
    assert results["reduce_overhead_patched"]["captures"] == 0
    assert results["reduce_overhead_patched"]["trees_imported"] is False
    assert results["reduce_overhead_patched"]["max_abs_diff"] < 1e-2
    assert results["reduce_overhead_plain"]["captures"] > 0  # without us torch does


def test_manual_capture_and_recompile_in_capture(results: dict) -> None:
    assert results["manual_capture"]["replays"] == 5
    assert results["manual_capture"]["max_abs_diff"] < 1e-2
    assert results["recompile_in_capture"]["ok"] is True


def test_pre_210_rng_failure_and_fix(results: dict) -> None:
    assert "current_seed" in results["old_rng_without_fix"]["error"]
    assert results["old_rng_with_fix"]["ok"] is True


def test_first_compile_in_capture_is_a_clear_error(results: dict) -> None:
    assert results["first_compile_in_capture_patched"]["raised"][0] == \
        "CompiledDuringCaptureError"
    assert "CompiledDuringCaptureError" not in \
        results["first_compile_in_capture_plain"]["raised"]
