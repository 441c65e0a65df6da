"""The schedule's arithmetic, in this process, on a clock the test sets (the schedule reads
``time.perf_counter`` only): the budget is a share of the program's wall time, not of the
graph's own; the graphs share it; integer inputs are checked on a ladder of rungs 1.25x
their largest checked value. What it finds in a real program is tested through the wheel
(test_coverage)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch
from conftest import dynamo_graph

from rocm_autopatch.sentinel.scheduling import coverage, crossings, integers, magnitudes, schedule
from rocm_autopatch.sentinel.scheduling.ledger import Ledger

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
    monkeypatch.setattr(schedule, "LEDGER", Ledger())
    return c


def _period(clock: Clock, pace: float, call: float = 20e-6, overhead: float = 2e-3,
            alone: bool = True, wrapper: float = 0.0) -> int:
    """The period of a graph whose compiled call takes ``call`` seconds, called every
    ``pace`` seconds of the program, after one warm check that cost ``overhead``; ``alone``:
    the only graph of the process; ``wrapper``: the share of the program's time the wrapper
    took at the graph's calls."""
    if alone:
        schedule.LEDGER.__init__()
    plan = schedule.Schedule(1, 0.01, [])
    flat: List[Any] = [torch.ones(2)]
    for _ in range(100):
        plan.due(flat)
        clock.now += pace
    plan.wrapper = wrapper * (clock.now - plan.clock)
    clock.now += call + overhead  # the check's own time
    plan.checked(schedule.SAMPLED, flat, {}, True, call, call + overhead, [])
    return plan.period


def test_a_graph_that_is_a_third_of_its_loop_is_sampled_three_times_as_often(
        clock: Clock) -> None:
    alone = _period(clock, 20e-6)  # the graph is the whole loop
    third = _period(clock, 60e-6)  # the program does twice its time between its calls
    # 2 ms / (0.75% of 20 us) = 13,333 -> 16,384; of 60 us: 4,444 -> 8,192 (powers of two)
    assert (alone, third) == (16384, 8192)
    assert _period(clock, 2e-3) == 256  # a small part of the program: followed closely


def test_the_sampled_checks_take_what_the_wrapper_leaves_of_their_share(clock: Clock) -> None:
    """The budget holds the sentinel's whole cost: checks, reads and the wrapper at every
    call. The wrapper's share comes out of the checks' (three quarters of the budget), down
    to a quarter of it, so a graph whose wrapper alone costs more is still sampled."""
    assert _period(clock, 2e-3) == 256  # 2 ms / (0.75% of 2 ms) = 133 -> 256
    assert _period(clock, 2e-3, wrapper=0.00375) == 512  # half the checks' share left
    assert _period(clock, 2e-3, wrapper=0.005) == 512  # a third left: 400 -> 512
    assert _period(clock, 2e-3, wrapper=0.0055) == 512  # 0.2% left: 500 -> 512
    # under a quarter left: the floor's 533 -> 1,024 (2,048 without the floor), no further
    assert _period(clock, 2e-3, wrapper=0.007) == 1024
    assert _period(clock, 2e-3, wrapper=0.05) == 1024
    # a check far longer than the calls before it leaves the wrapper's share as it was (of
    # the program's time): 1 s / ((0.75% - 0.5%) x 2 ms) = 200,000 -> 262,144; set against
    # a wall time that held the check, the share was 0.08% and the period half that
    assert _period(clock, 2e-3, overhead=1.0, wrapper=0.005) == 262144


def test_graphs_share_the_budget_each_called_past_its_first_calls_gets_an_equal_part(
        clock: Clock) -> None:
    one = _period(clock, 60e-6)
    # A second graph like it, the first still in the ledger: 2 graphs, half the budget each.
    assert schedule.LEDGER.graphs == 1 and _period(clock, 60e-6, alone=False) == 2 * one
    assert schedule.LEDGER.graphs == 2
    # What the sentinel spent (the warm checks' overheads), over the wall time since the
    # first graph's first warm call: 2 x 2 ms over 199 calls of 60 us and the two checks.
    assert schedule.LEDGER.spent == pytest.approx(4e-3)
    assert schedule.LEDGER.spent_share() == pytest.approx(
        4e-3 / (199 * 60e-6 + 2 * (20e-6 + 2e-3)), rel=1e-3)


def _values_checks(clock: Clock, dtype: Any, reads: Any = None,
                   taken: Optional[List[int]] = None, follow: Any = "cpu",
                   positions: Any = range(1, 1001)) -> List[int]:
    """The positions (one per call) at which the values force a check; the checks that used
    the values their crossing read go to ``taken``, as a check does. ``follow``: the small
    integers read every call (``"cpu"``: the real reader on this CPU; None: only with the
    other inputs, every ``stride``-th call; or a reader standing in for a GPU's)."""
    first = torch.zeros(1, dtype=dtype)
    plan = schedule.Schedule(1, 0.0, [])
    reads = reads or magnitudes.Magnitudes([0], magnitudes.integer_inputs([first], [0]))
    if follow == "cpu":
        follow = integers.followed([first], sorted(reads.integer))
    schedule.follow(plan, follow, reads)
    plan.call_seconds = 1.0  # a slow graph: its magnitudes read every call
    found = []
    for position in positions:
        flat = [torch.tensor([position], dtype=dtype)]
        why = plan.due(flat)
        if why is not None:
            if why == schedule.VALUES:
                found.append(position)
            values = plan.crossings.take(plan.calls)
            if values is not None:  # a check at a rung read at once: those values
                assert values == plan.magnitudes.now(flat)
                if taken is not None:
                    taken.append(position)
            plan.checked(why, flat, values or plan.magnitudes.now(flat), True, 1.0, 1.0, [])
        clock.now += 1.0
    return found


def _by(found: List[int], factor: float, start: int = 2) -> bool:
    """Is a bug that starts at any position p from ``start`` checked by position factor*p?"""
    return all(any(p <= c <= factor * p for c in found)
               for p in range(start, found[-1] + 1))


def test_an_integer_input_is_checked_at_each_rung_of_the_ladder(clock: Clock) -> None:
    """A position from 1 to 1,000, read every call: a check as it passes 1.25 times the
    largest checked (about log(n)/log(1.25) checks), so a bug from any position p is checked
    by 1.25p (issue 43, item 3; 2p before); a float input that grows alike only past 4x."""
    ints = _values_checks(clock, torch.int64)
    rungs, c = [], 1  # each rung the first position past 1.25 times the one before
    while int(1.25 * c) + 1 <= 1000:
        c = int(1.25 * c) + 1
        rungs.append(c)
    assert ints == rungs and rungs[:8] == [2, 3, 4, 6, 8, 11, 14, 18] and len(rungs) == 25
    assert _by(ints, crossings.LADDER)
    assert not _by(ints, 1.2)  # the ladder is no finer than it says
    assert _values_checks(clock, torch.float32) == [5, 21, 85, 341]
    # the same with the integer read every stride-th call, as before (no reader): on the
    # ladder once two reads found it growing (position 2 is past 2x 1, not past 1.25x)
    assert _values_checks(clock, torch.int64, follow=None) == ints[1:]


