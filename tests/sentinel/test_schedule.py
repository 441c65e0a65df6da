"""The schedule's arithmetic, in this process, on a clock the test sets (the schedule reads
``time.perf_counter`` only): the budget is a share of the program's wall time, not of the
graph's own; the graphs share it; integer inputs are followed at twice their largest
checked value. What it finds in a real program is tested through the wheel
(test_coverage)."""

from __future__ import annotations

from typing import Any, List, Optional

import pytest
import torch

from rocm_autopatch.sentinel.scheduling import magnitudes, schedule

pytestmark = pytest.mark.fast


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(schedule.time, "perf_counter", c)
    monkeypatch.setattr(schedule, "LEDGER", schedule.Ledger())
    return c


def _period(clock: Clock, pace: float, call: float = 20e-6, overhead: float = 2e-3,
            alone: bool = True) -> int:
    """The period of a graph whose compiled call takes ``call`` seconds, called every
    ``pace`` seconds of the program, after one warm check that cost ``overhead``; ``alone``:
    the only graph of the process."""
    if alone:
        schedule.LEDGER.__init__()
    plan = schedule.Schedule(1, 0.01, [])
    flat: List[Any] = [torch.ones(2)]
    for _ in range(100):
        plan.due(flat)
        clock.now += pace
    plan.checked(schedule.SAMPLED, flat, {}, True, call, call + overhead, [])
    return plan.period


def test_a_graph_that_is_a_third_of_its_loop_is_sampled_three_times_as_often(
        clock: Clock) -> None:
    alone = _period(clock, 20e-6)  # the graph is the whole loop
    third = _period(clock, 60e-6)  # the program does twice its time between its calls
    # 2 ms / (0.75% of 20 us) = 13,333 -> 16,384; of 60 us: 4,444 -> 8,192 (powers of two)
    assert (alone, third) == (16384, 8192)
    assert _period(clock, 2e-3) == 256  # a small part of the program: followed closely


def test_graphs_share_the_budget_each_called_past_its_first_calls_gets_an_equal_part(
        clock: Clock) -> None:
    one = _period(clock, 60e-6)
    # A second graph like it, the first still in the ledger: 2 graphs, half the budget each.
    assert schedule.LEDGER.graphs == 1 and _period(clock, 60e-6, alone=False) == 2 * one
    assert schedule.LEDGER.graphs == 2
    # What the sentinel spent (the warm checks' overheads), over the wall time since the
    # first graph's first warm call: 2 x 2 ms over 199 calls of 60 us (and the check).
    assert schedule.LEDGER.spent == pytest.approx(4e-3)
    assert schedule.LEDGER.spent_share() == pytest.approx(4e-3 / (199 * 60e-6), rel=1e-3)


def _values_checks(clock: Clock, dtype: Any, reads: Any = None,
                   taken: Optional[List[int]] = None) -> List[int]:
    """The positions (1 to 1,000, one per call) at which the values force a check; the
    checks that used the values their crossing read go to ``taken``, as a check does."""
    plan = schedule.Schedule(1, 0.0, [])
    plan.magnitudes = reads or magnitudes.Magnitudes([0], magnitudes.integer_inputs(
        [torch.zeros(1, dtype=dtype)], [0]))
    plan.call_seconds = 1.0  # a slow graph: its magnitudes read every call
    found = []
    for position in range(1, 1001):
        flat = [torch.tensor([position], dtype=dtype)]
        why = plan.due(flat)
        if why is not None:
            if why == schedule.VALUES:
                found.append(position)
            values = plan.crossings.take(plan.calls)
            if values is not None:
                assert values == plan.magnitudes.now(flat) and taken is not None
                taken.append(position)
            plan.checked(why, flat, values or plan.magnitudes.now(flat), True, 1.0, 1.0, [])
        clock.now += 1.0
    return found


def _by_twice(found: List[int], start: int = 2) -> bool:
    """Is a bug that starts at any position p from ``start`` checked by position 2p?"""
    return all(any(p <= c <= 2 * p for c in found) for p in range(start, found[-1] + 1))


def test_an_integer_input_is_checked_each_time_it_passes_twice_the_largest_checked(
        clock: Clock) -> None:
    """A position from 1 to 1,000, read every call: a check as it passes twice the largest
    checked (about log2(n) checks), so a bug from position p is checked by 2p; a float
    input that grows alike only past 4x."""
    ints = _values_checks(clock, torch.int64)
    assert ints == [3, 7, 15, 31, 63, 127, 255, 511] and _by_twice(ints, start=3)
    assert _values_checks(clock, torch.float32) == [5, 21, 85, 341]


@pytest.mark.parametrize("every,late", [(64, 16), (128, 64), (256, 200)])
def test_a_position_read_late_is_still_checked_by_twice_its_value(
        clock: Clock, every: int, late: int) -> None:
    """On a GPU the values come some calls after the call that had them: a decode loop on
    an H200 read its position every 64 calls, holding a value up to 16 calls old (and a
    bug from position 40 was checked at position 95 before the prediction). The position's
    growth per call, from two reads, predicts the call at which it passes twice the largest
    checked; that call's values are read at once, and it is checked there."""

    class Late(magnitudes.Magnitudes):
        def measure(self, flat: List[Any], call: int = 0) -> Any:
            position = int(flat[0])  # the call's number: one position per call
            if position % every:
                return {}
            self.ready_from = position - late
            return {0: float(position - late)}

    taken: List[int] = []
    found = _values_checks(clock, torch.int64, Late([0], (0,)), taken)
    # from the second read on (the growth known) each check is at the crossing itself: the
    # first position past twice the one checked before
    crossings = [(a, b) for a, b in zip(found, found[1:]) if b > 2 * every]
    assert crossings and all(b == 2 * a + 1 for a, b in crossings[1:]), found
    # and its check used the values the crossing read (no second read)
    assert set(b for _, b in crossings[1:]) <= set(taken), (taken, found)
    assert _by_twice(found, start=found[0]) and len(found) <= 7, found


