"""The ladder of integer inputs: the value past which each is checked (``beyond``: its next
rung where it grows, not below the ladder's ``floor``), and, for integers that grow steadily
(a decode loop's position) among the inputs read every ``stride``-th call, the call at
which each will pass its next rung, predicted from two reads, so that its values are read
at once there (``schedule``)."""

from __future__ import annotations

import math
from typing import Any, Dict, FrozenSet, Optional, Tuple

from rocm_autopatch.sentinel.scheduling.ledger import lower_median

# Integers (positions, lengths, cache indices) are followed closer: a check each time the
# largest passes 1.25 times the largest checked (issue 43, item 3), so a bug from position p
# is checked by 1.25p, and n generated tokens after a prompt of m get about
# log(n / m) / log(1.25) checks (2.0 before: log2, a bug checked by 2p).
LADDER = 1.25
# A rung is forced only where the calls until the next one ((LADDER - 1) p of a position
# growing one a call) take at least this many times what a check costs, over the budget:
# with the default 1%, where a check costs at most two fifths of the program's time to the
# next rung, so the floor is 10 times a check's cost in calls. A graph whose check costs one
# to three of its calls (a decode step's on a GPU, deferred verdict or not) keeps its rungs
# from position 12-36, while one whose check costs tens of its calls (about 40 for a graph
# of 25 us a call on the CPU) does not pay most of a short run for its ladder: 13 forced
# checks in a 300-call run, the sentinel's share 53-56% (3.7x the wall time of off), became
# 1 check and 1.5x (BENCHMARKS.md, "A graph of microseconds"). A tenth (10), tried first,
# cost an H100's 8-layer decode loop its rungs below 70-109, and bugs from position 40 were
# found at 72 and 87, not by 50. A bug from below the floor is checked when a generation
# passes the floor, not by 1.25p; where none does, only by the sampled checks.
LADDER_CEILING = 40.0
# Integer inputs that do not grow (token ids, labels: up and down from call to call) are
# checked past twice the largest checked, as all integers were before the ladder; their
# largest soon nears its bound (the vocabulary) and they stop forcing checks.
INTEGER_FACTOR = 2.0


def floor(cost: float, pace: float, budget: float) -> float:
    """The position (for growth of one a call) below which no rung is forced: where a check
    of ``cost`` seconds, at ``pace`` seconds of the program a call, would take more than
    ``LADDER_CEILING`` times the ``budget`` of the calls until the next rung, raised to a
    power of ``LADDER`` (so that ranks whose costs differ by less than that mostly choose
    the same rungs). 0 with a budget of 0 (the ladder as it was: every rung forced)."""
    if budget <= 0 or pace <= 0 or cost <= 0:
        return 0.0
    position = cost / ((LADDER - 1) * LADDER_CEILING * budget * pace)
    return LADDER ** math.ceil(math.log(max(position, 1.0)) / math.log(LADDER))


class Crossings:
    """Integers that grow steadily (a decode loop's position): from two reads of each (the
    calls they are from), its growth per call, and the call at which it will pass
    ``LADDER`` times its largest checked. Each integer is followed on its own: a read
    that lacks one (it was read at every call meanwhile, ``integers``) leaves its growth
    and its last value as they were; one that fell (a loop that restarted) predicts
    nothing until it grows again."""

    def __init__(self) -> None:
        self.seen: Dict[int, Tuple[int, float]] = {}  # each integer's last value, its call
        self.rates: Dict[int, float] = {}  # growth per call
        self.call: Optional[int] = None  # the next predicted crossing
        self.read_at: Tuple[int, Dict[int, float]] = (0, {})  # values read at a crossing
        # integers known not to grow (token ids): one that rose by chance between two reads
        # would predict a crossing that never comes
        self.ignore: FrozenSet[int] = frozenset()
        # the rungs an earlier process passed, by input name: where this one's ladder
        # started (``rungs``)
        self.remembered: Dict[str, float] = {}
        # the position (for growth of one a call) below which no rung is forced (``set_floor``)
        self.floor = 0.0

    def target(self, i: int, checked: Dict[int, float]) -> float:
        """The value past which integer ``i`` is checked: ``LADDER`` times its largest
        checked, and no rung below ``floor`` calls of its growth (1 a call where unknown)."""
        return max(LADDER * checked.get(i, 0.0), self.floor * self.rates.get(i, 1.0))

    def take(self, n: int) -> Optional[Dict[int, float]]:
        """The values read at call ``n``'s crossing, for its check (one reduction and one
        synchronisation fewer); None where none were."""
        at, values = self.read_at
        self.read_at = (0, {})
        return values if at == n and values else None

    def due(self, n: int) -> bool:
        return self.call is not None and n >= self.call

    def read(self, at: int, values: Dict[int, float], integer: Any,
             checked: Dict[int, float]) -> None:
        """A read of the values of call ``at``."""
        for i in set(integer) - self.ignore:
            now = values.get(i, math.nan)
            before = self.seen.get(i)
            if not math.isfinite(now) or (before is not None and at <= before[0]):
                continue
            self.seen[i] = (at, now)
            if before is not None:
                if now > before[1]:
                    self.rates[i] = (now - before[1]) / (at - before[0])
                else:
                    self.rates.pop(i, None)
        self.plan(at, {}, checked)

    def plan(self, at: int, values: Dict[int, float], checked: Dict[int, float]) -> None:
        """The next crossing, from each growing integer's last value (``values``: those of
        call ``at``, where it has them)."""
        self.call = None
        for i, rate in self.rates.items():
            if math.isfinite(values.get(i, math.nan)):
                self.seen[i] = (at, values[i])
            seen_at, value = self.seen[i]
            target = self.target(i, checked)
            if value <= target:
                call = seen_at + math.floor((target - value) / rate) + 1
                self.call = min(self.call or call, call)

    def again(self, n: int, values: Dict[int, float], checked: Dict[int, float]) -> None:
        """A predicted crossing that had not come (the growth slowed): predicted again from
        this call's values; an integer that fell (the loop restarted) predicts nothing."""
        for i in list(self.rates):
            if values.get(i, math.inf) < self.seen[i][1]:
                del self.rates[i]
        self.plan(n, values, checked)


def set_floor(plan: Any) -> None:
    """``plan``'s ladder's floor (``crossings.floor``) from a warm check's cost (one that
    captured nothing, its verdict's read included; else an earlier process's; else one
    that captured: a first check's is cold) and the program's pace now. Against the whole
    budget, not the graph's part: a decode graph beside a prefill graph keeps its rungs."""
    pace = plan.pace()
    warm = plan.uncaptured or ([plan.remembered] if plan.remembered else plan.warm)
    plan.crossings.floor = floor(lower_median(warm), pace, plan.budget) if warm and pace else 0.0


def beyond(plan: Any, i: int) -> float:
    """The value past which integer input ``i`` is checked: its next rung (``crossings``)
    where it grows (the reader's, once it has decided; before, all it reads; else one whose
    reads every ``stride`` calls found growing), else ``INTEGER_FACTOR`` times its largest."""
    follower = plan.integers
    if follower is not None and i in follower.chosen and not follower.stopped:
        growing = i in (follower.indices if follower.decided else follower.chosen)
    else:
        growing = i in plan.crossings.rates
    if growing:
        return plan.crossings.target(i, plan.checked_max)
    return INTEGER_FACTOR * plan.checked_max.get(i, 0.0)