class _Late(integers.Integers):
    """A GPU's reader: each call's values land ``late`` calls after it (a decode loop on a
    GPU whose host syncs each step reads the call before; one running ahead, older)."""

    def __init__(self, late: int) -> None:
        super().__init__([torch.zeros(1, dtype=torch.int64)], [0])
        self.late, self.queued = late, {}

    def follow(self, flat: List[Any], call: int) -> Any:
        self.queued[call] = float(flat[0])
        at = call - self.late
        return (at, {0: self.queued.pop(at)}) if at in self.queued else (0, {})


@pytest.mark.parametrize("late", [1, 3, 16])
def test_a_position_read_calls_late_is_still_checked_at_its_rung(
        clock: Clock, late: int) -> None:
    """Read ``late`` calls after its call, a steadily growing position is carried forward
    by its growth per call: each check is at the rung itself, a bug from p checked by
    1.25p, as when read at once; no crossing falls between two reads (issue 43, item 2)."""
    found = _values_checks(clock, torch.int64, follow=_Late(late))
    # once two reads gave the growth, each check is the first position past the rung
    later = [(a, b) for a, b in zip(found, found[1:]) if a > late + 2]
    assert len(later) >= 15 and all(b == int(1.25 * a) + 1 for a, b in later), found
    assert _by(found, crossings.LADDER, start=later[0][0])


def test_generations_that_restart_are_each_checked_by_their_rung(clock: Clock) -> None:
    """Generations of 220 new tokens after 16 (positions 16-235), three of them, read a call
    late: the ladder's rungs all fall in the first (bugs from 150, 165 and 180 were never
    found with the 2x ladder: its next rung was past 235); a restart makes no check."""
    gens = [range(16, 236)] * 3
    found = _values_checks(clock, torch.int64, follow=_Late(1),
                           positions=[p for g in gens for p in g])
    assert len(found) == len(set(found)) and found == sorted(found), found
    assert all(any(p <= c <= 1.25 * p for c in found) for p in (150, 165, 180))
    assert max(found) <= 235 and len(found) <= 12, found


@pytest.mark.parametrize("late", [1, 4])
def test_a_new_generation_is_not_carried_past_a_rung_it_never_reaches(
        clock: Clock, late: int) -> None:
    """Generations of positions 16-135, fifty of them, read 1 or 4 calls late: the last
    read of a generation, carried forward by its growth, passes the next rung (116 x 1.25)
    at the first calls of the next generation, which are at 16-19. Such a crossing is read
    at once before it is checked: none is (it forced a check at 16 in every generation)."""
    found = _values_checks(clock, torch.int64, follow=_Late(late),
                           positions=[p for _ in range(50) for p in range(16, 136)])
    # each rung once, in the first generation, up to the last the generations reach (the
    # next one is past 135)
    assert found == sorted(set(found)) and len(found) <= 9, found
    assert int(1.25 * found[-1]) + 1 > 135, found


def test_reads_turned_on_again_forget_the_slots_and_reads_of_before(clock: Clock) -> None:
    """The gate turns the reads every call off (too dear at this pace), then on again:
    what the ring and the growth held from before is dropped, not carried over the gap."""
    plan = schedule.Schedule(1, 0.01, [])
    reader = integers.followed([torch.tensor([16])], [0])
    schedule.follow(plan, reader, magnitudes.Magnitudes([0], (0,)))
    plan.calls, plan.clock, plan.call_seconds = 100, clock.now - 100 * 5e-3, 5e-3
    reader.decided, reader.seconds, reader.timed = True, 1.0, integers.TIMED  # 1 s: off
    reader.last = reader.previous = (90, {0: 106.0})
    schedule.gate(plan)
    assert not reader.every_call and plan.magnitudes.followed == frozenset()
    reader.calls[1], reader.seconds = 91, 1e-9  # a slot never read; now cheap: on
    schedule.gate(plan)
    assert reader.every_call and plan.magnitudes.followed == {0}
    assert reader.calls == [0] * integers.SLOTS and reader.last == reader.previous == (0, {})


def test_integers_no_reader_follows_are_on_the_ladder_only_once_seen_growing(
        clock: Clock) -> None:
    """Integer inputs too large to read every call (a batch of labels, a prefill's ids):
    checked past 2x, unless their reads every ``stride`` calls found them growing."""
    plan = schedule.Schedule(1, 0.0, [])
    schedule.follow(plan, None, magnitudes.Magnitudes([0], (0,)))
    plan.checked_max[0] = 100.0
    assert crossings.beyond(plan, 0) == crossings.INTEGER_FACTOR * 100
    plan.crossings.read(10, {0: 100.0}, (0,), {0: 100.0})
    plan.crossings.read(20, {0: 110.0}, (0,), {0: 100.0})
    assert crossings.beyond(plan, 0) == crossings.LADDER * 100


def test_a_position_read_late_every_stride_calls_is_checked_by_its_rung(
        clock: Clock) -> None:
    """Where the small integers' reads do not fit the budget they are read with the other
    inputs: every 64 calls, 16 calls old. Two reads give the growth per call and predict
    the call that passes the next rung; that call's values are read at once and checked."""

    class Late(magnitudes.Magnitudes):
        def measure(self, flat: List[Any], call: int = 0) -> Any:
            position = int(flat[0])  # the call's number: one position per call
            if position % 64:
                return {}
            self.ready_from = position - 16
            return {0: float(position - 16)}

    taken: List[int] = []
    found = _values_checks(clock, torch.int64, Late([0], (0,)), taken, follow=None)
    # from the second read on (the growth known) each check is at the crossing itself
    later = [c for c in found if c > 128]
    assert later and set(later) <= set(taken), (taken, found)
    assert _by(found, crossings.LADDER, start=later[0]), found


def test_a_predicted_crossing_that_does_not_come_is_not_checked(clock: Clock) -> None:
    """A loop that restarts its positions after a prediction was made: the values read at
    the predicted call are below the next rung, so no check (one read)."""
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
    assert [p for p, why in whys if why == schedule.VALUES] == [13, 17, 22, 28, 36], whys
    assert plan.crossings.call is None or plan.crossings.call > plan.calls


def test_small_integers_are_read_every_call_only_where_it_fits_the_budget(
        clock: Clock) -> None:
    """Reading the position every call costs what it costs (timed here at 8 us): in a loop
    of 4.4 ms steps that is within a quarter of the 1% budget (11 us), every call; in a
    loop of 200 us steps it is not, and the position goes back to the stride-th reads."""
    def run(step: float) -> schedule.Schedule:
        schedule.LEDGER.__init__()
        first = torch.zeros(1, dtype=torch.int64)
        plan = schedule.Schedule(1, 0.01, [])
        reader = integers.followed([first], [0])
        cost = reader.follow

        def timed(flat: List[Any], call: int) -> Any:
            clock.now += 8e-6
            return cost(flat, call)

        reader.follow = timed  # type: ignore[method-assign]
        schedule.follow(plan, reader, magnitudes.Magnitudes([0], (0,)))
        for position in range(16, 16 + 256):
            flat = [torch.tensor([position])]
            why = plan.due(flat)
            if why is not None:
                plan.checked(why, flat, plan.magnitudes.now(flat), True, step, step, [])
            clock.now += step
        return plan

    slow, fast = run(4.4e-3), run(200e-6)
    assert slow.integers.every_call and slow.magnitudes.followed == {0}
    assert coverage.of(slow)["values"]["read_every_call"] == [0]
    assert not fast.integers.every_call and fast.magnitudes.followed == frozenset()
    assert coverage.of(fast)["values"]["read_every_call"] == []


