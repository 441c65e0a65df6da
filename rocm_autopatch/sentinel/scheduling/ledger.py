"""What the watched graphs of a process share: the sentinel's budget, split evenly between
the graphs called past their first calls, and the time its checks, reads and wrapper took
over all of them (the share the report and the doctor give). ``LEDGER`` is the process's
one ledger, read through ``schedule``."""

from __future__ import annotations

import time
from typing import List, Optional


class Ledger:
    """What the graphs of the process share: the budget, split evenly between the graphs
    called past their first calls (so that their shares add up to it, each set against the
    program's time per call of that graph), and the sentinel's time over all of them."""

    def __init__(self) -> None:
        self.start: Optional[float] = None  # the first warm call of any graph
        self.graphs = 0  # graphs called past their first calls
        self.spent = 0.0  # seconds of sampled checks and value reads, all graphs
        self.wrapper = 0.0  # seconds the wrapper took at calls, beyond what ``spent`` holds
        # (each graph's own too: ``Schedule.wrapper``)

    def join(self) -> None:
        """A graph's first call past its first calls."""
        self.graphs += 1
        if self.start is None:
            self.start = time.perf_counter()

    def share(self, budget: float) -> float:
        return budget / max(self.graphs, 1)

    def spent_share(self) -> float:
        """The sentinel's share of the wall time since the first warm call: its checks, its
        reads and its wrapper at every call (``check.call``). Each graph's checks answer to
        its wrapper (``checks_share``); its reads to their quarter of the budget."""
        return share_since(self.spent + self.wrapper, self.start)


def lower_median(values: List[float]) -> float:
    """The lower median: one slow outlier in three (a cold first run) does not move it."""
    return sorted(values)[(len(values) - 1) // 2]


def share_since(spent: float, since: Optional[float]) -> float:
    """``spent`` seconds as a share of the wall time since ``since`` (0 before it)."""
    elapsed = time.perf_counter() - since if since is not None else 0.0
    return round(spent / elapsed, 5) if elapsed > 0 else 0.0


LEDGER = Ledger()
