"""The capture fix on torch 2.13 (CPU): where it is installed, and what it does in capture.

A CPU has no graph capture, so "capturing" is reproduced with named STAND-INS for
``torch.cuda.is_current_stream_capturing``/``get_rng_state``/``set_rng_state`` that behave
as a capturing pre-2.10 build does (scripts/capture_repro.py). The real GPU run is
tests/gpu/gpu_checks.py (TESTING.md).
"""

from __future__ import annotations

import json
import types

import pytest
from conftest import ROOT, Venv

from rocm_autopatch import capture_fix

INSTALLED = """
import json, torch, torch._dynamo.convert_frame as cf, rocm_autopatch
f = torch.compile(lambda x: torch.cos(x) + x)   # Dynamo's own global-state check runs here
x = torch.randn(8)
ok = bool(torch.allclose(f(x), torch.cos(x) + x))
r = rocm_autopatch.report()
print(json.dumps({"ok": ok, "marked": getattr(cf._compile, "_rocm_autopatch", False),
                  "fixes": r.fixes, "errors": r.errors}))
"""


def test_fix_is_installed_on_the_real_convert_frame_and_compiles_pass(torch_venv: Venv) -> None:
    out = torch_venv.json(INSTALLED, env={"ROCM_AUTOPATCH": "force"})
    assert out["ok"] is True and out["marked"] is True and out["errors"] == []
    assert out["fixes"]["capture_rng"]["status"] == "not needed"  # 2.13 >= 2.10
    assert "PR 162505" in out["fixes"]["capture_rng"]["reason"]
    assert out["fixes"]["capture_error"]["status"] == "applied"


def test_not_installed_without_force_on_a_cpu_build(torch_venv: Venv) -> None:
    out = torch_venv.json(INSTALLED)
    assert out["ok"] is True and out["marked"] is False and out["fixes"] == {}


def test_rng_skipped_only_while_capturing_pre_210_reproduction(torch_venv: Venv) -> None:
    for backend in ("aot_eager", "inductor"):
        proc = torch_venv.run(open(ROOT / "scripts" / "capture_repro.py").read(), backend,
                              env={"ROCM_AUTOPATCH": "force"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.splitlines()[-1])
        assert out["installed_by_hook"] is True
        assert out["outside_capture_with_fix"] == "ok"
        assert out["rng_reads_outside_capture"] >= 1  # outside capture: torch's behaviour
        assert "Cannot call CUDAGeneratorImpl::current_seed" in out["capture_without_fix"]
        assert out["capture_with_fix"] == "ok"


def test_first_compile_inside_capture_gets_a_clear_error(torch_venv: Venv) -> None:
    code = """
import json, torch
torch.cuda.is_available = lambda: True                     # STAND-IN: a device
torch.cuda.is_current_stream_capturing = lambda: True      # STAND-IN: capturing now
torch.cuda.get_rng_state = lambda device="cuda": torch.zeros(16, dtype=torch.uint8)  # 2.10+
torch.cuda.set_rng_state = lambda state, device="cuda": None                        # STAND-IN
def backend(gm, example_inputs):                           # what Inductor's lazy init hits
    raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture "
                       "unless the CPU tensor is pinned.")
f = torch.compile(lambda x: x + 1, backend=backend)
try:
    f(torch.ones(2)); raised = None
except Exception as exc:
    raised = [type(exc).__name__, str(exc)]
print(json.dumps({"raised": raised}))
"""
    patched = torch_venv.json(code, env={"ROCM_AUTOPATCH": "force"})
    name, message = patched["raised"]
    assert name == "CompiledDuringCaptureError"
    assert "for the first time inside CUDA/HIP graph capture" in message
    assert "Warm the compiled function up" in message and "Cannot copy between" in message
    plain = torch_venv.json(code, env={"ROCM_AUTOPATCH": "0"})
    assert plain["raised"][0] != "CompiledDuringCaptureError"


@pytest.mark.parametrize("version, expected", [
    ("2.13.0+cpu", (2, 13)), ("2.11.0a0+git1234", (2, 11)), ("2.9.1+rocm6.4", (2, 9)),
    ("10.2rc1", (10, 2)), ("2", (0, 0)), ("", (0, 0)), ("v2.13", (0, 0)), ("2.x", (0, 0)),
])
def test_torch_version_is_read_from_release_strings(version: str, expected: tuple) -> None:
    """Which builds need the RNG fix is decided from this (the fix is needed below 2.10)."""
    assert capture_fix.torch_version(types.SimpleNamespace(__version__=version)) == expected
