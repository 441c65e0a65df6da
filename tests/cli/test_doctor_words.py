"""The doctor's and selftest's words, in this process: the environment audit matches
whole words; the GPU is named once."""

from __future__ import annotations

import pytest

from rocm_autopatch.cli import doctor, selftest

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("name, audited", [
    ("VIRTUAL_ENV_PROMPT", False), ("OMP_NUM_THREADS", True), ("TRITON_CACHE_DIR", True),
    ("TORCHINDUCTOR_MAX_AUTOTUNE", True), ("ROCM_AUTOPATCH_VERIFY", True),
    ("PYTORCH_TUNABLEOP_ENABLED", True), ("COMPOSE_PROJECT", False)])
def test_the_doctor_audits_whole_words(name: str, audited: bool) -> None:
    assert doctor.audited(name) is audited


def test_selftest_names_the_gpu_once() -> None:
    h100 = {"torch": "2.11.0", "cuda": "12.8", "gpu": "NVIDIA H100 80GB HBM3",
            "arch": "NVIDIA H100 80GB HBM3"}
    assert selftest.machine_line(h100).count("H100") == 1
    mi300 = {"torch": "2.11.0", "hip": "7.0", "gpu": "AMD Instinct MI300X", "arch": "gfx942"}
    assert selftest.machine_line(mi300).endswith("GPU: AMD Instinct MI300X (gfx942)")

