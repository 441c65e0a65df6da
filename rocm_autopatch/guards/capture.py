"""Compiles that start while a CUDA/HIP graph is being captured: the capture policy.

On ROCm, work done while a HIP graph is captured can be recorded silently and replay wrong
(pytorch#185074); a compile's first-use steps fail inside capture (hipBLASLt, ROCm/aiter#4352;
Triton autotuning synchronises, vllm#42070); torch 2.14 refuses any trace during capture
(PR 185410), which breaks scripts that recompiled inside capture before.

The policy (default): a frame that Dynamo is about to compile while the current stream is
capturing is not compiled. That call runs eagerly (ordinary kernels, which capture
safely), one warning per function says so, and the frame compiles normally the next time
it runs outside capture. Code already compiled and still valid is not affected: Dynamo
runs it from its cache without asking to compile. The "run eagerly this once" answer
differs by release (``decline_form``): from the release where ``ConvertFrameReturn`` has
``apply_to_code`` it is ``ConvertFrameReturn(apply_to_code=False)`` (seen in 2.9-2.14);
before (seen in 2.4 and 2.6, where ``_compile`` returns ``Optional[GuardedCode]``)
``None`` marks the code skipped for good,
so the code is un-skipped with ``reset_code`` when the capture ends
(``CUDAGraph.capture_end``).

The sentinel (``ROCM_AUTOPATCH_VERIFY``) asks at each call of a graph it watches whether
the stream captures. ``count_captures`` counts the captures begun through
``torch.cuda.CUDAGraph`` and ``torch.accelerator.Graph`` (the wrappers of their
``capture_begin``/``capture_end`` live here, one pair a class, shared with the legacy form's
hook), so that its quiet calls need not ask the runtime
while none is open (``none_open``).

``ROCM_AUTOPATCH_COMPILE_IN_CAPTURE=1`` restores torch's own behaviour; there the RNG fix
(torch < 2.10: a compile reads the CUDA RNG state, which fails in capture; pytorch#131782,
fixed by PR 162505 in 2.10) and the clear error for a first compile inside capture apply.
"""

from __future__ import annotations

import contextlib
import threading
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from rocm_autopatch import frames, log, patching, record, settings, torch_releases

ENV = settings.COMPILE_IN_CAPTURE
POLICY = "capture_policy"
FIX = "capture_rng"
CLEAR_ERROR = "capture_error"
FIXED_IN = (2, 10)
REF_POLICY = "pytorch#185074, ROCm/aiter#4352, vllm#42070, PR 185410"
REF_RNG = "pytorch#131782, sglang#6033, PR 162505 (fixed in 2.10)"
CAPTURE_ERRORS = (
    "during CUDA graph capture",
    "during cuda graph capture",
    "operation not permitted when stream is capturing",
    "hipErrorStreamCaptureUnsupported",
    "cudaErrorStreamCaptureUnsupported",
    "hipErrorStreamCaptureInvalidated",
    "cudaErrorStreamCaptureInvalidated",
)

_lock = threading.Lock()
_declined_codes: Set[types.CodeType] = set()  # legacy form: un-skipped at capture end


class CompiledDuringCaptureError(RuntimeError):
    """A function was compiled for the first time inside CUDA/HIP graph capture."""


def compile_in_capture() -> bool:
    """``ROCM_AUTOPATCH_COMPILE_IN_CAPTURE``: True gives torch's own behaviour."""
    return log.setting(ENV)


