"""When the sentinel checks a graph: which calls, and why (the first calls, a new shape, a
new value regime, a call sampled within the time budget), and what was covered.

The miscompiles AMD users report appear after the first call: at a larger shape
(ROCm/triton#944, a copy kernel wrong past 2^29 elements; ROCm/hipBLASLt#2299, a GEMM that
drops writes past 2 GiB; pytorch#168937, dynamic shapes), at other values
(ROCm/pytorch#3150, NaN for some positions) or with larger activations. So a graph stays
watched for the whole run:

- the first ``ROCM_AUTOPATCH_VERIFY_CALLS`` calls are checked;
- a new concrete shape signature of its dynamic inputs is checked, up to ``SHAPE_CAP``
  signatures; past the cap, a signature whose size class is new (a power of two of bytes
  in any dynamic input, so crossing 2^31 bytes or elements counts) is checked, others
  only within the budget;
- a call whose watched inputs leave the magnitudes checked so far (more than
  ``REGIME_FACTOR`` times the largest checked, or non-finite where no checked call had
  any) is checked. Magnitudes come from one reduction queued with the call, read when the
  device has it (a call or more later on a GPU; never a synchronisation);
- every ``period``-th call is checked while the sampled checks' cost stays within
  ``ROCM_AUTOPATCH_VERIFY_BUDGET`` of the graph's own time. ``period`` is a power of two
  made from the costs measured at the checks; calls are chosen by their number, never by a
  random draw or the clock.

What decides is the call's number, its inputs' shapes and values and the costs measured;
nothing random. Graphs that communicate are never re-run (``hook``), so a rank that checks
a call another rank does not cannot pair collectives wrongly.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

FIRST, SHAPE, VALUES, SAMPLED = "first", "shape", "values", "sampled"
WHY = (FIRST, SHAPE, VALUES, SAMPLED)
BECAUSE = {FIRST: "one of the first calls checked", SHAPE: "a new shape",
           VALUES: "inputs beyond the magnitudes checked", SAMPLED: "a sampled call"}
LARGE = 2**31  # bytes or elements: where 32-bit offsets overflow (ROCm/hipBLASLt#2299)
SHAPE_CAP = 16  # new shape signatures always checked, per graph
REGIME_FACTOR = 4.0  # "well beyond": two binades above the largest magnitude checked
WATCH_MAX = 16  # inputs whose magnitudes are followed, per graph
WATCH_NUMEL = 2**26  # larger inputs (a KV cache) are not reduced at every call
SEEN_MAX = 1 << 16  # signatures remembered; past that, counted only


def dynamic_inputs(placeholders: List[Any]) -> List[int]:
    """Positions of the inputs whose shape or value the graph was compiled symbolic in (an
    input without Dynamo's metadata counts as dynamic)."""
    found = []
    for i, node in enumerate(placeholders):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor):
            if any(not isinstance(s, int) for s in value.shape):
                found.append(i)
        elif isinstance(value, (torch.SymInt, torch.SymFloat)) or value is None:
            found.append(i)
    return found


def large(values: List[Any]) -> bool:
    """Is any tensor of 2^31 bytes or elements or more?"""
    return any(isinstance(t, torch.Tensor) and (t.numel() >= LARGE or
                                                t.numel() * t.element_size() >= LARGE)
               for t in values)