def test_a_predicted_crossing_that_does_not_come_is_not_checked(clock: Clock) -> None:
    """A loop that restarts its positions after a prediction was made: the values read at
    the predicted call are below twice the largest checked, so no check (one read)."""
    plan = schedule.Schedule(1, 0.0, [])
    plan.magnitudes = magnitudes.Magnitudes([0], (0,))
    plan.call_seconds = 1.0
    whys = []
    for position in list(range(10, 40)) + list(range(10, 30)):
        flat = [torch.tensor([position])]
        why = plan.due(flat)
        whys.append((position, why))
        if why is not None:
            plan.checked(why, flat, plan.magnitudes.now(flat), True, 1.0, 1.0, [])
        clock.now += 1.0
    assert [p for p, why in whys if why == schedule.VALUES] == [21], whys
    assert plan.crossings.call is None or plan.crossings.call > plan.calls


def test_a_dynamic_integer_that_doubles_is_a_new_size_class() -> None:
    assert [schedule._size_class(n) for n in (1, 2, 3, 4, 255, 256)] == [1, 2, 2, 3, 8, 9]


def test_a_first_read_that_pays_one_time_costs_does_not_space_the_reads_for_good(
        clock: Clock) -> None:
    """The first read of magnitudes costs 1,000x the later ones (pinned memory, kernels):
    the stride at most doubles per read, so later reads are measured and bring it back."""
    costs = iter([1e-3] + [1e-6] * 300)

    class Reads(magnitudes.Magnitudes):
        def measure(self, flat: List[Any], call: int = 0) -> Any:
            clock.now += next(costs)
            return {}

    plan = schedule.Schedule(1, 0.01, [])
    plan.magnitudes = Reads([0])
    plan.call_seconds = 1e-3
    strides = []
    for _ in range(200):
        plan.due([torch.ones(1)])
        clock.now += 1e-3
        strides.append(plan.stride)
    # 1 ms against 0.25% of 1 ms a call would be a stride of 512; it went 2, then back to 1
    assert max(strides) == 2 and strides[-1] == 1, strides[:10]


def test_a_decode_loops_forced_checks_count_against_the_budget(clock: Clock) -> None:
    """A decode loop: the position doubles early (checks the values force), each check
    costs 40 ms beyond a 4 ms call of a 4.4 ms step. The calibrating sampled check is not
    made where a forced check already measured a warm one, and each forced check stands in
    for one period's sampled check (the budget's one check per period: issue 32, the
    sentinel's share at most the budget), decided by call numbers alone."""
    plan = schedule.Schedule(1, 0.01, [])
    plan.magnitudes = magnitudes.Magnitudes([0], (0,))
    plan.call_seconds = 4e-3
    checks = []
    for step in range(1, 40001):
        flat = [torch.tensor([16 + step])]
        why = plan.due(flat)
        if why is not None:
            checks.append((step, why))
            plan.checked(why, flat, plan.magnitudes.now(flat), True, 4e-3, 44e-3, [])
            clock.now += 40e-3
        clock.now += 4.4e-3
    forced = [s for s, why in checks if why == schedule.VALUES]
    sampled = [s for s, why in checks if why == schedule.SAMPLED]
    assert len(forced) >= 8  # positions 36, 71, 143, ... 9215: about log2(n)
    assert schedule.CALIBRATE_AFTER + 1 not in sampled  # a values check measured one first
    # 0.75% of 4.4 ms per step allows a 40 ms check every ~1,212 steps (period 2,048)
    assert sampled and all(s % 2048 == 0 for s in sampled)
    for s in sampled:  # each forced check stood in for one period's sampled check
        assert len([c for c, why in checks if c <= s and why != schedule.FIRST]) <= s // 2048
    assert sampled[0] == (len(forced) + 1) * 2048  # the forced checks' periods come first
    assert plan.spent <= 0.01 * 0.75 * 40000 * 4.4e-3


def test_a_cold_first_call_does_not_set_the_pace_when_later_checks_are_not_timed(
        clock: Clock) -> None:
    """On an H200 the first call of a 1.1B decode step took over 0.1 s (kernels loaded,
    workspaces allocated) where a warm one takes 8.6 ms. Checks whose verdict is read later
    never time their call (0.0), so a first call's time, kept as the fastest, set the pace
    for good: a period of 8 and the sentinel at 11-24% of the wall time. Only warm calls
    set it; the wall time per call does the rest."""
    plan = schedule.Schedule(1, 0.01, [])
    flat: List[Any] = [torch.ones(2)]
    assert plan.due(flat) == schedule.FIRST
    plan.checked(schedule.FIRST, flat, {}, True, 0.15, 0.75, [])  # cold: 150 ms
    clock.now += 0.75
    periods = []
    for _ in range(1, 1020):
        why = plan.due(flat)
        if why is not None:  # deferred: the call untimed, 4.5 ms beyond it
            plan.checked(why, flat, {}, True, 0.0, 4.5e-3, [])
            clock.now += 4.5e-3
            periods.append(plan.period)
        clock.now += 8.6e-3
    assert plan.call_seconds is None
    # 4.5 ms / (0.75% of 8.6 ms) = 70 -> 128 (with the cold call kept: 4 -> 4)
    assert periods[-1] == 128
    assert plan.spent <= 0.01 * 1019 * 8.6e-3
