"""What the judge reads of each floating value: compiled's and eager's errors against
float64 (in rounding units of the value's dtype), torch's ``allclose`` and RMSEs, computed
on the device for many values at once and read in one transfer per device.

A value's statistics are reductions over its elements; values are laid end to end (one
segment each) and every reduction is one ``index_add_`` or ``scatter_reduce_`` over the
segments, so the number of ops does not grow with the number of values or of their dtypes
and sizes (a value judged alone is reduced as a whole: ``_segmented``). On a GPU each op is
a Python dispatch and a launch: a decode step's logits and
16 written cache regions took two batches of some 85 ops each; laid end to end they take one
of about 60 (the judge 2.8 ms before, 2.0 after, of a 21 ms check on an H100,
BENCHMARKS.md). Where the caller keeps a graph's ``Captures`` (a verdict read later, on a
GPU), a batch laid out as one judged before replays those ops captured as a device graph:
1.2 against 1.7-1.9 ms a verdict in an H200's decode loop (BENCHMARKS.md).
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

import torch

# Values up to this size are laid end to end with others (a decode step's logits, 128,256
# elements for Llama 3's vocabulary, judged in one batch with its 64 cache regions: one
# reduction batch and one transfer, not two)...
BATCH_NUMEL = 1 << 18
BATCH_ELEMENTS = 1 << 20  # ...up to this many elements a batch (its temporaries' bound)


class Value(NamedTuple):
    """A floating value to judge: eager's, compiled's and the float64 reference's."""

    index: int
    r: torch.Tensor
    c: torch.Tensor
    f: Any  # float64 reference (a tensor, or eager's value where there is none)

    def truth(self) -> torch.Tensor:
        return self.f if isinstance(self.f, torch.Tensor) else self.r


class Errors(NamedTuple):
    """What the rules read of one value, in rounding units of its dtype."""

    nonfinite: int  # NaN/inf in compiled where float64 is finite and representable, eager not
    overflow: bool  # an exact value beyond the dtype's largest
    count: int  # elements where all three are finite (the rules' elements)
    worst_c: float  # the worst element's error, compiled and eager
    worst_e: float
    rms_c: float  # RMSE against float64 over eps * the value's RMS
    rms_e: float
    bias_c: float  # mean error times the value's sign
    bias_e: float
    # compiled's error per element (a tensor, 0 outside those elements); from a replayed
    # capture (``Captures``) a view of its buffer, which the next replay overwrites: read it
    # in the judgement it came with
    err_c: Any = None
    close: bool = False  # torch.allclose(eager, compiled) at the criterion's tolerance
    torch_rmse: Tuple[float, float] = (math.nan, math.nan)  # torch's RMSEs: compiled, eager


def statistics(values: List[Value], tol: float, captures: Optional[Captures] = None
               ) -> Dict[int, Errors]:
    """Each value's statistics, by its index. Values of up to ``BATCH_NUMEL`` elements on
    one device go end to end in batches of up to ``BATCH_ELEMENTS``; larger ones alone
    (a view where it can be, never a copy of a large output). ``captures``: a graph's
    batches judged before, their device work replayed (``Captures``)."""
    batches: List[List[Value]] = []
    filling: Dict[Any, List[Value]] = {}  # by device: the batch being filled
    sizes: Dict[Any, int] = {}  # its elements
    for v in values:
        numel, device = v.c.numel(), v.c.device
        if numel > BATCH_NUMEL:
            batches.append([v])
            continue
        if device not in filling or sizes[device] + numel > BATCH_ELEMENTS:
            filling[device], sizes[device] = [], 0
            batches.append(filling[device])
        filling[device].append(v)
        sizes[device] += numel
    found: Dict[int, Errors] = {}
    judged: List[Tuple[List[Value], torch.Tensor, torch.Tensor]] = []  # op by op
    kept: List[Tuple[Any, List[Value]]] = []
    for batch in batches:
        key = captures.key(batch, tol) if captures is not None else None
        if key is not None and key in captures.made:
            replayed = captures.replayed(key, batch)
            if replayed is not None:
                found.update(replayed)
                continue
        ordered = _ordered(batch)
        judged.append((ordered, *_on_device(ordered, _per_value(ordered), tol)))
        if key is not None:
            kept.append((key, batch))
    found.update(_read(judged))
    for key, batch in kept:  # captured once their op-by-op work (the warm-up) is done
        captures.keep(key, batch, tol)
    return found


