"""Integers that grow steadily (a decode loop's position) among the inputs read every
``stride``-th call: the call at which each will pass its next rung of the ladder, predicted
from two reads, so that its values are read at once there (``schedule``)."""

from __future__ import annotations

import math
from typing import Any, Dict, FrozenSet, Optional, Tuple

# Integers (positions, lengths, cache indices) are followed closer: a check each time the
# largest passes 1.25 times the largest checked (issue 43, item 3), so a bug from position p
# is checked by 1.25p, and n generated tokens after a prompt of m get about
# log(n / m) / log(1.25) checks (2.0 before: log2, a bug checked by 2p).
LADDER = 1.25


class Crossings:
    """Integers that grow steadily (a decode loop's position): from two reads of values (the
    calls they are from), each one's growth per call, and the call at which it will pass
    ``LADDER`` times its largest checked. An integer that did not grow since the
    last read (a loop that restarted, a token id) predicts nothing."""

    def __init__(self) -> None:
        self.last: Optional[Tuple[int, Dict[int, float]]] = None  # (call, values)
        self.rates: Dict[int, float] = {}  # growth per call
        self.call: Optional[int] = None  # the next predicted crossing
        self.read_at: Tuple[int, Dict[int, float]] = (0, {})  # values read at a crossing
        # integers known not to grow (token ids): one that rose by chance between two reads
        # would predict a crossing that never comes, and its fall then cancel the others'
        self.ignore: FrozenSet[int] = frozenset()

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
        if not values:
            return
        last, self.last = self.last, (at, values)
        if last is None or at <= last[0]:
            return
        self.rates = {}
        for i in set(integer) - self.ignore:
            now, before = values.get(i, math.nan), last[1].get(i, math.nan)
            if math.isfinite(now) and math.isfinite(before) and now > before:
                self.rates[i] = (now - before) / (at - last[0])
        self.plan(at, values, checked)

    def plan(self, at: int, values: Dict[int, float], checked: Dict[int, float]) -> None:
        """The next crossing from the values of call ``at``."""
        self.call = None
        for i, rate in self.rates.items():
            target = LADDER * checked.get(i, 0.0)
            if values.get(i, math.inf) <= target:
                call = at + math.floor((target - values[i]) / rate) + 1
                self.call = min(self.call or call, call)

    def again(self, n: int, values: Dict[int, float], checked: Dict[int, float]) -> None:
        """A predicted crossing that had not come (the growth slowed): predicted again from
        this call's values, unless they fell (the loop restarted)."""
        last = self.last[1] if self.last else {}
        if all(values.get(i, -math.inf) >= last.get(i, math.inf) for i in self.rates):
            self.plan(n, values, checked)
        else:
            self.call = None
