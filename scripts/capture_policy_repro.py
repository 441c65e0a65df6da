"""The capture policy on the CPU: what happens to compiles that start inside graph capture.

Run with ROCM_AUTOPATCH=force in a venv that has rocm-autopatch installed (tests, and
scripts/compat.sh on each torch release). A CPU cannot capture, so
``torch.cuda.is_initialized``/``is_available``/``is_current_stream_capturing`` are
STAND-INS that say "capturing" while STATE["capturing"] is set (and the CUDA RNG
get/set that a claimed device makes Dynamo call are STAND-INS too); everything else is the
real torch.compile with the real Inductor. The end of a capture is
``capture.reenable_declined`` (what the wrapped ``CUDAGraph.capture_end`` calls; a
CUDAGraph cannot be made on a CPU). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys

import torch
import torch._dynamo.convert_frame as cf

from rocm_autopatch import record, torch_releases
from rocm_autopatch.guards import capture, compile_frame

STATE = {"capturing": False}
COMPILED = []  # one entry per graph Inductor really compiled: the dtype of its input

try:  # answer "is there a usable Triton device?" truthfully before the stand-in claims one
    from torch.utils._triton import has_triton

    has_triton()
except ImportError:
    pass
torch.cuda.is_initialized = lambda: STATE["capturing"]  # STAND-IN
torch.cuda.is_available = lambda: STATE["capturing"]  # STAND-IN
torch.cuda.get_device_capability = lambda device=None: (0, 0)  # STAND-IN: no Triton GPU
torch.cuda.is_current_stream_capturing = lambda: STATE["capturing"]  # STAND-IN
torch.cuda.get_rng_state = lambda device="cuda": torch.zeros(16, dtype=torch.uint8)  # STAND-IN
torch.cuda.set_rng_state = lambda state, device="cuda": None  # STAND-IN


def counting_inductor(gm, example_inputs):
    from torch._inductor.compile_fx import compile_fx

    COMPILED.append(str(example_inputs[0].dtype).replace("torch.", ""))
    return compile_fx(gm, example_inputs)


def fn(x):
    return torch.sin(x) * 2 + x


def first_use(x):
    return torch.cos(x) - x


def run(f, x, capturing):
    STATE["capturing"] = capturing
    before = len(COMPILED)
    try:
        # atol at float32's resolution: cos(x) - x is 0 near x = 0.739, where one ulp of
        # difference between Inductor's C++ cos and eager's failed allclose's default
        # atol=1e-8 for 4 inputs in 3,000 (CI failed once so); 1e-6 failed none in 6,000.
        ok = bool(torch.allclose(f(x), (fn if f is compiled else first_use)(x), atol=1e-6))
    finally:
        STATE["capturing"] = False
    return {"ok": ok, "compiled": COMPILED[before:]}


def end_of_capture():
    capture.reenable_declined(torch)  # what CUDAGraph.capture_end runs (see docstring)


compiled = torch.compile(fn, backend=counting_inductor)
compiled_first = torch.compile(first_use, backend=counting_inductor)
torch.manual_seed(0)  # the same inputs on every run
f32, f64 = torch.randn(8), torch.randn(8, dtype=torch.float64)
steps = {
    "warm_up": run(compiled, f32, False),
    "same_dtype_in_capture": run(compiled, f32, True),
    "new_dtype_in_capture": run(compiled, f64, True),
    "new_dtype_in_capture_again": run(compiled, f64, True),
}
end_of_capture()
steps["new_dtype_after_capture"] = run(compiled, f64, False)
steps["new_dtype_cached"] = run(compiled, f64, False)
steps["first_call_in_capture"] = run(compiled_first, f32, True)
end_of_capture()
steps["first_fn_after_capture"] = run(compiled_first, f32, False)
wrapper = compile_frame.installed(cf)
print(json.dumps({
    "torch": torch.__version__,
    "mode": sys.argv[1] if len(sys.argv) > 1 else "",
    "installed_by_hook": wrapper is not None,
    "form": torch_releases.decline_form(cf)[0],
    "capture_end_hooked": bool(getattr(torch.cuda.graphs.CUDAGraph.capture_end,
                                       "__rocm_autopatch__", False)),
    "steps": steps,
    "eager_in_capture": record.REPORT.eager_in_capture,
    "fixes": {k: v["status"] for k, v in record.REPORT.fixes.items()},
    "errors": record.REPORT.errors,
}))