def test_reads_that_do_not_fit_stop_at_the_first_cost_measured_after_the_choice(
        clock: Clock) -> None:
    """A position and a token id read every call at 110 us (an H200 host's reads, against a
    quarter of 1% of 4.4 ms, 11 us): once nine reads chose the position alone, its read is
    timed three times more and the reads stop there, not at the next multiple of 64 calls
    (an H200 process read 65 calls, 7.0-9.5 ms, for this)."""
    schedule.LEDGER.__init__()
    start = [torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)]
    plan = schedule.Schedule(1, 0.01, [])
    reader = integers.followed(start, [0, 1])
    cost, reads = reader.follow, []

    def timed(flat: List[Any], call: int) -> Any:
        clock.now += 110e-6
        reads.append(call)
        return cost(flat, call)

    reader.follow = timed  # type: ignore[method-assign]
    schedule.follow(plan, reader, magnitudes.Magnitudes([0, 1], (0, 1)))
    for position in range(16, 16 + 200):
        flat = [torch.tensor([position]), torch.tensor([(7 * position) % 31])]
        why = plan.due(flat)
        if why is not None:
            plan.checked(why, flat, plan.magnitudes.now(flat), True, 4.4e-3, 4.4e-3, [])
        clock.now += 4.4e-3
    assert reader.decided and reader.indices == (0,) and not reader.every_call
    assert max(reads) <= 16 and reader.gated, reads  # chosen at the 9th read, timed 3 more


def test_when_reads_every_call_stop_the_next_rungs_are_predicted_from_them(
        clock: Clock) -> None:
    """A decode loop whose steps are too short for a read every call (20 us against a
    quarter of 1% of 4.4 ms): its position and token id are read every call until the
    reader is gated off, then every 64 calls, 16 calls old. The position's last two reads
    every call give its growth, so every rung after is still checked at the call that
    passes it (read at once there); the token id, found not to grow, predicts nothing (one
    that rose by chance between two reads, then fell, once stopped every prediction: a bug
    from position 200 went unfound on an H200)."""
    ids = torch.randint(0, 32000, (3000,), generator=torch.Generator().manual_seed(0))

    class Late(magnitudes.Magnitudes):
        def measure(self, flat: List[Any], call: int = 0) -> Any:
            if call % 64:
                return {}
            self.ready_from = call - 16
            return {0: float(int(flat[0]) - 16), 1: float(ids[call - 16])}

    plan = schedule.Schedule(1, 0.01, [])
    reader = integers.followed([torch.tensor([16]), torch.tensor([[0]])], [0, 1])
    real = reader.follow

    def slow(flat: List[Any], call: int) -> Any:
        clock.now += 20e-6
        return real(flat, call)

    reader.follow = slow  # type: ignore[method-assign]
    schedule.follow(plan, reader, Late([0, 1], (0, 1)))
    found = []
    for call, position in enumerate(range(16, 3000), 1):
        flat = [torch.tensor([position]), ids[call].reshape(1, 1)]
        why = plan.due(flat)
        if why is not None:
            found.append((position, why))
            plan.checked(why, flat, plan.magnitudes.now(flat), True, 4e-3, 6e-3, [])
        clock.now += 4.4e-3
    assert not reader.every_call and reader.reads < 100 and reader.still == {1}
    rungs = [p for p, why in found if why == schedule.VALUES and p >= 21]
    ladder = [21]
    while int(1.25 * ladder[-1]) + 1 < 1300:
        ladder.append(int(1.25 * ladder[-1]) + 1)
    assert set(ladder) <= set(rungs), found  # each rung checked at the call that passes it
    assert rungs[-1] > 1000, found


def test_only_integers_that_grow_are_read_every_call(clock: Clock) -> None:
    """A decode step's position (up every call, down once a generation) and its token id
    (up and down): after the first reads only the position is copied every call; the token
    id goes back to the stride-th reads with the other inputs."""
    first = [torch.tensor([16]), torch.tensor([[0]])]
    plan = schedule.Schedule(1, 0.01, [])
    schedule.follow(plan, integers.followed(first, [0, 1]), magnitudes.Magnitudes([0, 1],
                                                                                 (0, 1)))
    assert plan.integers.indices == (0, 1) and plan.magnitudes.followed == {0, 1}
    ids = torch.randint(0, 32000, (200,), generator=torch.Generator().manual_seed(0))
    decided = None
    for call in range(200):
        flat = [torch.tensor([16 + call % 50]), ids[call].reshape(1, 1)]
        why = plan.due(flat)
        if decided is None and plan.integers.decided:
            # decided once 9 reads came (calls 2-10; the first is checked, not read), before
            # call 11's own read
            decided = plan.calls
            assert decided == 11 and plan.integers.reads == 10
        if why is not None:
            plan.checked(why, flat, plan.magnitudes.now(flat), True, 5e-3, 5e-3, [])
        clock.now += 5e-3
    assert plan.integers.indices == (0,) and plan.magnitudes.followed == {0}
    assert coverage.of(plan)["values"]["read_every_call"] == [0]
    # the position stays on the 1.25x ladder; the token id is checked past 2x, as before
    assert plan.integers.still == {1}
    assert plan.new_regime({0: 1.3 * plan.checked_max[0]})
    assert not plan.new_regime({1: 1.9 * plan.checked_max[1]})
    assert plan.new_regime({1: 2.1 * plan.checked_max[1]})


def test_the_real_reader_on_the_cpu_reads_each_call_at_once() -> None:
    """max |x| of each small integer input, this call's; larger ones are left to the
    stride-th reads; an input that changes dtype stops the reader, never the program."""
    flat = [torch.tensor([3, -7]), torch.arange(300), torch.tensor(5, dtype=torch.int32)]
    reader = integers.followed(flat, [0, 1, 2])
    assert reader is not None and reader.indices == (0, 2)  # 300 elements: too many
    assert reader.follow(flat, 9) == (9, {0: 7.0, 2: 5.0})
    flat[0] = torch.tensor([1.5, 2.0])  # a float where an integer was: aminmax still reads
    assert reader.follow(flat, 10)[0] == 10
    flat[0] = "not a tensor"
    assert reader.follow(flat, 11) == (0, {}) and reader.stopped and reader.indices == ()