def _end_to_end(parts: List[torch.Tensor]) -> torch.Tensor:
    return parts[0].reshape(-1) if len(parts) == 1 else torch.cat([p.reshape(-1)
                                                                   for p in parts])


def _ordered(values: List[Value]) -> List[Value]:
    """The batch's values in the order they are laid out: values of one set of dtypes
    together, so that each run is concatenated once in its dtype."""
    runs: Dict[Any, List[Value]] = {}
    for v in values:
        runs.setdefault(_kind(v), []).append(v)
    return [v for run in runs.values() for v in run]


def _kind(v: Value) -> Tuple[Any, Any, Any]:
    return v.c.dtype, v.r.dtype, v.truth().dtype


def _runs(values: List[Value], tol: float) -> Tuple[torch.Tensor, ...]:
    """The float64, compiled and eager elements of ``values`` (``_ordered``) end to end (as
    float64) with whether eager and compiled are close there (torch's ``allclose``, in
    their own dtype: torch computes it there)."""
    f_parts, c_parts, r_parts, close_parts = [], [], [], []
    for (c_dtype, r_dtype, _), group in itertools.groupby(values, _kind):
        run = list(group)
        f, c, r = (_end_to_end(xs) for xs in ([v.truth() for v in run], [v.c for v in run],
                                              [v.r for v in run]))
        close_parts.append(torch.isclose(r, c, rtol=tol, atol=tol, equal_nan=True)
                           if c_dtype == r_dtype else torch.zeros_like(c, dtype=torch.bool))
        f_parts.append(f.double())
        c_parts.append(c.double())
        r_parts.append(r.double())
    return tuple(_end_to_end(parts) for parts in (f_parts, c_parts, r_parts, close_parts))


def _per_value(values: List[Value]) -> torch.Tensor:
    """Per value: its dtype's rounding unit, smallest normal and largest, and its size (one
    transfer to the device, which does not wait: made on the device from a list, it waited
    for the device's queue, one wait a batch, 63 for a training step's 62 gradients on an
    H200)."""
    infos = [torch.finfo(v.c.dtype) for v in values]
    rows = torch.tensor([[i.eps for i in infos], [i.tiny for i in infos],
                         [i.max for i in infos], [v.c.numel() for v in values]],
                        dtype=torch.float64)
    device = values[0].c.device
    return rows if device.type == "cpu" else rows.pin_memory().to(device, non_blocking=True)


def _read(judged: List[Tuple[List[Value], torch.Tensor, torch.Tensor]]
          ) -> Dict[int, Errors]:
    """The statistics of batches judged op by op (each its values, their rows on the device
    and compiled's error per element), read in one transfer per device: a transfer per
    batch would wait for the device between batches (a training step's 62 gradients judged
    alone, 62 waits, BENCHMARKS.md)."""
    found: Dict[int, Errors] = {}
    by_device: Dict[Any, List[int]] = {}
    for k, (_, rows, _) in enumerate(judged):
        by_device.setdefault(rows.device, []).append(k)
    for ks in by_device.values():
        read = torch.cat([judged[k][1] for k in ks]).tolist()
        start = 0
        for k in ks:
            values, _, err_c = judged[k]
            found.update(_errors(values, read[start:start + len(values)], err_c))
            start += len(values)
    return found


