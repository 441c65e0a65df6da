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
  in any dynamic input, or of a dynamic integer's value, so crossing 2^31 bytes or elements
  counts, and a position that doubles) is checked, others only within the budget;
- a call whose watched inputs leave the magnitudes checked so far is checked: a float input
  more than ``REGIME_FACTOR`` times the largest checked, an integer input (a position, a
  cache index) more than ``LADDER`` times it, or non-finite where no checked call had any.
  So a position is checked on rungs 1.25x apart (above ``crossings.floor``), and a bug from
  position p is checked by 1.25p in the generation that first reaches it.
  Small integer inputs (``integers``) are read at every call without a synchronisation
  (one copy to pinned memory, read a call or a few later), so no rung is passed between
  two reads; their cost counts against a quarter of the budget (``VALUES_SHARE``), and
  where it would take more (a graph of microseconds) they are read with the rest.
  Other inputs' magnitudes come from one reduction queued with the call (every
  ``stride``-th call, ``stride`` keeping its cost within that quarter), read when the
  device has it. An integer among them that grows steadily is predicted: the call at
  which it will pass the next rung is computed from its last reads, and that call's
  values are read at once (one synchronisation per predicted crossing);
- every ``period``-th call is checked, ``period`` keeping the sampled checks within the
  rest of the budget less what the wrapper takes at every call (``checks_share``); each
  check a new shape or new values forced stands in for one of them, so that forced and
  sampled checks together keep to it. ``period`` is a power of
  two made from the costs measured at warm checks (one is made ``CALIBRATE_AFTER`` calls
  after the first ones, unless an earlier process's is remembered: ``rungs``); calls are
  chosen by their number, never by a random draw.

The budget (``ROCM_AUTOPATCH_VERIFY_BUDGET``) is a share of the program's wall time, not of
the graph's own: a graph's costs are set against the time the program takes per call of it
(its calls and all else the program does between them, the sentinel's checks and reads
left out), so a graph that is a small part of
the program is followed nearly every call, and one that is the whole loop sparsely. The
graphs share it (``LEDGER``): each graph called past its first calls gets an equal part, so
that the parts add up to the budget whatever the number of graphs.

What decides is the call's number, its inputs' shapes and values and the costs measured;
nothing random. Graphs that communicate are never re-run (``hook``), so a rank that checks
a call another rank does not cannot pair collectives wrongly.
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

from rocm_autopatch.sentinel.scheduling import quiet
from rocm_autopatch.sentinel.scheduling.crossings import (
    Crossings,
    beyond,
    set_floor,
)
from rocm_autopatch.sentinel.scheduling.integers import TIMED, Integers
from rocm_autopatch.sentinel.scheduling.ledger import LEDGER, lower_median
from rocm_autopatch.sentinel.scheduling.magnitudes import Magnitudes

FIRST, SHAPE, VALUES, SAMPLED = "first", "shape", "values", "sampled"
WHY = (FIRST, SHAPE, VALUES, SAMPLED)
BECAUSE = {FIRST: "one of the first calls checked", SHAPE: "a new shape",
           VALUES: "inputs beyond the magnitudes checked", SAMPLED: "a sampled call"}
LARGE = 2**31  # bytes or elements: where 32-bit offsets overflow (ROCm/hipBLASLt#2299)
SHAPE_CAP = 16  # new shape signatures always checked, per graph
REGIME_FACTOR = 4.0  # "well beyond": two binades above the largest magnitude checked
# Following values may take this share of the budget: the reduction runs every ``stride``-th
# call, ``stride`` the power of two that keeps its measured cost within it; sampled checks
# take the rest, less what the wrapper takes at the graph's calls (``check.wrapped``).
VALUES_SHARE = 0.25
# Where the wrapper alone takes the checks' share (a graph of microseconds, or a host that
# dispatches slowly), sampling slows to this part of its rate and no further: a bug that
# neither a shape, a value nor a position brings is still found, at most 4x later. (A
# sixteenth was tried: the CPU corpus's late-range bug was found at call 16,384 instead of
# 1,024, a cost the budget cannot win back where the wrapper alone exceeds it.)
CHECKS_FLOOR = 1 / 4
MIN_VALUES_BUDGET = 0.01  # with a budget of 0 (first calls only) values are still followed
FOLLOW_GATE = 64  # calls between two decisions whether the small integers' reads fit
CALIBRATE_AFTER = 32  # the calls after the first ones at which a warm check is timed
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


def _power_of_two(ratio: float) -> int:
    """The power of two at or above ``ratio`` (1 at least): ranks whose measured costs are
    within a factor of two of each other choose the same calls, or one's are a subset of the
    other's."""
    return 1 << max(0, math.ceil(math.log2(max(ratio, 1.0))))


def large(values: List[Any]) -> bool:
    """Is any tensor of 2^31 bytes or elements or more?"""
    return any(isinstance(t, torch.Tensor) and (t.numel() >= LARGE or
                                                t.numel() * t.element_size() >= LARGE)
               for t in values)


def _size_class(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return max(x.numel() * x.element_size(), x.numel()).bit_length()
    if isinstance(x, int):  # a dynamic integer (a position, a length): its binade
        return abs(x).bit_length()
    return 0


class Schedule:
    """One graph's checks: which call is due, what the checks covered, the budget."""

    def __init__(self, first: int, budget: float, dynamic: List[int]) -> None:
        self.first = first
        self.budget = budget
        self.dynamic = dynamic
        self.calls = self.quiet_calls = 0  # quiet: counted on ``check.call``'s short way
        self.seen: Set[Any] = set()
        self.shapes_seen = 0
        self.checked_shapes: Set[Any] = set()
        self.checked_classes: Set[Any] = set()
        self.checked_max: Dict[int, float] = {}
        self.checked_non_finite: Set[int] = set()
        self.magnitudes: Optional[Magnitudes] = None  # set once the graph is analysed
        self.integers: Optional[Integers] = None  # small integer inputs, read every call
        self.stride = 1  # magnitudes are followed every stride-th call
        self.values_read_stride = 0  # the stride in force at the read that found new ones
        self.measure_seconds: Optional[float] = None
        self.crossings = Crossings()  # steadily growing integers' next crossing
        self.owed = 0  # forced checks not yet stood in for a period's sampled check
        self.because = dict.fromkeys(WHY, 0)
        self.call_seconds: Optional[float] = None  # the fastest compiled call measured
        self.clock: Optional[float] = None  # when the first call after the first ones came
        self.ledger_at_clock = 0.0  # the sentinel's seconds then, all graphs' (``pace``)
        self.spent = 0.0  # seconds its checks after the first calls took beyond the call
        self.wrapper = 0.0  # seconds the wrapper took at its calls (``check.wrapped``)
        self.overheads: List[float] = []  # of the checks, beyond their compiled call
        self.warm: List[float] = []  # the same, of checks after the first calls
        self.uncaptured: List[float] = []  # ...of those that captured nothing (``rungs``)
        self.capturing = False  # this check captures its references (``replay``)
        self.last_uncaptured = False  # the last check was warm and captured nothing
        self.remembered: Optional[float] = None  # a warm check's cost, an earlier process's
        self.sampled_calls: List[int] = []  # the last sampled checks' call numbers
        self.sampled_period = 0  # the period in force at the last sampled check
        self.period = 0  # sampled checks: every period-th call (0: none yet)
        self.last_good = 0  # the last call whose check passed
        self.skipped = 0  # checks that were due and could not be run (memory...)
        self.large_output_checked = False  # a checked call had an output >= 2^31
        self.quiet = 0  # calls before this one have nothing due but counting (``quiet``)

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
        n = self.calls = self.calls + 1
        if n < self.quiet:  # nothing can fall due before (``quiet``; never dynamic graphs)
            return None
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
        if self.clock is None:  # the program's pace is measured from here: warm calls
            self.clock, self.ledger_at_clock = time.perf_counter(), LEDGER.spent
            LEDGER.join()
        if new_shape and (len(self.checked_shapes) < SHAPE_CAP
                          or self.size_class(flat) not in self.checked_classes
                          or affordable(self)):
            return SHAPE
        if self.integers is not None:
            if n % FOLLOW_GATE == 0 or not self.integers.gated and n <= FOLLOW_GATE:
                gate(self)
            if self.integers.every_call:  # has a small integer passed its rung?
                values, seconds = self.integers.read(flat, n)
                LEDGER.spent += seconds
                if values and self.new_regime(values) and (
                        not self.integers.carried or crossed(self, n, flat)):
                    self.values_read_stride = 1
                    return VALUES
        if self.magnitudes is not None and n % self.stride == 0:
            read_every = self.stride  # _costs may change it: the stride this read kept
            began = time.perf_counter()
            values = self.magnitudes.measure(flat, n)
            self._costs(time.perf_counter() - began)
            self.crossings.read(self.magnitudes.ready_from, values, self.magnitudes.integer,
                                self.checked_max)
            if self.new_regime(values):
                self.values_read_stride = read_every
                return VALUES
        if self.crossings.due(n) and crossed(self, n, flat):
            self.values_read_stride = 1
            return VALUES
        if self.budget > 0 and n == self.first + CALIBRATE_AFTER and not self.warm:
            # time a warm check (the first calls' are cold), unless an earlier process did
            if self.remembered is None:
                return self._sample(n, n)
            set_period(self)
        if self.period and n % self.period == 0:
            # The budget allows one check per period: each check a shape or the values
            # forced stands in for one period's sampled check (a decode loop's six position
            # checks in its first 1,024 calls are six periods' worth). Decided by call
            # numbers and counts, as the period's own calls are, never by the clock.
            if not self.owed:
                return self._sample(n, self.period)
            self.owed -= 1
        self.quiet = quiet.until(self, n, FOLLOW_GATE, CALIBRATE_AFTER)
        return None

    def _sample(self, n: int, period: int) -> str:
        self.sampled_calls = (self.sampled_calls + [n])[-8:]
        self.sampled_period = period
        return SAMPLED

    def _costs(self, seconds: float) -> None:
        """The reduction's cost (the lower median of the last eight reads; the cheapest,
        used before, was half a typical read on an H200's host) sets ``stride``, which at
        most doubles per read: a first read that pays one-time costs (pinned memory, kernels
        loaded) would otherwise space the reads for good (2,048 calls on an H200)."""
        self.magnitudes.costs = (self.magnitudes.costs + [seconds])[-8:]
        self.measure_seconds = lower_median(self.magnitudes.costs)
        LEDGER.spent += seconds
        pace = self.pace()
        if pace:
            budget = LEDGER.share(max(self.budget, MIN_VALUES_BUDGET))
            self.stride = min(2 * self.stride, _power_of_two(
                self.measure_seconds / (VALUES_SHARE * budget * pace)))

    def pace(self) -> Optional[float]:
        """The program's wall time per call of this graph since the first calls (the calls
        and all between them but the sentinel's checks and reads, all graphs': a 10 s check
        at call 33 of a 25 ms training step had made it 0.35 s), never less than the fastest
        warm compiled call; before two warm calls, that call's time (None before one)."""
        warm = self.calls - self.first
        if self.clock is None or warm < 2:
            return self.call_seconds
        elapsed = time.perf_counter() - self.clock
        program = elapsed - (LEDGER.spent - self.ledger_at_clock)
        return max((program if program > 0 else elapsed) / warm, self.call_seconds or 0.0)

    def overhead(self) -> float:
        """What a check costs beyond its compiled call: the lower median of the last eight
        warm ones; before one ran, what an earlier process measured, else the first calls'
        (cold: kernels loaded, references built)."""
        return lower_median(self.warm[-8:] or ([self.remembered] if self.remembered else [])
                            or self.overheads[-8:])

    def new_regime(self, values: Dict[int, float]) -> bool:
        integer = self.magnitudes.integer if self.magnitudes is not None else frozenset()
        for i, value in values.items():
            past = beyond(self, i) if i in integer else REGIME_FACTOR * self.checked_max.get(i, 0)
            if not math.isfinite(value):
                if i not in self.checked_non_finite:
                    return True
            elif value > past:
                return True
        return False

    # ---- after a check ------------------------------------------------------------------

    def checked(self, why: str, flat: List[Any], values: Dict[int, float], passed: bool,
                call_seconds: float, check_seconds: float, outputs: List[Any]) -> None:
        """Record a check that ran: what it covered and what it cost."""
        self.because[why] += 1
        self.quiet = 0  # what is due next changed (the period, the crossings, the values)
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
        if call_seconds > 0 and why != FIRST:
            # A first call's time is cold (kernels loaded, workspaces allocated: over 0.1 s
            # for a 1.1B decode step on an H200, 8.6 ms warm); kept, it set the pace, and with
            # every later check deferred (never timed), a period of 8-16 instead of 512.
            self.call_seconds = min(self.call_seconds or call_seconds, call_seconds)
        overhead = max(check_seconds - call_seconds, 0.0)
        self.owed += why in (SHAPE, VALUES)  # stands in for a period's sampled check
        self.overheads = (self.overheads + [overhead])[-8:]
        if why != FIRST:
            self.warm = (self.warm + [overhead])[-8:]
            if not self.capturing:  # a capture is paid once: not what a check costs
                self.uncaptured = (self.uncaptured + [overhead])[-8:]
            self.spent += overhead
            LEDGER.spent += overhead
        self.last_uncaptured, self.capturing = why != FIRST and not self.capturing, False
        set_period(self)
        # the largest checked (and the floor) moved: the next crossing is further on
        self.crossings.plan(self.calls, values, self.checked_max)


def set_period(plan: Schedule) -> None:
    """``plan``'s sampled checks' period, and its ladder's floor, from a check's cost and
    the program's pace."""
    pace = plan.pace()
    if plan.budget > 0 and pace:
        plan.period = _power_of_two(plan.overhead() / (checks_share(plan) * pace))
    set_floor(plan)


def calibrating(plan: Optional[Schedule]) -> bool:
    """Is ``plan``'s check at this call the one that times a warm check (``due``)? Its
    references are not captured then (``replay``): the capture would be timed as a warm
    check's cost and paid inside the budget, 88 of a 393 ms check at call 33 of an H200's
    training loop, where the next check may be thousands of calls away (BENCHMARKS.md)."""
    return (plan is not None and plan.budget > 0 and plan.calls == plan.first
            + CALIBRATE_AFTER and not plan.warm and plan.remembered is None)


def affordable(plan: Schedule) -> bool:
    """Would one more check past the shape cap keep ``plan``'s checks beyond the first calls
    within the budget's share of the program's time since them?"""
    pace = plan.pace()
    if plan.budget <= 0 or pace is None or not plan.overheads:
        return False
    warm = max(plan.calls - plan.first, 1)
    return plan.spent + plan.overhead() <= checks_share(plan) * warm * pace


def checks_share(plan: Schedule) -> float:
    """The share of the program's wall time ``plan``'s checks may take: its graph's part of
    the budget, less the values' quarter and less the share the wrapper has taken at the
    graph's calls (so that checks, reads and wrapper together keep to the budget), never
    under ``CHECKS_FLOOR`` of that part. The wrapper's share is of the program's time since
    the first calls (``pace``), the sentinel's own left out: set against a wall time that
    held a 1 s check, it came out smaller, and the period up to 4 times too short."""
    share = LEDGER.share(plan.budget) * (1 - VALUES_SHARE)
    pace, warm = plan.pace(), plan.calls - plan.first
    wrapper = plan.wrapper / (pace * warm) if pace and warm > 0 else 0.0
    return max(share - wrapper, share * CHECKS_FLOOR)


def crossed(plan: Schedule, n: int, flat: List[Any]) -> bool:
    """At a predicted crossing: this call's values, read at once. Past: check it. Not
    yet (the growth slowed): predict again from them."""
    began = time.perf_counter()
    values = plan.magnitudes.now(flat) if plan.magnitudes is not None else {}
    LEDGER.spent += time.perf_counter() - began
    if plan.new_regime(values):
        plan.crossings.call = None
        plan.crossings.read_at = (n, values)  # for this call's check
        return True
    plan.crossings.again(n, values, plan.checked_max)
    return False


def follow(plan: Schedule, integers: Optional[Integers], magnitudes: Magnitudes) -> None:
    """Set what ``plan``'s graph's inputs are followed with (at its first check)."""
    plan.magnitudes, plan.integers, plan.quiet = magnitudes, integers, 0
    if integers is not None:
        magnitudes.followed = frozenset(integers.indices)


def gate(plan: Schedule) -> None:
    """Read the small integers that grow at every call while that costs no more than the
    values' share of the budget less what the other inputs' reads take; else leave them to
    ``magnitudes`` (read every ``stride``-th call), handing over their last two reads so
    that the next rung's call is predicted and read at once there (``crossings``)."""
    follower = plan.integers
    if follower is None or plan.magnitudes is None:
        return
    follower.keep_growing()  # once, after the first reads: only what grows
    plan.crossings.ignore = follower.still
    pace, cheapest = plan.pace(), follower.seconds
    if follower.decided and not follower.indices:
        follower.gated = True  # nothing left to read
    if follower.decided and pace and cheapest is not None and follower.timed >= TIMED:
        follower.gated = True
        share = VALUES_SHARE * LEDGER.share(max(plan.budget, MIN_VALUES_BUDGET)) * pace
        every = cheapest <= share - (plan.measure_seconds or 0.0) / plan.stride
        if follower.every_call and not every:
            for at, values in (follower.previous, follower.last):
                plan.crossings.read(at, {i: values[i] for i in follower.indices
                                         if i in values}, follower.indices, plan.checked_max)
        elif every and not follower.every_call:
            follower.restart()
        follower.every_call = every
    follower.every_call = follower.every_call and bool(follower.indices)
    set_floor(plan)  # the program's pace, measured over more calls
    plan.magnitudes.followed = frozenset(follower.indices if follower.every_call else ())


def lost(plan: Schedule, seconds: float) -> None:
    """What a check that failed part way cost (a reference that could not be computed):
    the sentinel's, past the first calls, though no check's cost to set a period from."""
    if plan.clock is not None and seconds > 0:
        plan.spent += seconds
        LEDGER.spent += seconds


def charge(plan: Schedule, seconds: float) -> None:
    """What reading a deferred check's verdict cost, added to that check's (counted at its
    launch, ``Schedule.checked``)."""
    plan.spent += seconds
    LEDGER.spent += seconds
    for costs in (plan.overheads, plan.warm) + ((plan.uncaptured,) * plan.last_uncaptured):
        if costs:
            costs[-1] += seconds
    set_floor(plan)