def test_each_integer_keeps_its_growth_through_reads_that_lack_it() -> None:
    """While the position is read at every call the stride-th reads lack it: its growth
    and its predicted crossing stay (on an H200 such reads erased them, and a rung was
    checked 28 positions late); a token id known not to grow predicts nothing; a position
    that falls (a new generation) stops predicting until it grows again."""
    c = crossings.Crossings()
    c.ignore = frozenset({1})
    c.read(10, {0: 25.0, 1: 100.0}, (0, 1), {0: 40.0, 1: 100.0})
    c.read(20, {0: 35.0, 1: 3000.0}, (0, 1), {0: 40.0, 1: 100.0})
    assert c.rates == {0: 1.0} and c.call == 36  # 35 + 15 passes 1.25 x 40 at call 36
    c.read(30, {1: 5.0}, (0, 1), {0: 40.0, 1: 100.0})  # a read without the position
    assert c.rates == {0: 1.0} and c.call == 36
    c.read(40, {0: 5.0}, (0, 1), {0: 40.0, 1: 100.0})  # restarted
    assert c.rates == {} and c.call is None
    c.read(50, {0: 15.0}, (0, 1), {0: 40.0, 1: 100.0})
    assert c.rates == {0: 1.0} and c.call == 50 + 35 + 1


def test_a_dynamic_integer_that_doubles_is_a_new_size_class() -> None:
    assert [schedule._size_class(n) for n in (1, 2, 3, 4, 255, 256)] == [1, 2, 2, 3, 8, 9]


def _reading(clock: Clock, costs: List[float], call_seconds: float) -> schedule.Schedule:
    """A graph's schedule whose magnitudes' reads cost ``costs`` in turn on ``clock``."""
    taken = iter(costs)

    class Reads(magnitudes.Magnitudes):
        def measure(self, flat: List[Any], call: int = 0) -> Any:
            clock.now += next(taken)
            return {}

    plan = schedule.Schedule(1, 0.01, [])
    plan.magnitudes = Reads([0])
    plan.call_seconds = call_seconds
    return plan


def test_a_first_read_that_pays_one_time_costs_does_not_space_the_reads_for_good(
        clock: Clock) -> None:
    """The first read of magnitudes costs 1,000x the later ones (pinned memory, kernels):
    the stride at most doubles per read, so later reads are measured and bring it back."""
    plan = _reading(clock, [1e-3] + [1e-6] * 300, 1e-3)
    strides = []
    for _ in range(200):
        plan.due([torch.ones(1)])
        clock.now += 1e-3
        strides.append(plan.stride)
    # 1 ms against 0.25% of 1 ms a call would be a stride of 512; it went 2, then back to 1
    assert max(strides) == 2 and strides[-1] == 1, strides[:10]


def test_the_reads_stride_answers_to_what_reads_cost_not_to_the_cheapest_one(
        clock: Clock) -> None:
    """Reads of 0.3 ms with one of 0.05 ms among them (an H200 host's reads varied so; the
    stride was set by the cheapest, and the reads took 0.3% of a decode loop where their
    quarter of a 0.5% part was 0.125%): the stride follows the typical read, and the reads
    keep to their quarter of the budget."""
    schedule.LEDGER.__init__()
    plan = _reading(clock, [0.3e-3, 0.05e-3] + [0.3e-3] * 10_000, 4e-3)
    began = clock.now
    for _ in range(4000):
        plan.due([torch.ones(1)])
        clock.now += 4e-3
    # 0.3 ms against a quarter of 1% of a 4 ms call (10 us): every 30 calls, so 32 (the
    # cheapest read would have made it 8)
    assert plan.stride == 32, plan.stride
    assert schedule.LEDGER.spent / (clock.now - began) <= 0.0025 * 1.2


def _follow_a_position(plan: schedule.Schedule) -> None:
    """``plan`` follows one int64 position (read at every call) in a 4 ms compiled call."""
    schedule.follow(plan, integers.followed([torch.zeros(1, dtype=torch.int64)], [0]),
                    magnitudes.Magnitudes([0], (0,)))
    plan.call_seconds = 4e-3


def _decode(plan: schedule.Schedule, clock: Clock, steps: int, overhead: float,
            step_seconds: float) -> List[Tuple[int, str]]:
    """``steps`` calls of ``plan``'s graph at positions 17, 18, ...: each check made as it
    falls due (the 4 ms call and ``overhead`` beyond it), each step ``step_seconds`` of the
    program. The checks, as (step, why)."""
    checks = []
    for step in range(1, steps + 1):
        flat = [torch.tensor([16 + step])]
        why = plan.due(flat)
        if why is not None:
            checks.append((step, why))
            plan.checked(why, flat, plan.magnitudes.now(flat), True, 4e-3, 4e-3 + overhead, [])
            clock.now += overhead
        clock.now += step_seconds
    return checks


def test_a_decode_loops_forced_checks_count_against_the_budget(clock: Clock) -> None:
    """A decode loop: the position doubles early (checks the values force), each check
    costs 40 ms beyond a 4 ms call of a 4.4 ms step. The calibrating sampled check is not
    made where a forced check already measured a warm one, and each forced check stands in
    for one period's sampled check (the budget's one check per period: issue 32, the
    sentinel's share at most the budget), decided by call numbers alone."""
    plan = schedule.Schedule(1, 0.01, [])
    _follow_a_position(plan)
    checks = _decode(plan, clock, 100000, 40e-3, 4.4e-3)
    forced = [s for s, why in checks if why == schedule.VALUES]
    sampled = [s for s, why in checks if why == schedule.SAMPLED]
    # step 6 (position 22, the first past 1.25 times 17) measures a warm check: 40 ms, ten
    # steps' time. So no rung is forced below the floor, where a check takes two fifths of
    # the steps to the next rung (position 0.04 / (0.25 * 40 * 0.01 * 4 ms) = 100, the pace
    # then the call's 4 ms, raised to 1.25^21 = 108.4): then each the first past 1.25 times
    # the position checked before, until sampled checks (which move the largest checked
    # too) begin
    rungs = [16 + s for s in forced]
    assert rungs[:2] == [22, 109] and len(forced) >= 20
    assert all(b == int(1.25 * a) + 1 for a, b in zip(rungs[1:], rungs[2:]))
    assert schedule.CALIBRATE_AFTER + 1 not in sampled  # a values check measured one first
    # 0.75% of 4.4 ms per step allows a 40 ms check every ~1,212 steps (period 2,048)
    assert sampled and all(s % 2048 == 0 for s in sampled)
    for s in sampled:  # each forced check stood in for one period's sampled check
        assert len([c for c, why in checks if c <= s and why != schedule.FIRST]) <= s // 2048
    assert sampled[0] == (len(forced) + 1) * 2048  # the forced checks' periods come first
    assert plan.spent <= 0.01 * 0.75 * 100000 * 4.4e-3


