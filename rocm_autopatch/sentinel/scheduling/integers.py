"""A graph's small integer inputs (a decode loop's position, its token ids) read at every
call without a synchronisation, so that a position cannot pass a rung of the ladder
between two reads (issue 43, item 2). ``schedule`` decides from what it returns.

On a GPU each call queues one copy of the followed inputs into a slot of pinned host memory
with an event behind it (a ring of ``SLOTS``), and reads the oldest slots whose events have
completed: the values of a call a call or a few later, never waiting. Where every slot is
still in flight (a host far ahead of its device) that call's values are not copied; the
next slot read holds a later call's, which for a growing position is larger. On the CPU
the values are read at once. Larger integer inputs (a prefill's positions, a batch of
labels) stay with ``magnitudes``, read every ``stride``-th call.
"""

from __future__ import annotations

import time
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch

from rocm_autopatch.sentinel.scheduling import magnitudes

FOLLOW_NUMEL = 256  # elements over all followed inputs of a call: one small copy
SLOTS = 4  # copies in flight at once
TIMED = 3  # reads timed before their cost decides whether they go on at every call


class Integers:
    """max |x| of each followed input, per call, read without a synchronisation."""

    def __init__(self, flat: List[Any], integer: Sequence[int]) -> None:
        chosen: List[int] = []
        total = 0
        for i in integer:
            if total + flat[i].numel() <= FOLLOW_NUMEL:
                chosen.append(i)
                total += flat[i].numel()
        self.indices: Tuple[int, ...] = tuple(chosen)
        self.chosen = self.indices  # before keep_growing: all on the ladder
        self.stopped = ""  # why they are no longer followed ("" while they are)
        self.host: Any = None  # pinned [SLOTS, FOLLOW_NUMEL] int64
        self.events: List[Any] = []
        self.views: Dict[Any, Any] = {}  # (slot, shape): a view of the slot
        self.calls = [0] * SLOTS  # the call whose values each slot holds (0: none)
        # the inputs each slot holds and their elements
        self.layout: List[Tuple[Tuple[int, ...], Tuple[int, ...]]] = [((), ())] * SLOTS
        self.next = 0  # the slot the next copy goes to
        self.oldest = 0  # the slot read next
        self.every_call = True  # while it fits the budget (``schedule`` decides)
        self.seconds: Optional[float] = None  # the cheapest read measured
        self.timed = 0  # reads timed since ``seconds`` was last reset
        self.last: Tuple[int, Dict[int, float]] = (0, {})  # the last values read, their call
        self.previous: Tuple[int, Dict[int, float]] = (0, {})  # the read before it
        self.rises = dict.fromkeys(self.indices, 0)  # reads above the one before
        self.falls = dict.fromkeys(self.indices, 0)  # reads below it
        self.still: FrozenSet[int] = frozenset()  # found not to grow: off the ladder
        self.reads = 0  # reads that returned values
        self.carried = False  # the last values returned were an earlier call's, carried on
        self.worked = False  # the last follow copied or read something (its cost counts)
        self.decided = False  # whether keep_growing chose
        # whether ``schedule.gate`` has decided, on ``TIMED`` reads' cost after keep_growing
        # chose, whether the reads fit (until then it asks at every call; waiting for the
        # next multiple of 64 calls, a process read every call 51 times too many: 65 reads,
        # 7.0-9.5 ms, on an H200's host, where 14 do now)
        self.gated = False

    def read(self, flat: List[Any], call: int) -> Tuple[Dict[int, float], float]:
        """The values as they stand at this call, and the seconds the read took. On a GPU
        they are a call or a few old: a value that grew steadily is carried forward by its
        growth per call (``carried``), so that a rung is seen at the call that passes it
        (``schedule`` confirms it with a read at once: a loop that restarted meanwhile
        would be carried past a rung it never reached)."""
        began = time.perf_counter()
        self.worked = False
        at, values = self.follow(flat, call)
        self.carried = bool(values) and at < call
        if values:
            self.reads += 1
            last = self.previous = self.last
            self.last = (at, values)
            for i, v in values.items():
                before = last[1].get(i, v)
                self.rises[i] += v > before
                self.falls[i] += v < before
            if last[0] and at > last[0]:
                values = {i: v + (call - at) * max(v - last[1].get(i, v), 0.0)
                          / (at - last[0]) for i, v in values.items()}
        seconds = time.perf_counter() - began
        if self.worked or values:  # a call whose slots were all in flight did nothing
            self.seconds = min(self.seconds or seconds, seconds)
            self.timed += 1
        return values, seconds

    def restart(self) -> None:
        """Forget the slots and reads of before (reads turned on again after a pause:
        carried forward from calls long past, they would force checks)."""
        self.calls = [0] * SLOTS
        self.next = self.oldest = 0
        self.last = self.previous = (0, {})

    def keep_growing(self) -> None:
        """Keep following only the inputs that grow (a position: up at every read, down
        once per generation), not those that come and go (token ids, labels: each would
        cost its copy at every call, and a check at each rung its largest passes). Once,
        once 9 reads came (a random sequence of 9 passes this test 0.6% of the time)."""
        if self.decided or self.reads < 9:
            return
        self.decided = True
        growing = tuple(i for i in self.indices if self.rises[i] >= 4
                        and 4 * self.falls[i] <= self.rises[i])
        if growing != self.indices:
            self.still = frozenset(self.indices) - set(growing)
            self.indices, self.seconds, self.timed = growing, None, 0  # timed again

    def follow(self, flat: List[Any], call: int) -> Tuple[int, Dict[int, float]]:
        """Queue this call's values; return the latest values that are ready and the call
        they are from (on the CPU, this call's; ``(0, {})`` where none are). A failure (an
        input that changed device or dtype) stops following for this graph; never raised."""
        try:
            tensors = [flat[i] for i in self.indices]
            if not tensors:
                return 0, {}
            if tensors[0].device.type != "cuda":
                return call, dict(zip(self.indices, _now(tensors)))
            ready = self._ready()
            self._queue(tensors, call)
            return ready
        except Exception as exc:  # noqa: BLE001 - following never costs the program its call
            self.indices = ()
            self.stopped = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
            return 0, {}

    def _ready(self) -> Tuple[int, Dict[int, float]]:
        """The slots whose copies have landed, oldest first (one stream: they land in
        order); the latest of them."""
        found: Tuple[int, Dict[int, float]] = (0, {})
        for _ in range(SLOTS):
            slot = self.oldest
            if not self.calls[slot] or not self.events[slot].query():
                break
            indices, sizes = self.layout[slot]
            row = self._target(slot, (sum(sizes),)).tolist()
            values, start = {}, 0
            for i, size in zip(indices, sizes):
                part = row[start:start + size]
                values[i] = float(max(max(part), -min(part)))
                start += size
            found = (self.calls[slot], values)
            self.calls[slot] = 0
            self.oldest = (slot + 1) % SLOTS
            self.worked = True
        return found

    def _queue(self, tensors: List[Any], call: int) -> None:
        slot = self.next
        if self.calls[slot]:  # every slot still in flight: this call is not copied
            return
        if sum(t.numel() for t in tensors) > FOLLOW_NUMEL:  # a larger call: not copied
            return
        if self.host is None:
            self.host = torch.empty((SLOTS, FOLLOW_NUMEL), dtype=torch.int64,
                                    pin_memory=True)
            self.events = [torch.cuda.Event() for _ in range(SLOTS)]
        if len(tensors) == 1:  # a decode step's position: one copy, no other op
            source = tensors[0]
            sizes: Tuple[int, ...] = (source.numel(),)
            self._target(slot, tuple(source.shape)).copy_(source, non_blocking=True)
        else:
            parts = [t.reshape(-1).to(torch.int64) for t in tensors]
            sizes = tuple(p.numel() for p in parts)
            source = torch.cat(parts)
            self._target(slot, (sum(sizes),)).copy_(source, non_blocking=True)
        # on the stream of the inputs' device (a model split over GPUs in one process)
        self.events[slot].record(torch.cuda.current_stream(source.device))
        self.calls[slot], self.layout[slot] = call, (self.indices, sizes)
        self.next = (slot + 1) % SLOTS
        self.worked = True

    def _target(self, slot: int, shape: Tuple[int, ...]) -> Any:
        """The slot's first elements in ``shape``, a view made once (a decode loop's
        position is one element every call: each slicing op is microseconds)."""
        view = self.views.get((slot, shape))
        if view is None:
            numel = 1
            for n in shape:
                numel *= n
            view = self.views[(slot, shape)] = self.host[slot, :numel].view(shape)
        return view


def _now(tensors: List[Any]) -> List[float]:
    """max |x| of each (CPU) tensor, read at once: a one-element input (a decode step's
    position) by ``item``, others as ``magnitudes`` reads them on the host."""
    return [float(abs(t.item())) if t.numel() == 1 else magnitudes._on_host([t])[0]
            for t in tensors]


def followed(flat: List[Any], integer: Sequence[int]) -> Optional[Integers]:
    """An ``Integers`` for the integer inputs small enough to copy at every call (None
    where there are none)."""
    follower = Integers(flat, integer)
    return follower if follower.indices else None


def readers(flat: List[Any], count: int, written: Any
            ) -> Tuple[Optional[Integers], magnitudes.Magnitudes]:
    """What a graph's inputs are followed with: its small integers read every call, and
    the magnitudes of all its watched inputs (``count`` inputs, then what it holds; not
    ``written``)."""
    watch = magnitudes.watched_inputs(flat, count, written)
    integer = magnitudes.integer_inputs(flat, watch)
    return followed(flat, integer), magnitudes.Magnitudes(watch, integer)
