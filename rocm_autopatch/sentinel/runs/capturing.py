"""Capturing device graphs (CUDA/HIP) on the sentinel's own stream, one per device: the
references (``replay``) and the judge's statistics (``compare``) are captured here, and a
deferred check's work runs on that stream (``deferred``). A capture that fails is undone
as far as torch leaves it undone (``_after_failed_capture``)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, Optional

import torch

from rocm_autopatch import log

_STREAMS: Dict[Any, Any] = {}
_LOCK = threading.Lock()
# Held while work is put on the sentinel's stream (a capture, a deferred replay, its judge):
# another thread's work on a stream that is capturing would end up in the capture.
STREAM_LOCK = threading.RLock()


def capture_into(device_graph: Any, run: Callable[[], Any], device: Any) -> Any:
    """``run()`` captured into ``device_graph`` in a pool of its own; where that fails,
    ``_after_failed_capture``, and the op's own error raised where it raised one."""
    pool = torch.cuda.graph_pool_handle()
    device_graph.capture_begin(pool=pool, capture_error_mode="thread_local")
    failed: Optional[Exception] = None
    try:
        out = run()
    except Exception as exc:  # noqa: BLE001 - the capture is ended first
        failed = exc
    try:
        device_graph.capture_end()
    except Exception as exc:
        _after_failed_capture(device, pool)
        raise (failed or exc) from None
    if failed is not None:
        raise failed
    return out


def _after_failed_capture(device: Any, pool: Any) -> None:
    """Undo what only a ``capture_end`` that succeeds undoes (torch 2.11's
    ``aten/src/ATen/cuda/CUDAGraph.cpp``, ``capture_end``, ``reset``); never raises:
    - the generator stays marked as captured (``CUDAGeneratorImpl.cpp``, ``capture_epilogue``)
      and every random op of the program raised "Offset increment outside graph capture
      encountered unexpectedly" (an H200): one op on a scalar of its own, captured and ended,
      unmarks it, the seed and offset as they were;
    - where ``capture_end`` raised before it stopped routing allocations to the pool (an
      invalidated capture), the pool is never released (``reset``: ``if (capture_ended_)``)
      and what the references allocated stayed reserved: ended and released as
      ``torch.cuda.use_mem_pool`` does (``torch/cuda/memory.py``). Where it raised later,
      ``reset`` releases it (twice would fail torch's assert in a destructor). The pinned
      host allocator's routing (``begin_allocate_to_pool``) is left: it pins nothing here."""
    index = torch.device(device).index or 0
    undo = [("random generator", lambda: _close_rng_capture(device), "random ops may raise")]
    with contextlib.suppress(Exception):  # "not currently recording": ended by capture_end
        (getattr(torch._C, "_cuda_endAllocateToPool", None)  # torch >= 2.8, else 2.1-2.7
         or torch._C._cuda_endAllocateCurrentStreamToPool)(index, pool)
        undo.append(("memory pool", lambda: torch._C._cuda_releasePool(index, pool),
                     "what the references allocated stays reserved"))
    for what, run, then in undo:
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - said, never raised
            log.warn_once(("sentinel", what), (
                f"ROCM_AUTOPATCH_VERIFY: after a failed capture of a graph's references the "
                f"GPU's {what} could not be released ({exc!r}): {then} on this GPU (torch "
                "undoes a capture only after one that succeeded: aten/src/ATen/cuda/"
                "CUDAGraph.cpp, CUDAGraph::reset); ROCM_AUTOPATCH_VERIFY=0 turns it off"))


def _close_rng_capture(device: Any) -> None:  # see _after_failed_capture
    scratch, closing = torch.zeros((), device=device), torch.cuda.CUDAGraph()
    closing.capture_begin(capture_error_mode="thread_local")
    try:
        scratch.add_(1)
    finally:
        closing.capture_end()


def capture_stream(device: Any) -> Any:
    """The one stream this process captures references on, per device (a BLAS handle per
    stream is made once, by the warm-up before the first capture on it)."""
    with _LOCK:
        if device not in _STREAMS:
            _STREAMS[device] = torch.cuda.Stream(device)
        return _STREAMS[device]


@contextlib.contextmanager
def on_stream(device: Any) -> Iterator[Any]:
    """Work put on the sentinel's stream (yielded) behind what the current stream has
    queued, another thread's work kept off it meanwhile; the current stream then waits for
    it (where the work returned without raising)."""
    stream, current = capture_stream(device), torch.cuda.current_stream(device)
    with STREAM_LOCK:
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            yield stream
        current.wait_stream(stream)