def _size_class(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return max(x.numel() * x.element_size(), x.numel()).bit_length()
    return 0


class Magnitudes:
    """max |x| of the watched inputs: one queued reduction per call, read when ready.

    On the CPU the values are those of this call. On a GPU they are copied to pinned host
    memory behind an event and read at a later call, once the event has completed; while
    one is in flight no other is queued (the cost stays one small reduction per call)."""

    def __init__(self, watch: List[int]) -> None:
        self.watch = watch
        self.stopped = ""  # why values are no longer followed ("" while they are)
        self.ints: List[bool] = []  # which of the pending values are integer inputs
        self.pending: Optional[Tuple[Any, Any, Tuple[int, ...]]] = None

    def now(self, flat: List[Any]) -> Dict[int, float]:
        """This call's values, waiting for them (a call that is checked synchronises)."""
        try:
            tensors, indices = self._chosen(flat)
            return dict(zip(indices, _to_host(_reduce(tensors), tensors))) if tensors else {}
        except Exception as exc:  # noqa: BLE001 - as in measure
            return self._stop(exc)

    def measure(self, flat: List[Any]) -> Dict[int, float]:
        """Values that are ready: this call's on the CPU, an earlier one's on a GPU. A
        failure (an input that changed device, an op this build lacks) stops following
        values for this graph, and never reaches the program."""
        try:
            return self._measure(flat)
        except Exception as exc:  # noqa: BLE001
            return self._stop(exc)

    def _stop(self, exc: Exception) -> Dict[int, float]:
        self.watch, self.pending = [], None
        self.stopped = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
        return {}

    def _measure(self, flat: List[Any]) -> Dict[int, float]:
        ready: Dict[int, float] = {}
        if self.pending is not None:
            event, host, indices = self.pending
            if not event.query():
                return ready
            ready = dict(zip(indices, _combine(host.tolist(), self.ints)))
            self.pending = None
        tensors, indices = self._chosen(flat)
        if not tensors:
            return ready
        parts = _reduce(tensors)
        if tensors[0].device.type != "cuda":
            return dict(zip(indices, _to_host(parts, tensors)))
        values = torch.cat([p.float() for p in parts])
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.ints = [not t.is_floating_point() for t in tensors]
        self.pending = (event, host, tuple(indices))
        return ready

    def _chosen(self, flat: List[Any]) -> Tuple[List[Any], List[int]]:
        chosen = [(i, flat[i].detach()) for i in self.watch
                  if i < len(flat) and isinstance(flat[i], torch.Tensor)]
        return [t for _, t in chosen], [i for i, _ in chosen]


def _reduce(tensors: List[Any]) -> List[Any]:
    """Device tensors holding max |x| of each tensor: the floating ones' in one foreach
    kernel (in their order), then (min, max) of each integer one."""
    floats = [t for t in tensors if t.is_floating_point()]
    parts = [torch.stack(torch._foreach_norm(floats, float("inf")))] if floats else []
    return parts + [torch.stack(torch.aminmax(t)) for t in tensors
                    if not t.is_floating_point()]


def _combine(values: List[float], ints: List[bool]) -> List[float]:
    """The flat host values of ``_reduce``, back in the tensors' order, one per tensor."""
    floats = iter(values[:sum(not i for i in ints)])
    pairs = iter(values[sum(not i for i in ints):])
    return [max(-next(pairs), next(pairs)) if is_int else next(floats) for is_int in ints]


def _to_host(parts: List[Any], tensors: List[Any]) -> List[float]:
    values: List[float] = []
    for part in parts:
        values += part.tolist()
    return _combine(values, [not t.is_floating_point() for t in tensors])


def watched_inputs(flat: List[Any], count: int, written: Any) -> List[int]:
    """Inputs whose magnitudes are followed: the call's data (not parameters, not what the
    graph writes, such as a cache), numeric, of a size that is cheap to reduce."""
    found: List[int] = []
    device = None
    for i, x in enumerate(flat[:count]):
        if (isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter)
                and (device is None or x.device == device)
                and i not in written and 0 < x.numel() <= WATCH_NUMEL
                and not x.is_complex() and x.dtype != torch.bool and not x.is_sparse):
            found.append(i)
            device = x.device  # one device: one reduction, one copy
        if len(found) == WATCH_MAX:
            break
    return found


