"""What a graph's inputs hold, followed call by call without a synchronisation: which inputs
are watched (the call's data, not parameters or state it writes) and their largest
magnitude, read on the host when the device has it. ``schedule`` decides from these.
"""

from __future__ import annotations

import math
from typing import Any, Dict, FrozenSet, List, Tuple

import torch

WATCH_MAX = 16  # inputs whose magnitudes are followed, per graph
WATCH_NUMEL = 2**26  # larger inputs (a KV cache) are not reduced at every call
READ_EVERY = 4  # on a GPU, the running maximum is copied to the host every 4 reductions


class Magnitudes:
    """max |x| of the watched inputs, without a synchronisation.

    On the CPU each call's values are read at once. On a GPU each call queues one
    ``_foreach_norm`` and folds it into a running maximum on the device; every
    ``READ_EVERY`` calls the running maximum is copied to pinned host memory behind an
    event and restarted, and it is read at the first call after the event has completed.
    A value that grows at any call is seen (a maximum forgets nothing), a few calls later."""

    def __init__(self, watch: List[int], integer: Tuple[int, ...] = ()) -> None:
        self.watch = watch
        self.integer = frozenset(integer)  # watched inputs of an integer dtype
        self.followed: FrozenSet[int] = frozenset()  # read at every call (``integers``)
        self.stopped = ""  # why values are no longer followed ("" while they are)
        self.running: Any = None  # the device's running maximum since the last read
        self.folded = 0  # calls folded into it
        self.host: Any = None  # pinned: the last copy queued
        self.event: Any = None
        self.reading: Tuple[int, ...] = ()  # the inputs of the copy in flight
        self.reading_from = 0  # the call the copy in flight was queued at
        self.ready_from = 0  # the call whose values ``measure`` returned last (a maximum
        # over the calls folded since the copy before: a growing value's at that call)
        self.costs: List[float] = []  # the last reads' seconds (``schedule`` sets the stride)

    def now(self, flat: List[Any]) -> Dict[int, float]:
        """This call's values, waiting for them (a call that is checked synchronises)."""
        try:
            tensors, indices = self._chosen(flat)
            return dict(zip(indices, _read_now(tensors))) if tensors else {}
        except Exception as exc:  # noqa: BLE001 - as in measure
            return self._stop(exc)

    def warm(self, flat: List[Any]) -> None:
        """Queue once, at the graph's first check (paid with its compile, not in the
        budget), the reduction ``measure`` queues later on a GPU, on the inputs it will
        reduce first: in a first process on an H100 the first ``measure`` took 3.7-15 ms
        and the next ones 0.16 ms (median), most of a process's 8-20 ms of such reads
        (BENCHMARKS.md). Never waits; a failure is ``measure``'s to meet."""
        try:
            tensors, _ = self._chosen(flat, self.followed)
            if tensors and tensors[0].device.type == "cuda":
                values = _reduce(tensors)
                torch.maximum(values, values, out=values)
        except Exception:  # noqa: BLE001 - a warm-up never reaches the program
            pass

    def measure(self, flat: List[Any], call: int = 0) -> Dict[int, float]:
        """Values that are ready: this call's on the CPU, earlier calls' on a GPU
        (``ready_from`` says which call's, ``call`` numbering this one). A failure (an
        input that changed device, an op this build lacks) stops following values for
        this graph, and never reaches the program."""
        try:
            return self._measure(flat, call)
        except Exception as exc:  # noqa: BLE001
            return self._stop(exc)

    def _stop(self, exc: Exception) -> Dict[int, float]:
        self.watch, self.running, self.reading = [], None, ()
        self.stopped = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
        return {}

    def _measure(self, flat: List[Any], call: int) -> Dict[int, float]:
        tensors, indices = self._chosen(flat, self.followed)
        if not tensors:
            return {}
        if tensors[0].device.type != "cuda":
            self.ready_from = call
            return dict(zip(indices, _read_now(tensors)))
        values = _reduce(tensors)
        ready: Dict[int, float] = {}
        if self.reading and self.event.query():
            ready = dict(zip(self.reading, self.host.tolist()))
            self.reading, self.ready_from = (), self.reading_from
        if self.running is None or self.running.shape != values.shape:
            self.running, self.folded = values, 0
        else:
            torch.maximum(self.running, values, out=self.running)  # NaN stays NaN
        self.folded += 1
        if not self.reading and self.folded >= READ_EVERY:
            if self.host is None or self.host.shape != values.shape:
                self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
                self.event = torch.cuda.Event()
            self.host.copy_(self.running, non_blocking=True)
            self.event.record()
            self.reading, self.running, self.reading_from = tuple(indices), None, call
        return ready

    def _chosen(self, flat: List[Any], skip: FrozenSet[int] = frozenset()
                ) -> Tuple[List[Any], List[int]]:
        chosen = [(i, flat[i].detach()) for i in self.watch
                  if i < len(flat) and isinstance(flat[i], torch.Tensor) and i not in skip]
        return [t for _, t in chosen], [i for i, _ in chosen]


def _read_now(tensors: List[Any]) -> List[float]:
    """max |x| of each tensor, waited for (on a GPU: one reduction, one copy)."""
    if tensors[0].device.type == "cuda":
        return _reduce(tensors).tolist()
    return _on_host(tensors)


def _on_host(tensors: List[Any]) -> List[float]:
    """max |x| of each tensor, read at once: on the CPU one ``aminmax`` per tensor costs a
    fifth of ``_foreach_norm`` (three inputs: 12.6 us against 59 on the 2-core CI machine,
    for graphs of tens of us) and copies nothing; NaN anywhere gives NaN."""
    found = []
    for t in tensors:
        low, high = (float(v) for v in torch.aminmax(t))
        found.append(math.nan if math.isnan(low) or math.isnan(high)
                     else max(abs(low), abs(high)))
    return found


def _reduce(tensors: List[Any]) -> Any:
    """A float32 device tensor: max |x| of each tensor, in one foreach kernel (integer
    inputs are cast first)."""
    inputs = [t if t.is_floating_point() else t.float() for t in tensors]
    try:
        norms = torch._foreach_norm(inputs, float("inf"), dtype=torch.float32)
    except TypeError:  # no dtype argument on this release
        norms = [n.float() for n in torch._foreach_norm(inputs, float("inf"))]
    return torch.stack(norms)


def integer_inputs(flat: List[Any], watch: List[int]) -> Tuple[int, ...]:
    """The watched inputs of an integer dtype (checked at each rung of ``LADDER``)."""
    return tuple(i for i in watch if not flat[i].is_floating_point())


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