def capturing(torch: types.ModuleType) -> bool:
    """Is the current stream capturing? Never initialises CUDA/HIP. Asked at every call of
    a watched graph: a runtime that is initialised has a device, so ``is_available`` (an
    environment read and a device count) is not asked again."""
    try:
        cuda = torch.cuda
        return bool(cuda.is_initialized() and cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - no CUDA/HIP runtime: nothing is capturing
        return False


# ---- the policy: run eagerly this once -------------------------------------------------

def decline(form: Callable[[], Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """What ``_compile`` returns for a frame reached while capturing (the policy)."""
    label = frames.label(*frames.compiled_frame(args, kwargs))
    code = args[0] if args else kwargs.get("code")
    value = form()
    if value is None and isinstance(code, types.CodeType):
        with _lock:
            _declined_codes.add(code)
    with record.LOCK:
        counts = record.REPORT.eager_in_capture
        counts[label] = counts.get(label, 0) + 1
    log.warn_once(("capture", label),
                  f"{label} was reached for compiling while a CUDA/HIP graph is being "
                  "captured; it runs eagerly this time (compiling inside capture can be "
                  "recorded silently and replay wrong on ROCm: pytorch#185074) and compiles "
                  "the next time it runs outside capture. To capture its compiled kernels, "
                  "warm it up with the same shapes and dtypes before capturing. "
                  f"{ENV}=1 gives torch's own behaviour.")
    return value


def reenable_declined(torch: types.ModuleType) -> None:
    """Legacy form: let the codes declined during the capture that just ended compile again."""
    with _lock:
        codes = list(_declined_codes)
        _declined_codes.clear()
    reset_code = getattr(getattr(torch._dynamo, "eval_frame", None), "reset_code", None)
    for code in codes:
        if reset_code is not None:
            reset_code(code)


# ---- the graph classes' capture_begin and capture_end: one pair of wrappers each --------

_reenable = False  # capture_end re-enables the declined codes (the legacy form)
# The classes whose captures are counted (``count_captures``), each with its capture_begin
# wrapper as installed: ``none_open`` checks the wrapper is still the class's own.
_counted: Tuple[Tuple[type, Any], ...] = ()
# The graphs (by id) whose counted capture is open; None: one under way when the count began.
_open: Dict[Optional[int], int] = {}


def _graph_classes(torch: types.ModuleType) -> List[type]:
    """The classes whose ``capture_begin`` begins a capture from Python: torch.cuda's
    ``CUDAGraph`` (``torch.cuda.graph``, ``make_graphed_callables`` and Inductor's CUDA
    graph trees use it: ``torch/cuda/graphs.py``, ``torch/_inductor/cudagraph_trees.py``)
    and, where the release has it, ``torch.accelerator.Graph`` (2.13: it calls the C++
    capture itself, not torch.cuda's class: ``torch/accelerator/graphs.py``)."""
    found = (getattr(getattr(torch.cuda, "graphs", None), "CUDAGraph", None),
             getattr(getattr(getattr(torch, "accelerator", None), "graphs", None), "Graph",
                     None))
    return [cls for cls in found if isinstance(cls, type)]


def _release(key: Optional[int]) -> None:
    if key not in _open:
        key = None  # an end whose begin was not counted ends the capture under way before
    if key in _open:
        _open[key] -= 1
        if not _open[key]:
            del _open[key]


def _wrap(cls: type, torch: types.ModuleType) -> Optional[Callable[..., Any]]:
    """``cls.capture_begin`` and ``cls.capture_end`` wrapped once (the begin wrapper in place,
    None where either could not be wrapped); each wrapper reads the
    flags above when called, so the policy's hook and the sentinel's count share them. A
    capture is counted from before its begin (no call of it goes uncounted) until its own
    graph's end returns; an end that raises (a capture invalidated, the wrong stream)
    leaves it counted, so the runtime is asked from then on: slower, never wrong."""
    def make_begin(original: Callable[..., Any]) -> Callable[..., Any]:
        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _lock:
                _open[id(self)] = _open.get(id(self), 0) + 1
            try:
                return original(self, *args, **kwargs)
            except BaseException:
                with _lock:
                    _release(id(self))
                raise
        return capture_begin

    def make_end(original: Callable[..., Any]) -> Callable[..., Any]:
        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                value = original(self, *args, **kwargs)
                with _lock:
                    _release(id(self))
                return value
            finally:
                try:
                    if _reenable:
                        reenable_declined(torch)
                except Exception as exc:  # noqa: BLE001 - never break the user's capture
                    log.hook_failed("torch.cuda.graphs", "capture_end re-enable", exc)
        return capture_end

    begin = patching.wrap(cls, "capture_begin", make_begin)
    return begin if patching.wrap(cls, "capture_end", make_end) is not None else None


def install_capture_end_hook(torch: types.ModuleType) -> bool:
    """The legacy form: the codes declined during a capture compile again once it ends
    (``CUDAGraph.capture_end``; releases before ``torch.accelerator.Graph``); idempotent."""
    global _reenable
    classes = _graph_classes(torch)
    if not classes or _wrap(classes[0], torch) is None:
        return False
    _reenable = True
    return True


def count_captures(torch: types.ModuleType) -> bool:
    """Count the captures begun through the graph classes (``_graph_classes``), so that a
    watched graph's quiet call (``sentinel.check``) need not ask the runtime whether its
    stream captures, 7-8 us a call in an H200's decode loop (BENCHMARKS.md), while none
    is open (``none_open``). A capture already under way on this thread's stream when the
    count starts counts as one, ended by the first end of a graph not counted. Idempotent."""
    global _counted
    classes = _graph_classes(torch)
    fresh = not any(patching.ours(cls.__dict__.get("capture_begin")) for cls in classes)
    counted = tuple((cls, _wrap(cls, torch)) for cls in classes)
    if not counted or any(begin is None for _, begin in counted):
        return False
    with _lock:
        if fresh and capturing(torch):  # begun before any begin was counted
            _open[None] = _open.get(None, 0) + 1
        _counted = counted
    return True


def none_open() -> bool:
    """True where captures are counted, none begun through the graph classes is open, and
    our wrappers are still in place (taken out, the count would stop: then this is False
    and the runtime is asked). A capture begun elsewhere (a C++ extension's own) is not
    counted: a call that may do more than count still asks the runtime (``capturing``)."""
    counted = _counted  # asked at every quiet call: a loop, not a generator (1 us less)
    if _open or not counted:
        return False
    for cls, begin in counted:
        if cls.__dict__.get("capture_begin") is not begin:
            return False
    return True


# ---- torch's behaviour (ROCM_AUTOPATCH_COMPILE_IN_CAPTURE=1) ----------------------------

@contextlib.contextmanager
def rng_untouched(torch: types.ModuleType) -> Iterator[None]:
    """For one compile inside capture: CUDA RNG state neither read nor written back."""
    cuda = torch.cuda

    def get_rng_state(device: Any = "cuda") -> Any:
        return torch.empty(0, dtype=torch.uint8)  # stands for "not saved"

    def set_rng_state(new_state: Any, device: Any = "cuda") -> None:
        return None

    with patching.swapped(cuda, "get_rng_state", get_rng_state), \
            patching.swapped(cuda, "set_rng_state", set_rng_state):
        yield


def clear_error(exc: BaseException) -> Optional[CompiledDuringCaptureError]:
    text = str(exc)
    if isinstance(exc, CompiledDuringCaptureError) or not any(m in text for m in CAPTURE_ERRORS):
        return None
    if "cannot JIT compile" in text:  # torch 2.14+ says it clearly itself: leave it alone
        return None
    return CompiledDuringCaptureError(
        "torch.compile compiled a function for the first time inside CUDA/HIP graph "
        "capture, which cannot work (compilation copies tensors and reads device state "
        "that capture forbids; on ROCm such steps may even be recorded silently, "
        "pytorch#185074). Warm the compiled function up by calling it with the same shapes "
        "and dtypes before torch.cuda.graph(...)/CUDAGraph.capture_begin(), or unset "
        f"{ENV} to let rocm-autopatch run such calls eagerly. Original error: "
        + next(line for line in text.splitlines() if any(m in line for m in CAPTURE_ERRORS))
        .strip()[:300]
    )


def compile_inside(torch: types.ModuleType, original: Callable[..., Any], skip_rng: bool,
                   args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """torch's own compile inside capture, with the RNG fix (< 2.10) and the clear error."""
    try:
        if skip_rng:
            with rng_untouched(torch):
                return original(*args, **kwargs)
        return original(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - re-raised, clearer, chained
        clear = clear_error(exc)
        if clear is None:
            raise
        raise clear from exc


def record_fixes(torch: types.ModuleType, convert_frame: types.ModuleType, eager: bool,
                 form: str, skip_rng: bool) -> None:
    if eager:
        record.fix(POLICY, record.APPLIED, "a compile that starts while a graph is being "
                   f"captured runs eagerly instead (torch's form: {form})", REF_POLICY)
        reason = "nothing compiles inside capture under the capture policy"
        record.fix(FIX, record.NOT_NEEDED, reason, REF_RNG)
        record.fix(CLEAR_ERROR, record.NOT_NEEDED, reason, REF_POLICY)
        return
    record.fix(POLICY, record.SKIPPED, f"{ENV}=1: torch's own behaviour inside capture",
               REF_POLICY)
    version = torch.__version__
    if skip_rng:
        layout = torch_releases.rng_layout(convert_frame)
        record.fix(FIX, record.APPLIED, f"torch {version} < 2.10 reads the CUDA RNG state in "
                   f"every compile; skipped while capturing ({layout})", REF_RNG)
    else:
        record.fix(FIX, record.NOT_NEEDED, f"torch {version} >= 2.10 reads/writes the CUDA RNG "
                   "state during capture itself", REF_RNG)
    record.fix(CLEAR_ERROR, record.APPLIED, "a first compile inside graph capture fails with a "
               "clear error that says to warm up before capturing", REF_POLICY)