class Schedule:
    """One graph's checks: which call is due, what the checks covered, the budget."""

    def __init__(self, first: int, budget: float, dynamic: List[int]) -> None:
        self.first = first
        self.budget = budget
        self.dynamic = dynamic
        self.calls = 0
        self.seen: Set[Any] = set()
        self.shapes_seen = 0
        self.checked_shapes: Set[Any] = set()
        self.checked_classes: Set[Any] = set()
        self.checked_max: Dict[int, float] = {}
        self.checked_non_finite: Set[int] = set()
        self.magnitudes: Optional[Magnitudes] = None  # set once the graph is analysed
        self.because = dict.fromkeys(WHY, 0)
        self.call_seconds: Optional[float] = None  # the fastest compiled call measured
        self.spent = 0.0  # seconds the sampled checks took beyond their compiled call
        self.sampled_overhead: Optional[float] = None
        self.period = 0  # sampled checks: every period-th call (0: none yet)
        self.last_good = 0  # the last call whose check passed
        self.skipped = 0  # checks that were due and could not be run (memory...)
        self.large_output_checked = False  # a checked call had an output >= 2^31

    @property
    def checks(self) -> int:
        return sum(self.because.values())

    # ---- per call -------------------------------------------------------------------

    def signature(self, flat: List[Any]) -> Tuple[Any, ...]:
        return tuple(tuple(flat[i].shape) if isinstance(flat[i], torch.Tensor) else flat[i]
                     for i in self.dynamic if i < len(flat))

    def size_class(self, flat: List[Any]) -> Tuple[int, ...]:
        return tuple(_size_class(flat[i]) for i in self.dynamic if i < len(flat))

    def due(self, flat: List[Any]) -> Optional[str]:
        """Count this call; why it is to be checked, or None."""
        self.calls += 1
        n = self.calls
        new_shape = False
        if self.dynamic:
            signature = self.signature(flat)
            if signature not in self.seen:
                new_shape = True
                self.shapes_seen += 1
                if len(self.seen) < SEEN_MAX:
                    self.seen.add(signature)
        if n <= self.first:
            return FIRST
        if new_shape and (len(self.checked_shapes) < SHAPE_CAP
                          or self.size_class(flat) not in self.checked_classes
                          or self.affordable()):
            return SHAPE
        if self.magnitudes is not None and self._new_regime(self.magnitudes.measure(flat)):
            return VALUES
        if self.period and n % self.period == 0 and self.affordable():
            return SAMPLED
        return None

    def affordable(self) -> bool:
        """Would one more sampled check keep their cost within the budget's share of the
        graph's own time so far?"""
        if self.budget <= 0 or self.call_seconds is None:
            return False
        cost = self.sampled_overhead if self.sampled_overhead is not None else 0.0
        return self.spent + cost <= self.budget * self.calls * self.call_seconds

    def _new_regime(self, values: Dict[int, float]) -> bool:
        for i, value in values.items():
            if not math.isfinite(value):
                if i not in self.checked_non_finite:
                    return True
            elif value > REGIME_FACTOR * self.checked_max.get(i, 0.0):
                return True
        return False

    # ---- after a check ------------------------------------------------------------------

    def checked(self, why: str, flat: List[Any], values: Dict[int, float], passed: bool,
                call_seconds: float, check_seconds: float, outputs: List[Any]) -> None:
        """Record a check that ran: what it covered and what it cost."""
        self.because[why] += 1
        self.large_output_checked = self.large_output_checked or large(outputs)
        if self.dynamic:
            self.checked_shapes.add(self.signature(flat))
            self.checked_classes.add(self.size_class(flat))
        for i, value in values.items():
            if math.isfinite(value):
                self.checked_max[i] = max(self.checked_max.get(i, 0.0), value)
            else:
                self.checked_non_finite.add(i)
        if passed:
            self.last_good = self.calls
        if call_seconds > 0:
            self.call_seconds = min(self.call_seconds or call_seconds, call_seconds)
        overhead = max(check_seconds - call_seconds, 0.0)
        if why == SAMPLED or (why == SHAPE and len(self.checked_shapes) > SHAPE_CAP):
            self.spent += overhead
            self.sampled_overhead = overhead
        if self.budget > 0 and self.call_seconds:
            # A power of two: ranks that measure costs within a factor of two of each
            # other sample the same calls (or one's are a subset of the other's).
            ratio = (self.sampled_overhead or overhead) / (self.budget * self.call_seconds)
            self.period = 1 << max(0, math.ceil(math.log2(max(ratio, 1.0))))

    def coverage(self) -> Dict[str, Any]:
        """What the checks covered, for the report (one graph)."""
        largest = max(self.checked_max.values(), default=None)
        return {
            "calls": self.calls,
            "checked_because": dict(self.because),
            "shapes": {"dynamic": bool(self.dynamic),
                       "seen": self.shapes_seen if self.dynamic else min(self.calls, 1),
                       "checked": len(self.checked_shapes) if self.dynamic
                       else min(sum(self.because.values()), 1)},
            "values": {"largest_checked": largest,
                       "non_finite_checked": bool(self.checked_non_finite),
                       "inputs_followed": len(self.magnitudes.watch) if self.magnitudes
                       else 0,
                       "stopped": self.magnitudes.stopped if self.magnitudes else ""},
            "period": self.period, "budget": self.budget,
            "checks_skipped": self.skipped,
            "large_output_checked": self.large_output_checked,
        }