@pytest.mark.parametrize("budget, overhead, second_rung", [
    (0.01, 40e-3, 109),  # ten steps' time: floor 100, raised to 1.25^21 = 108.4
    (0.01, 12e-3, 36),  # three steps' time: floor 30, raised to 1.25^16 = 35.5
    (0.01, 4e-3, 28),  # one step (a decode step on a GPU): floor 10, every rung from the first
    (0.0, 40e-3, 28),  # no budget: every rung, whatever a check costs
])
def test_the_ladders_rungs_start_where_a_check_fits_two_fifths_of_the_steps_to_the_next(
        clock: Clock, budget: float, overhead: float, second_rung: int) -> None:
    """No rung is forced below the position where a check would take more than 40 times
    the budget of the program's time until the next rung (a quarter of the position, in
    steps): a graph whose check costs many of its calls does not pay most of a short run
    for its ladder. Above that floor, and with no budget, each rung is 1.25 times the one
    before, so a bug from position p is checked by 1.25p."""
    plan = schedule.Schedule(1, budget, [])
    _follow_a_position(plan)
    rungs = [16 + s for s, why in _decode(plan, clock, 2000, overhead, 4e-3)
             if why == schedule.VALUES]
    assert rungs[:2] == [22, second_rung]
    assert all(b == int(1.25 * a) + 1 for a, b in zip(rungs[1:], rungs[2:]))
    # the ladder went on to the end (sampled checks, once they begin, move it too)
    assert plan.checked_max[0] * 1.25 >= 2016


def test_a_check_cost_an_earlier_process_measured_sets_the_period_without_a_check(
        clock: Clock) -> None:
    """A later process whose ladder starts where an earlier one's stopped (``rungs``) runs
    no warm check in its first calls: without a remembered cost it checks call 33 only to
    time one; with it, that call sets the period from the remembered cost and its own pace,
    unchecked, and its first own warm check's cost replaces the remembered one. The check
    that times one is the only one ``calibrating`` (``replay`` captures no references
    there: the capture would be timed with it)."""
    calibrating: Dict[Any, List[int]] = {}

    def run(remembered: Any) -> Tuple[List[Tuple[int, str]], schedule.Schedule]:
        schedule.LEDGER.__init__()  # each run a process of its own
        plan = schedule.Schedule(1, 0.01, [])
        plan.remembered = remembered
        checks = []
        for step in range(1, 4001):
            flat = [torch.ones(2)]
            why = plan.due(flat)
            if schedule.calibrating(plan):
                calibrating.setdefault(remembered, []).append(step)
            if why is not None:
                checks.append((step, why))
                cost = 0.2 if why == schedule.FIRST else 40e-3  # a cold first check
                plan.checked(why, flat, {}, True, 4e-3, 4e-3 + cost, [])
                clock.now += cost
            clock.now += 4.4e-3
        return checks, plan

    calibrated, _ = run(None)
    assert calibrated[:2] == [(1, schedule.FIRST), (1 + schedule.CALIBRATE_AFTER,
                                                     schedule.SAMPLED)]
    remembered, plan = run(40e-3)
    # no check at call 33; the period 40 ms / (0.75% of 4.4 ms) = 1,212 -> 2,048, as the
    # calibrating check's own would be, so the same sampled calls after it
    assert remembered == [(1, schedule.FIRST), (2048, schedule.SAMPLED)]
    assert [c for c in calibrated if c[0] > 1 + schedule.CALIBRATE_AFTER] == remembered[1:]
    assert plan.warm == [pytest.approx(40e-3)]  # its own, measured since
    assert calibrating == {None: [1 + schedule.CALIBRATE_AFTER]}
    _, cheap = run(1e-3)  # a remembered cost below this process's: its own check corrects it
    assert cheap.period == 2048 and cheap.overhead() == pytest.approx(40e-3)


def test_a_check_far_longer_than_a_step_does_not_shorten_the_period_it_sets(
        clock: Clock) -> None:
    """A Llama training step on an H200: 25 ms a step, its calibrating check at call 33
    10.3 s (BENCHMARKS.md, "A Llama training loop"). The program's pace is its time per
    call without the sentinel's checks: 10.3 s / (0.75% of 25 ms) = 54,933 -> 65,536.
    Counted in, the pace was 0.35 s and the period 4,096, a second 10 s check 100 s on.
    With two graphs a step (a graph break), each graph's pace leaves out the other's checks
    too: 10.3 s / (0.375% of 25 ms) -> 131,072 each."""
    for graphs in (1, 2):
        schedule.LEDGER.__init__()
        plans = [schedule.Schedule(1, 0.01, []) for _ in range(graphs)]
        flat: List[Any] = [torch.ones(2)]
        checks = []
        for step in range(1, 20001):
            for g, plan in enumerate(plans):
                why = plan.due(flat)
                if why is not None:
                    checks.append((g, step, why))
                    cost = 10.3 if why != schedule.FIRST else 23.0
                    clock.now += cost
                    plan.checked(why, flat, {}, True, 10e-3, 10e-3 + cost, [])
                clock.now += 25e-3 / graphs  # its compiled call (10 ms) and what follows it
        assert checks == [(g, step, why) for step, why in (
            (1, schedule.FIRST), (1 + schedule.CALIBRATE_AFTER, schedule.SAMPLED))
            for g in range(graphs)]
        for plan in plans:
            assert plan.period == 65536 * graphs and plan.pace() == pytest.approx(25e-3, rel=1e-3)


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


def _decode_run(clock: Clock, calls: int, skipping: bool, check: float) -> Any:
    """A decode loop's schedule on this clock: 4 ms steps, a position and a token id read
    at 60 us (the reader) or 100 us (the magnitudes), checks costing ``check`` s. Returns what
    ``due`` said at each call, the calls its reads and gates ran at, and how often it ran
    its whole body; ``skipping``: calls with nothing due skip it (``quiet``), else never."""
    schedule.LEDGER.__init__()
    ids = torch.randint(0, 32000, (calls,), generator=torch.Generator().manual_seed(0))
    flat0 = [torch.tensor([16]), ids[:1].clone()]
    plan = schedule.Schedule(1, 0.01, [])
    reader = integers.followed(flat0, [0, 1])
    reads: List[Any] = []
    whole: List[int] = []

    def costs(owner: Any, name: str, seconds: float) -> None:
        inner = getattr(owner, name)

        def timed(*a: Any, **k: Any) -> Any:
            clock.now += seconds
            reads.append((name, plan.calls))
            return inner(*a, **k)

        setattr(owner, name, timed)

    values = magnitudes.Magnitudes([0, 1], (0, 1))
    costs(reader, "follow", 60e-6)
    costs(values, "measure", 100e-6)
    costs(values, "now", 100e-6)
    schedule.follow(plan, reader, values)
    until = schedule.quiet.until
    said = []
    for call in range(calls):
        flat = [torch.tensor([16 + call]), ids[call:call + 1].clone()]
        if not skipping:
            plan.quiet = 0
        elif plan.calls + 1 >= plan.quiet:
            whole.append(plan.calls + 1)
        why = plan.due(flat)
        said.append(why)
        if why is not None:
            plan.checked(why, flat, plan.crossings.take(plan.calls) or plan.magnitudes.now(
                flat), True, 20e-6, check + 20e-6, [])
        clock.now += 4e-3
    assert schedule.quiet.until is until
    return said, reads, whole


