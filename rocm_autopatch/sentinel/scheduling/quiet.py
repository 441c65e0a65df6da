"""The calls a schedule has nothing to do at but count: how far a watched graph's calls may
skip ``Schedule.due`` (and the wrapper's reading of their inputs), so that the sentinel's
cost at every call of a decode step stays near that of one comparison.

Every call of a watched graph passed through ``check.call`` and ``Schedule.due``: about 34
us a call in an H200's decode loop (0.75-0.95% of an 8-layer decode step; BENCHMARKS.md,
"Where the host time of a decode loop under `check` goes"; the ledger counts the wrapper's
time since, ``check.wrapped``). Most of those calls can do nothing but count: ``until``
says up to which call. Skipped, ``due`` took 4-11 us of those 34. The question whether
the stream captures (7-8 us) is asked of the runtime only while a counted capture is open,
or by a call that is not quiet (``check.call``, ``guards.capture.none_open``).
"""

from __future__ import annotations

from typing import Any, List

# At most this many calls are skipped at once: what changes a schedule outside ``due`` and
# ``checked`` (which recompute and reset it) waits no longer than that to be seen.
QUIET_MAX = 64


def _next_multiple(n: int, every: int) -> int:
    return (n // every + 1) * every


def until(plan: Any, n: int, gate_every: int, calibrate_after: int) -> int:
    """The first call after ``n`` (the call ``plan.due`` just found nothing due at) at which
    ``due`` may do more than count: read the values (every ``stride``-th call), gate the
    small integers' reads (every ``gate_every``-th), take a predicted crossing, calibrate
    (call ``first + calibrate_after``) or sample (every ``period``-th). The next call where
    every call needs ``due``: a dynamic graph's shapes, integers read at every call or not
    yet decided, the first calls."""
    after = n + 1
    follower = plan.integers
    if plan.dynamic or plan.clock is None or n <= plan.first or follower is not None and (
            follower.every_call or not follower.decided):
        return after
    found: List[int] = [n + QUIET_MAX]
    if follower is not None:
        found.append(_next_multiple(n, gate_every))
    if plan.magnitudes is not None:
        found.append(_next_multiple(n, plan.stride))
    if plan.crossings.call is not None:
        found.append(max(plan.crossings.call, after))
    if plan.budget > 0 and not plan.warm and n < plan.first + calibrate_after:
        found.append(plan.first + calibrate_after)
    if plan.period:
        found.append(_next_multiple(n, plan.period))
    return min(found)
