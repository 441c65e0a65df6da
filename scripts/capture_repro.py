"""Capture fix on the CPU: a faithful reproduction of a capturing pre-2.10 GPU build.

Run with ROCM_AUTOPATCH=force in a venv that has rocm-autopatch installed. This is the
path of ``ROCM_AUTOPATCH_COMPILE_IN_CAPTURE=1`` (torch compiles inside capture; by default
the capture policy runs such calls eagerly, see capture_policy_repro.py). The real
``torch.cuda.is_available``/``is_current_stream_capturing``/``get_rng_state``/
``set_rng_state`` are replaced by STAND-INS that behave as a pre-2.10 build does while a
graph is being captured: the RNG calls raise the real error message. A compile is then
run with the fix as installed on torch < 2.10 (``skip_rng=True``) and without it.
Prints one JSON line.
"""

from __future__ import annotations

import json
import sys

import torch
import torch._dynamo.convert_frame as cf

from rocm_autopatch import record, torch_releases
from rocm_autopatch.guards import capture, compile_frame

RNG_ERROR = ("Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture. If you "
             "need this call to be captured, please file an issue.")
STATE = {"capturing": False, "rng_reads": 0}


def is_current_stream_capturing() -> bool:  # STAND-IN
    return STATE["capturing"]


def get_rng_state(device="cuda"):  # STAND-IN: pre-2.10 behaviour
    if STATE["capturing"]:
        raise RuntimeError(RNG_ERROR)
    STATE["rng_reads"] += 1
    return torch.zeros(16, dtype=torch.uint8)


def set_rng_state(state, device="cuda"):  # STAND-IN: pre-2.10 behaviour
    if STATE["capturing"]:
        raise RuntimeError(RNG_ERROR)


# Answer (and cache) "is there a usable Triton device?" with the truth before the stand-in
# claims a device: older releases ask the driver for properties otherwise.
try:
    from torch.utils._triton import has_triton

    has_triton()
except ImportError:
    pass
torch.cuda.is_available = lambda: True
torch.cuda.is_initialized = is_current_stream_capturing  # STAND-IN: initialised while capturing
# Older releases also ask a claimed device what it is; the STAND-IN says "no Triton GPU".
torch.cuda.get_device_capability = lambda device=None: (0, 0)
torch.cuda.is_current_stream_capturing = is_current_stream_capturing
torch.cuda.get_rng_state = get_rng_state
torch.cuda.set_rng_state = set_rng_state

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "aot_eager"
installed = cf._compile
installed_by_hook = compile_frame.installed(cf) is not None
original = getattr(installed, "__wrapped__", installed)


def compile_once(capturing: bool, fixed: bool) -> str:
    torch._dynamo.reset()
    cf._compile = compile_frame.make_wrapper(
        torch, original, eager=False, decline=lambda: None, skip_rng=True, seconds=0) \
        if fixed else original
    STATE["capturing"] = capturing
    try:
        f = torch.compile(lambda x: torch.sin(x) * 2 + x, backend=BACKEND)
        torch.manual_seed(0)  # the same input on every run
        x = torch.randn(8)
        ok = torch.allclose(f(x), torch.sin(x) * 2 + x)
        return "ok" if ok else "wrong result"
    except Exception as exc:  # noqa: BLE001 - the outcome is the result
        lines = [ln for ln in str(exc).splitlines() if "current_seed" in ln] or \
            str(exc).splitlines()[-1:]
        return f"{type(exc).__name__}: {lines[0].strip()[:160]}"
    finally:
        STATE["capturing"] = False


reads_before = STATE["rng_reads"]
outside = compile_once(capturing=False, fixed=True)
reads_outside = STATE["rng_reads"] - reads_before
result = {
    "torch": torch.__version__,
    "installed_by_hook": installed_by_hook,
    "layout": torch_releases.rng_layout(cf),
    "fix": record.REPORT.fixes.get(capture.FIX),
    "outside_capture_with_fix": outside,
    "rng_reads_outside_capture": reads_outside,
    "capture_without_fix": compile_once(capturing=True, fixed=False),
    "capture_with_fix": compile_once(capturing=True, fixed=True),
}
print(json.dumps(result))