def test_calls_with_nothing_due_skip_the_schedule_and_change_nothing(clock: Clock) -> None:
    """A watched graph's wrapper cost 34 us a call in an H200's decode loop, outside the
    sentinel's ledger; most calls have nothing due but counting (``scheduling/quiet.py``).
    Skipped, 3,000 calls of a decode loop are checked at the same calls for the same
    reasons, read at the same calls, as when every call runs the whole schedule; and most
    calls skip it."""
    for check, most in ((1e-3, 3000 / 4), (2e-4, 3000 / 3)):  # period above the reads', below
        clock.now = 1000.0
        said, reads, whole = _decode_run(clock, 3000, True, check)
        clock.now = 1000.0
        said_all, reads_all, whole_all = _decode_run(clock, 3000, False, check)
        assert said == said_all and reads == reads_all
        checks = [(n + 1, why) for n, why in enumerate(said) if why is not None]
        assert len(checks) >= 15 and {why for _, why in checks} >= {schedule.VALUES,
                                                                    schedule.SAMPLED}, checks
        assert any(name == "follow" for name, _ in reads) and any(
            name == "measure" for name, _ in reads)
        assert len(whole) < most, len(whole)  # most calls skip the whole schedule


def test_a_call_with_nothing_due_runs_compiled_at_once_and_is_counted(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real ``check.call``, on this clock (4 ms steps, the reads and checks
    costing what they cost on a GPU): 400 calls of a decode-like step (its position an
    input) are checked at the same calls for the same reasons, skipping or not, all
    counted in the schedule and the graph's record; most of them run the compiled graph
    without reading their inputs or running the schedule (``quiet``). A call with another
    number of inputs than the graph's is never skipped: it settles the graph, as before."""
    from rocm_autopatch.sentinel import check
    from rocm_autopatch.sentinel.runs.graph import Graph
    from rocm_autopatch.sentinel.scheduling import quiet

    monkeypatch.setenv("ROCM_AUTOPATCH_VERIFY_DIR", "off")

    def step(x: Any, pos: Any) -> Any:
        return x * 2 + pos

    x = torch.ones(4)
    gm = dynamo_graph(step, x, torch.tensor([16]))  # static shapes, as Dynamo gives them
    ran: dict = {}
    found: list = []
    costs = ((magnitudes.Magnitudes, "measure", 100e-6), (magnitudes.Magnitudes, "now", 100e-6),
             (integers.Integers, "follow", 60e-6), (check.Check, "compare", 2e-4),
             (schedule.Schedule, "due", 0.0), (Graph, "inputs", 0.0))
    def costing(inner: Any, name: str, seconds: float) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            clock.now += seconds
            ran[name] = ran.get(name, 0) + 1
            return inner(*a, **k)
        return timed

    for owner, name, seconds in costs:
        monkeypatch.setattr(owner, name, costing(getattr(owner, name), name, seconds))
    checked = schedule.Schedule.checked
    monkeypatch.setattr(schedule.Schedule, "checked", lambda self, why, *a: (
        found.append((self.calls, why)), checked(self, why, *a))[1])
    until = quiet.until

    def run(skipping: bool) -> Any:
        schedule.LEDGER.__init__()
        clock.now = 1000.0
        ran.clear()
        found.clear()
        quiet.until = until if skipping else (lambda plan, n, *rest: n + 1)
        graph = Graph(gm, gm, "t/0", "test", "check", 1, 0.01)
        with torch.no_grad():
            for n in range(400):
                out = check.call(graph, (x, torch.tensor([16 + n])), {})
                assert torch.equal(out[0] if isinstance(out, tuple) else out, x * 2 + 16 + n)
                clock.now += 4e-3
        return graph, list(found), dict(ran)

    try:
        graph, skipped, ran_skipping = run(True)
        _, every, ran_every = run(False)
    finally:
        quiet.until = until
    assert skipped == every and ran_every["due"] == 400, (skipped, every)
    assert graph.schedule.calls == graph.entry["calls"] == 400
    whys = {why for _, why in skipped}
    assert {schedule.VALUES, schedule.SAMPLED} <= whys and graph.entry["status"] == "passed"
    assert ran_skipping["due"] == ran_skipping["inputs"] < 400 / 2, ran_skipping
    plan = graph.schedule
    with torch.no_grad():
        while plan.quiet <= plan.calls + 1:  # on to a call that opens a window
            check.call(graph, (x, torch.tensor([16 + plan.calls])), {})
            clock.now += 4e-3
    calls = plan.calls
    with pytest.raises(TypeError):  # one input short: the program's own error, as before
        check.call(graph, (x,), {})  # not skipped: the graph settled
    assert graph.fast is not None and plan.calls == calls


def _on_clock(clock: Clock, inner: Any, seconds: float) -> Any:
    """``inner``, costing ``seconds`` on ``clock`` at each call."""
    def timed(*a: Any, **k: Any) -> Any:
        clock.now += seconds
        return inner(*a, **k)
    return timed


GPU_READS = ((magnitudes.Magnitudes, "measure", 100e-6), (magnitudes.Magnitudes, "now", 100e-6),
             (integers.Integers, "follow", 60e-6))  # what the reads cost on a GPU


def _watched_step(clock: Clock, monkeypatch: pytest.MonkeyPatch, costs: Tuple[Any, ...] = (),
                  call_seconds: float = 0.0) -> Tuple[Any, Any]:
    """A decode-like step (its position an input) watched under ``check`` on ``clock``: its
    reads cost what they cost on a GPU, ``costs`` (owner, name, seconds) theirs, and the
    compiled call ``call_seconds``. The graph and its float input."""
    from rocm_autopatch.guards import capture
    from rocm_autopatch.sentinel.runs.graph import Graph

    monkeypatch.setenv("ROCM_AUTOPATCH_VERIFY_DIR", "off")
    for name, value in (("_counted", ()), ("_open", {})):  # captures not counted: every
        monkeypatch.setattr(capture, name, value)  # call asks the runtime, unless told
    for owner, name, seconds in GPU_READS + tuple(costs):
        monkeypatch.setattr(owner, name, _on_clock(clock, getattr(owner, name), seconds))

    def step(x: Any, pos: Any) -> Any:
        return x * 2 + pos

    x = torch.ones(4)
    gm = dynamo_graph(step, x, torch.tensor([16]))
    clock.now = 1000.0
    compiled = _on_clock(clock, gm, call_seconds) if call_seconds else gm
    return Graph(gm, compiled, "t/0", "test", "check", 1, 0.01), x


def test_the_ledger_counts_what_the_wrapper_takes_at_every_call_once(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper's own time at each call of a watched graph (``check.call``) is in the
    ledger's share with its reads and checks, and nothing twice: on this clock asking
    whether the stream captures costs 7 us, a quiet call's input count 3 us, another
    call's reading of its inputs 5 us more, its reads what they cost on a GPU (counted by
    the schedule itself) and the compiled call 50 us (the program's, not counted)."""
    from rocm_autopatch.guards import capture
    from rocm_autopatch.sentinel import check
    from rocm_autopatch.sentinel.runs.graph import Graph

    graph, x = _watched_step(clock, monkeypatch, ((Graph, "matches", 3e-6),
                                                  (Graph, "inputs", 5e-6),
                                                  (capture, "capturing", 7e-6)), 50e-6)
    inputs = []
    monkeypatch.setattr(Graph, "inputs", lambda self, args, inner=Graph.inputs: (
        inputs.append(self.schedule.calls + 1), inner(self, args))[1])
    quiet_calls = 0
    with torch.no_grad():
        for n in range(400):
            quiet_calls += graph.schedule.calls + 1 < graph.schedule.quiet
            check.call(graph, (x, torch.tensor([16 + n])), {})
            clock.now += 4e-3
    ledger = schedule.LEDGER
    assert 0 < quiet_calls < 400 and len(inputs) == 400 - quiet_calls
    # the capture question at every call, matches at the quiet ones, inputs() (which asks
    # matches) at the others; never the compiled call's own 50 us
    assert ledger.wrapper == pytest.approx(7e-6 * 400 + 3e-6 * quiet_calls
                                           + 8e-6 * len(inputs))
    assert ledger.spent > 0 and ledger.spent_share() == pytest.approx(
        (ledger.spent + ledger.wrapper) / (clock.now - ledger.start), abs=1e-5)
    # The graph's own account, which its checks' period answers to, holds the same wrapper
    # (the only graph) less its first call's (the capture question and the reading of its
    # inputs, 15 us: the first calls are not set against the budget), and its report's
    # share of the budget spent counts it.
    plan = graph.schedule
    assert plan.wrapper == pytest.approx(ledger.wrapper - 15e-6)
    assert coverage.of(plan)["budget_spent"] == pytest.approx(
        (plan.spent + plan.wrapper) / (clock.now - plan.clock), abs=1e-5)


def test_a_quiet_call_is_timed_at_one_call_in_sixteen_and_charged_for_all(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the captures counted (none open), a quiet call takes the short way
    (``check.call``): its wrapper is timed at the 1st, 17th, 33rd... quiet call only, each
    charged for sixteen, so the ledger holds what the quiet calls cost to within one sample
    (here, 1 us for the capture count and 3 us for the input count at each); the other
    calls are timed one by one as before (the count, the inputs read: 9 us)."""
    from rocm_autopatch.guards import capture
    from rocm_autopatch.sentinel import check
    from rocm_autopatch.sentinel.runs.graph import Graph

    graph, x = _watched_step(clock, monkeypatch, ((Graph, "matches", 3e-6),
                                                  (Graph, "inputs", 5e-6)), 50e-6)
    monkeypatch.setattr(capture, "none_open", _on_clock(clock, lambda: True, 1e-6))
    took = []
    monkeypatch.setattr(check, "watched", lambda g, a, k, inner=check.watched: (
        took.append(g.schedule.calls + 1), inner(g, a, k))[1])
    quiet = timed = 0
    with torch.no_grad():
        for n in range(1, 801):
            plan = graph.schedule
            is_quiet = n < plan.quiet and graph.pending is None and not graph.confirm
            timed += is_quiet and quiet % check.QUIET_TIMED == 0
            quiet += is_quiet
            check.call(graph, (x, torch.tensor([16 + n])), {})
            clock.now += 4e-3
    assert 300 < quiet < 800 and len(took) == 800 - quiet and timed > 15
    ledger = schedule.LEDGER
    assert ledger.wrapper == pytest.approx(16 * 4e-6 * timed + 9e-6 * len(took))
    # the quiet calls' charge against what they cost: off by at most one sample
    assert abs(16 * timed - quiet) * 4e-6 <= 16 * 4e-6


def test_a_quiet_call_passes_dynamos_disable_wrapper_only_where_it_would_act(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's compiled forward comes in Dynamo's disable() wrapper, and ours runs inside
    the one Dynamo puts around it: a quiet call runs the function inside directly where no
    frame callback is set (``check.compiled_call``); where one is, it goes through the
    wrapper. The results are the compiled ones either way."""
    from rocm_autopatch import torch_releases
    from rocm_autopatch.sentinel import watch

    monkeypatch.setenv("ROCM_AUTOPATCH_VERIFY_DIR", "off")
    graphs: List[Any] = []
    wrap = watch.wrap_compile_fx
    monkeypatch.setattr(watch, "Graph", lambda *a, inner=watch.Graph: (
        graphs.append(inner(*a)), graphs[-1])[1])
    import torch._inductor.compile_fx as inductor

    compile_fx = wrap(inductor.compile_fx, "check", 1, 0.01)
    torch._dynamo.reset()
    fn = torch.compile(lambda a: torch.relu(a * 2 + 1), backend=compile_fx)
    x = torch.randn(8)
    fn(x)
    graph, = graphs
    through = []
    wrapped = graph.compiled
    if torch_releases.inside_disable(wrapped) is None:  # torch 2.4: no disable() wrapper
        assert graph.bare is None
        graph.compiled = lambda *a: (through.append(1), wrapped(*a))[1]
        for _ in range(50):
            assert torch.equal(fn(x), torch.relu(x * 2 + 1))
        assert len(through) == 50  # every call through the compiled function as it came
        return
    assert graph.bare is not None and graph.bare[0] is graph.compiled._torchdynamo_orig_callable
    graph.compiled = lambda *a: (through.append(1), wrapped(*a))[1]
    for _ in range(300):
        assert torch.equal(fn(x), torch.relu(x * 2 + 1))
    assert 0 < len(through) < 30  # the checks and the busy calls only
    through.clear()
    graph.bare = (graph.bare[0], lambda: object())  # a frame callback set on this thread
    for _ in range(50):
        assert torch.equal(fn(x), torch.relu(x * 2 + 1))
    assert len(through) == 50


class _CaptureRig:
    """The decode-like step watched under ``check`` on ``clock``, with STAND-INS for the
    runtime's answer to whether the stream captures (a CPU has no graph capture): the
    questions it was asked and the calls ``Schedule.due`` ran at."""

    def __init__(self, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
        from rocm_autopatch.guards import capture

        self.clock, self.capturing, self.asked, self.due = clock, False, [], []
        monkeypatch.setattr(capture, "capturing", lambda torch_: (  # STAND-IN, see above
            self.asked.append(1), self.capturing)[1])
        real_due = schedule.Schedule.due
        monkeypatch.setattr(schedule.Schedule, "due", lambda plan, flat: (
            self.due.append(plan.calls), real_due(plan, flat))[1])
        self.graph, self.x = _watched_step(clock, monkeypatch)
        self.plan = self.graph.schedule

    def call(self, pos: int) -> None:
        """One call of the program's, its result the right one."""
        from rocm_autopatch.sentinel import check

        self.clock.now += 4e-3
        out = check.call(self.graph, (self.x, torch.tensor([pos])), {})
        assert torch.equal(out[0] if isinstance(out, tuple) else out, self.x * 2 + pos)

    def to_a_quiet_window(self) -> None:
        """On to a call after which the next two are quiet (bounded)."""
        for _ in range(200):
            if self.plan.quiet > self.plan.calls + 2:
                return
            self.call(16 + self.plan.calls)
        raise AssertionError((self.plan.calls, self.plan.quiet))


def test_a_call_inside_capture_is_neither_counted_nor_checked_quiet_or_not(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call asks first whether the stream captures, the quiet ones too
    (``scheduling.quiet``), and a call inside the program's capture (a STAND-IN: a CPU has
    no graph capture) runs compiled, neither checked nor counted: so the calls are
    numbered the same on every rank and every run, wherever a quiet window ends. (Asked
    only off the quiet calls, the capture's calls inside a window were counted.)"""
    rig = _CaptureRig(clock, monkeypatch)
    plan, due = rig.plan, rig.due
    with torch.no_grad():
        for n in range(400):
            rig.call(16 + n)
        assert len(rig.asked) == 400 and len(due) < 400 and plan.calls == 400  # some quiet
        rig.to_a_quiet_window()
        rig.capturing, calls, due_before = True, plan.calls, len(due)
        for _ in range(plan.quiet - plan.calls + 2):  # the window's calls and one past it
            rig.call(7)
    assert plan.calls == calls and len(due) == due_before and rig.graph.entry["calls"] == calls


def test_captures_counted_spare_quiet_calls_the_runtime_and_inside_one_no_call_counts(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the captures begun through torch's CUDAGraph counted (``capture.count_captures``,
    as the sentinel installs it), a quiet call does not ask the runtime whether its stream
    captures; every other call does, before it reads anything. Inside a counted capture no
    call is counted or checked, quiet or not. A capture the runtime alone sees (begun by a
    C++ extension) has its quiet calls counted and no call checked. STAND-INS for the
    runtime's answer and the graph class (a CPU has no graph capture)."""
    import types

    from rocm_autopatch import patching
    from rocm_autopatch.guards import capture

    rig = _CaptureRig(clock, monkeypatch)
    plan, due, asked = rig.plan, rig.due, rig.asked
    cls = type("CUDAGraph", (), {  # STAND-IN, see above
        "capture_begin": lambda self: setattr(rig, "capturing", True),
        "capture_end": lambda self: setattr(rig, "capturing", False)})
    assert capture.count_captures(types.SimpleNamespace(cuda=types.SimpleNamespace(
        graphs=types.SimpleNamespace(CUDAGraph=cls))))
    asked.clear()  # count_captures asked once: a capture under way when it starts
    try:
        with torch.no_grad():
            for n in range(400):
                rig.call(16 + n)
            assert plan.calls == 400 and 0 < len(due) < 400 and len(asked) == len(due)
            rig.to_a_quiet_window()
            calls, checked, window = plan.calls, len(due), plan.quiet - plan.calls
            asked_before = len(asked)
            graph_ = cls()
            graph_.capture_begin()  # counted: every call asks, and none counts
            for _ in range(window + 2):
                rig.call(7)
            graph_.capture_end()
            assert plan.calls == calls and len(due) == checked
            assert len(asked) == asked_before + window + 2
            rig.to_a_quiet_window()
            calls, checked, asked_before = plan.calls, len(due), len(asked)
            quiet_calls = plan.quiet - plan.calls - 1
            rig.capturing = True  # a capture the count does not see
            for _ in range(quiet_calls + 3):
                rig.call(7)
            rig.capturing = False
            assert plan.calls == calls + quiet_calls and len(due) == checked
            assert len(asked) == asked_before + 3
    finally:
        patching.unwrap(cls, "capture_begin")
        patching.unwrap(cls, "capture_end")


def test_a_check_whose_reference_fails_is_still_the_sentinels_cost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that ran part way and failed (here a stand-in: the references raise after
    0.1 s, as an op without a float64 kernel does after eager's run) is said and skipped;
    its time past the first calls is in the ledger, as a check's would be."""
    from rocm_autopatch.sentinel import check, compare
    from rocm_autopatch.sentinel.runs.graph import Graph

    monkeypatch.setenv("ROCM_AUTOPATCH_VERIFY_DIR", "off")
    monkeypatch.setattr(schedule, "LEDGER", Ledger())

    def failing(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.1)
        raise RuntimeError("no float64 kernel (a stand-in)")

    monkeypatch.setattr(compare, "reference_runs", failing)

    def step(x: Any, pos: Any) -> Any:
        return (x + pos / 100).sin()

    graph = Graph(torch.fx.symbolic_trace(step), step, "t/0", "test", "check", 1, 0.01)
    x = torch.randn(4, 16)
    for position in range(16, 100):  # positions that grow: the ladder's checks fall due
        check.call(graph, (x, torch.tensor(position)), {})
    plan = graph.schedule
    assert plan.skipped >= 3 and "float64 kernel" in graph.entry["skipped_reason"]
    assert plan.checks == 0  # none judged
    # every failed check but the first call's (outside the budget) counted, in the graph's
    # account and the process's
    assert plan.spent >= 0.1 * (plan.skipped - 1) and schedule.LEDGER.spent >= plan.spent



def test_the_ladders_floor_is_a_rung_of_its_own_so_ranks_whose_costs_are_close_agree() -> None:
    """The floor is raised to a power of ``LADDER``: two ranks whose checks cost 16 and 17.2
    ms at the same pace (4 ms a call) choose the same floor (the rungs they force are then
    the same); no budget, no cost or no pace: no floor."""
    rung = crossings.LADDER ** 17  # 44.4, the first power at or above 40
    assert crossings.floor(16e-3, 4e-3, 0.01) == crossings.floor(17.2e-3, 4e-3, 0.01) == rung
    assert crossings.floor(18e-3, 4e-3, 0.01) == crossings.LADDER ** 18  # 45 > 44.4
    assert crossings.floor(4e-3, 4e-3, 0.0) == crossings.floor(0.0, 4e-3, 0.01) == 0.0
    assert crossings.floor(4e-3, 0.0, 0.01) == 0.0


def test_the_ladders_floor_answers_to_a_check_that_captured_nothing_with_its_verdict(
        clock: Clock) -> None:
    """The floor comes from what a warm check costs: not a check that captured its
    references (paid once; an earlier process's capture-free cost is taken before it), and
    with a deferred verdict's read added when it is read (``charge``)."""
    plan = schedule.Schedule(1, 0.01, [])
    _follow_a_position(plan)
    plan.remembered = 16e-3  # an earlier process's: four calls, floor 44.4
    flat = [torch.tensor([20])]
    for _ in range(3):
        plan.due(flat)
        clock.now += 4e-3
    plan.capturing = True  # this check captures: 200 ms, once
    plan.checked(schedule.VALUES, flat, {0: 20.0}, True, 4e-3, 204e-3, [])
    assert plan.crossings.floor == crossings.LADDER ** 17
    plan.checked(schedule.VALUES, flat, {0: 20.0}, True, 0.0, 4e-3, [])  # launched: 4 ms
    assert plan.crossings.floor == crossings.floor(4e-3, plan.pace(), 0.01)
    schedule.charge(plan, 12e-3)  # its verdict read: 16 ms in all
    assert plan.uncaptured == [16e-3]
    assert plan.crossings.floor == crossings.floor(16e-3, plan.pace(), 0.01) > 30