def _on_device(values: List[Value], per_value: torch.Tensor, tol: float
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The batch's statistics as a (values, 12) float64 tensor, and compiled's error per
    element: device work only (no transfer, no size read from the device), so that it can
    be captured as a graph and replayed (``Captures``)."""
    f64, c64, r64, close_el = _runs(values, tol)
    segments = len(values)
    sums, amax, spread = _segmented(segments, per_value, len(f64))
    eps_el, big_el = spread(per_value[0::2])  # (eps, max) per element

    overflow = f64.abs() > big_el  # inf is the right rounding there
    good = torch.isfinite(f64) & ~overflow
    finite_r, finite_c = torch.isfinite(r64), torch.isfinite(c64)
    both = good & finite_r & finite_c
    fv, cv, rv = (torch.where(both, x, 0.0) for x in (f64, c64, r64))
    dc, dr = cv - fv, rv - fv
    (n, squares, nonfinite, sq_c, sq_e, torch_c, torch_e, not_close) = sums(
        both.double(), fv * fv, (~finite_c & good & finite_r).double(), dc * dc, dr * dr,
        # torch's own RMSEs (its ``rmse``: every element, NaN and inf included)
        (c64 - f64) ** 2, (r64 - f64) ** 2, (~close_el).double())
    count = n.clamp(min=1)
    floor = torch.maximum(torch.sqrt(squares / count), per_value[1])  # the value's RMS
    unit = eps_el * torch.maximum(fv.abs(), spread(floor))
    err_c, err_e = dc / unit, dr / unit
    sign = torch.sign(fv)
    bias_c, bias_e = sums(err_c * sign, err_e * sign)
    worst_c, worst_e, overflowed = amax(err_c.abs(), err_e.abs(), overflow.double())
    scale = per_value[0] * floor
    rows = torch.stack([
        nonfinite, overflowed, n, worst_c, worst_e, torch.sqrt(sq_c / count) / scale,
        torch.sqrt(sq_e / count) / scale, bias_c / count, bias_e / count, (not_close == 0).double(),
        torch.sqrt(torch_c / per_value[3]), torch.sqrt(torch_e / per_value[3])], dim=1)
    return rows, err_c


def _segmented(segments: int, per_value: torch.Tensor, numel: int) -> Tuple[Callable, ...]:
    """The batch's per-segment sums and maxima of rows of its elements, and a per-value
    tensor spread to its elements. Several values: one ``index_add_`` or ``scatter_reduce_``
    over the segments (at most ``BATCH_NUMEL`` elements meet at one address). A value alone
    (one larger than ``BATCH_NUMEL``: a weight's gradient) is reduced as a whole: every
    element added atomically into one address serialises on a GPU (a training step's
    gradients, some 480M elements, took seconds a check on an H200, BENCHMARKS.md)."""
    device = per_value.device
    if segments == 1 and numel:
        return ((lambda *rows: torch.stack(rows).sum(1, keepdim=True)),
                (lambda *rows: torch.stack(rows).amax(1, keepdim=True)),
                (lambda x: x[..., 0]))
    seg = torch.repeat_interleave(torch.arange(segments, device=device),
                                  per_value[3].long(), output_size=numel)

    def sums(*rows: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(rows), segments, dtype=torch.float64,
                           device=device).index_add_(1, seg, torch.stack(rows))

    def amax(*rows: torch.Tensor) -> torch.Tensor:  # of values >= 0: 0 for an empty one
        return torch.zeros(len(rows), segments, dtype=torch.float64,
                           device=device).scatter_reduce_(1, seg.expand(len(rows), -1),
                                                          torch.stack(rows), "amax")

    return sums, amax, (lambda x: x[..., seg])


def _errors(values: List[Value], rows: List[List[float]], err_c: torch.Tensor
            ) -> Dict[int, Errors]:
    """Each value's ``Errors`` from its row of the statistics read back."""
    found: Dict[int, Errors] = {}
    start = 0
    for v, row in zip(values, rows):
        size = v.c.numel()
        found[v.index] = Errors(int(row[0]), bool(row[1]), int(row[2]), *row[3:9],
                                err_c=err_c[start:start + size], close=bool(row[9]),
                                torch_rmse=(row[10], row[11]))
        start += size
    return found


# The judge's device work is some 60 small ops a batch, each a Python dispatch and a launch:
# 1.7-1.9 ms of a deferred verdict's 3 ms in an H200's decode loop, none of it waiting on
# the device (BENCHMARKS.md). A batch laid out as one judged before (its values' indices,
# dtypes and shapes) replays that work captured as a device graph: the values copied into
# the capture's buffers in one call, one replay, one transfer.
CAPTURE_NUMEL = 1 << 18  # elements of a batch captured at most (its temporaries ~60 MB)
CAPTURED_LAYOUTS = 2  # layouts captured per graph
# Elements of all the process's captured layouts together: a capture's pool keeps the
# device work's temporaries, some 30 float64 values per element (about 250 MB at most).
CAPTURED_NUMEL_ALL = 1 << 20
_HELD = {"numel": 0}
_HELD_LOCK = threading.Lock()


def _hold(numel: int) -> bool:
    """Room for a layout of ``numel`` elements among the process's captures (taken)?"""
    with _HELD_LOCK:
        if _HELD["numel"] + numel > CAPTURED_NUMEL_ALL:
            return False
        _HELD["numel"] += numel
        return True


def _let_go(numel: int) -> None:  # a captured layout's finalizer
    with _HELD_LOCK:
        _HELD["numel"] -= numel


class Captures:
    """One graph's batches whose device work is captured (on a GPU: ``devices``), by
    layout: a layout at its second batch (one seen once, a prompt's, takes no room; at its
    first where ``expected``), two at most. The first capture or replay that fails ends
    them all for this graph (a reason such as deterministic algorithms or memory holds for
    every layout): judged op by op from then on. ``capture(work, device)`` is the caller's:
    it captures ``work`` as a device graph and returns (that graph, ``work``'s result)."""

    def __init__(self, capture: Callable[[Callable[[], Any], Any], Tuple[Any, Any]],
                 devices: Tuple[str, ...] = ("cuda",)) -> None:
        self.capture, self.devices = capture, devices
        self.made: Dict[Any, _Replayed] = {}
        self.seen: Set[Any] = set()  # layouts judged once (bounded: CAPTURED_LAYOUTS * 8)
        self.why = ""  # why captures ended, in words ("" while they go on)
        # Set by the caller for one verdict whose layouts will be judged again (its shape's
        # references were just captured, at a first check the budget leaves out): the
        # first layout is captured at first sight, not at its second batch (a deferred
        # verdict's capture cost 5.5-6.2 ms against 2.3 a verdict on an H100,
        # BENCHMARKS.md). Only while none is captured: the other stays for a layout seen
        # twice.
        self.expected = False

    def key(self, values: List[Value], tol: float) -> Any:
        """The batch's layout, where it may be captured (None: captures ended, on a CPU,
        or too large)."""
        device = values[0].c.device
        if self.why or device.type not in self.devices or sum(
                v.c.numel() for v in values) > CAPTURE_NUMEL:
            return None
        return tol, device, tuple((v.index, *_kind(v), v.r.shape, v.c.shape, v.truth().shape)
                                  for v in values)

    def keep(self, key: Any, values: List[Value], tol: float) -> None:
        """Capture the device work of ``values`` (just judged op by op: its warm-up) where
        the layout was judged before, room is left and nothing failed. Never raises."""
        if self.why or len(self.made) >= CAPTURED_LAYOUTS:
            return
        if key not in self.seen and not (self.expected and not self.made):
            if len(self.seen) < 8 * CAPTURED_LAYOUTS:
                self.seen.add(key)
            return
        numel = sum(v.c.numel() for v in values)
        if not _hold(numel):
            return
        try:
            made = self.made[key] = _Replayed(_ordered(values), tol, self.capture)
        except Exception as exc:  # noqa: BLE001 - judged op by op, as before
            _let_go(numel)
            self._end(exc)
            return
        weakref.finalize(made, _let_go, numel)

    def replayed(self, key: Any, values: List[Value]) -> Optional[Dict[int, Errors]]:
        """``values``' statistics from the capture of their layout; None where the replay
        failed (then captures end: the caller judges op by op)."""
        try:
            return self.made[key].judge(values)
        except Exception as exc:  # noqa: BLE001 - judged op by op, as before
            self._end(exc)
            return None

    def _end(self, exc: Exception) -> None:
        self.made.clear()
        self.why = f"{type(exc).__name__}: {str(exc).strip()[:160]}"


class _Replayed:
    """One layout's device work, captured over buffers of its own."""

    def __init__(self, values: List[Value], tol: float, capture: Callable[..., Any]) -> None:
        with torch.inference_mode(False):  # buffers a later call may write in any mode
            made = [torch.empty_like(t) for v in values for t in (v.r, v.c, v.truth())]
        self.values = [Value(v.index, *made[3 * k:3 * k + 3]) for k, v in enumerate(values)]
        # Everything the graph reads is held here for as long as it may replay: a buffer
        # freed and reused would be read as it is then (on an H200, a device-side assert).
        self.per_value = _per_value(self.values)
        self.graph, (self.rows, self.err_c) = capture(
            lambda: _on_device(self.values, self.per_value, tol), values[0].c.device)

    def judge(self, values: List[Value]) -> Dict[int, Errors]:
        """``values``' statistics (laid out as the captured ones), by one replay."""
        targets = [t for v in self.values for t in (v.r, v.c, v.f)]
        sources = [t for v in _ordered(values) for t in (v.r, v.c, v.truth())]
        # One mixed list, which torch's CUDA kernel copies a tensor at a time, on purpose: a
        # list per dtype takes its one-launch kernel (0.2 ms less a verdict on an H100), but
        # a process's first replay then took 12 ms more (most likely loading that kernel:
        # CUDA loads a module at its first use), more than a short process's verdicts save
        # (BENCHMARKS.md, "A snapshot's storages, and a copy per dtype tried").
        torch._foreach_copy_(targets, sources)
        self.graph.replay()
        return _errors(self.values, self.rows.tolist(), self.err_c)
