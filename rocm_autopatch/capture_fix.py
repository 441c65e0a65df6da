"""The capture fix: Dynamo compiling while a CUDA/HIP graph is being captured.

Below torch 2.10, a compile saves and restores the CUDA RNG state
(``torch.cuda.get_rng_state()``) in Dynamo's ``preserve_global_state`` and, below 2.10,
also in aot_autograd and Inductor (``_dynamo.utils.preserve_rng_state``); during capture
that raises "Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture".
Seed 002's fix replaces ``convert_frame.preserve_global_state``, which does nothing from
2.9 (``trace_frame`` is decorated at import) and misses the other two (FINDINGS).

This fix wraps ``convert_frame._compile`` (every compile goes through it on 2.1-2.15):
while the current stream is capturing, and only then, the CUDA RNG get/set calls of that
compile are skipped; everything else torch saves and restores is torch's own code,
untouched. Not needed from 2.10 (upstream PR 162505), where it is not installed.

Separately, on every release: a first compile that starts inside capture and fails
with a cryptic capture error is re-raised as a clear one (warm up before capturing).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from types import ModuleType
from typing import Any, Callable, Iterator, Optional, Tuple

from rocm_autopatch import record

FIXED_IN = (2, 10)
FIX = "capture_rng"
CLEAR_ERROR = "capture_error"
_lock = threading.Lock()
CAPTURE_ERRORS = (
    "during CUDA graph capture",
    "during cuda graph capture",
    "operation not permitted when stream is capturing",
    "hipErrorStreamCaptureUnsupported",
    "cudaErrorStreamCaptureUnsupported",
    "hipErrorStreamCaptureInvalidated",
    "cudaErrorStreamCaptureInvalidated",
)

class CompiledDuringCaptureError(RuntimeError):
    """A function was compiled for the first time inside CUDA/HIP graph capture."""


def torch_version(torch: ModuleType) -> Tuple[int, int]:
    """(major, minor) of ``torch.__version__``; (0, 0) when it can't be read."""
    # Not a regex: compiling one costs ~0.1 ms on the import path, half this hook's work.
    major, _, rest = str(getattr(torch, "__version__", "")).partition(".")
    minor = "".join(itertools.takewhile(str.isdecimal, rest))
    return (int(major), int(minor)) if major.isdecimal() and minor else (0, 0)


def _capturing(torch: ModuleType) -> bool:
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - no CUDA/HIP runtime: nothing is capturing
        return False


@contextlib.contextmanager
def rng_untouched(torch: ModuleType) -> Iterator[None]:
    """For one compile inside capture: CUDA RNG state neither read nor written back."""
    cuda = torch.cuda
    real_get, real_set = cuda.get_rng_state, cuda.set_rng_state

    def get_rng_state(device: Any = "cuda") -> Any:
        return torch.empty(0, dtype=torch.uint8)  # stands for "not saved"

    def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
        return None

    cuda.get_rng_state, cuda.set_rng_state = get_rng_state, set_rng_state
    try:
        yield
    finally:
        cuda.get_rng_state, cuda.set_rng_state = real_get, real_set


def _clear_error(exc: BaseException) -> Optional[CompiledDuringCaptureError]:
    text = str(exc)
    if isinstance(exc, CompiledDuringCaptureError) or not any(m in text for m in CAPTURE_ERRORS):
        return None
    if "cannot JIT compile" in text:  # torch 2.14+ says it clearly itself: leave it alone
        return None
    return CompiledDuringCaptureError(
        "torch.compile compiled a function for the first time inside CUDA/HIP graph "
        "capture, which cannot work (compilation copies tensors and reads device state "
        "that capture forbids; on ROCm such steps may even be recorded silently). Warm "
        "the compiled function up by calling it with the same shapes and dtypes before "
        "torch.cuda.graph(...)/CUDAGraph.capture_begin(). Original error: "
        + next(line for line in text.splitlines() if any(m in line for m in CAPTURE_ERRORS))
        .strip()[:300]
    )


def make_wrapper(torch: ModuleType, original: Callable[..., Any], skip_rng: bool) -> Any:
    def _compile(*args: Any, **kwargs: Any) -> Any:
        if not _capturing(torch):
            return original(*args, **kwargs)
        try:
            if skip_rng:
                with rng_untouched(torch):
                    return original(*args, **kwargs)
            return original(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - re-raised, clearer, chained
            clear = _clear_error(exc)
            if clear is None:
                raise
            raise clear from exc

    # Name, doc and __wrapped__ of the original; __module__ stays ours (where the code is).
    functools.update_wrapper(_compile, original, assigned=("__name__", "__qualname__",
                                                           "__doc__"), updated=())
    _compile._rocm_autopatch = True  # type: ignore[attr-defined]
    return _compile


def layout(convert_frame: ModuleType) -> str:
    """Where this torch's preserve_global_state sits (for the record; FINDINGS)."""
    trace_frame = getattr(convert_frame, "trace_frame", None)
    if trace_frame is not None and hasattr(trace_frame, "__wrapped__"):
        return "trace_frame decorated at import (2.9+)"
    if hasattr(convert_frame, "preserve_global_state"):
        return "transform decorated inside _compile (2.2-2.8)"
    return "wrap_convert_context (2.1)"


def install(convert_frame: ModuleType) -> None:
    import torch

    with _lock:
        original = getattr(convert_frame, "_compile", None)
        if original is None or not callable(original):
            for name in (FIX, CLEAR_ERROR):
                record.REPORT.fixes[name] = {
                    "status": record.SKIPPED,
                    "reason": "layout not recognised: torch._dynamo.convert_frame has no "
                              "_compile function; nothing patched"}
            return
        if getattr(original, "_rocm_autopatch", False):
            return
        version = torch_version(torch)
        skip_rng = version < FIXED_IN
        convert_frame._compile = make_wrapper(torch, original, skip_rng)
        where = layout(convert_frame)
        if skip_rng:
            record.REPORT.fixes[FIX] = {
                "status": record.APPLIED,
                "reason": f"torch {torch.__version__} < 2.10 reads the CUDA RNG state in "
                          f"every compile; skipped while capturing ({where}; also covers "
                          "aot_autograd/Inductor's preserve_rng_state)"}
        else:
            record.REPORT.fixes[FIX] = {
                "status": "not needed",
                "reason": f"torch {torch.__version__} >= 2.10 reads/writes the CUDA RNG "
                          "state during capture itself (PR 162505)"}
        record.REPORT.fixes[CLEAR_ERROR] = {
            "status": record.APPLIED,
            "reason": "a first compile inside graph capture fails with a clear error "
                      "that says to warm up before capturing"}
