"""A check whose verdict is read at a later call (``sentinel/runs/deferred.py``, the
pending verdicts in ``sentinel/check.py``): what can be decided on a CPU.

The device work itself (the replay on the sentinel's stream, the events) cannot exist on
this CPU: ``CpuLater`` STANDS IN for it, running the references op by op at the launch and
saying it is done only when the test says so. Everything else is the sentinel's own: the
real ``check.call``, the graph's record, the schedule, the judge. The GPU check
``tests/gpu/gpu_checks.py deferred_verdicts`` runs the real thing on a device."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, List

import pytest

pytestmark = pytest.mark.fast
torch = pytest.importorskip("torch")

from rocm_autopatch.sentinel import check, compare, pending  # noqa: E402
from rocm_autopatch.sentinel.runs import deferred, numerics, replay  # noqa: E402
from rocm_autopatch.sentinel.runs.graph import Graph  # noqa: E402
from rocm_autopatch.sentinel.scheduling import quiet, rungs, schedule  # noqa: E402


class CpuLater(deferred.Later):
    """STAND-IN for the device work of a deferred check (no stream or event on a CPU): the
    references run op by op when the work is "done" (the test says so, or it is waited
    for), reading the inputs read in place then, late, as a replay on a stream does."""

    done_now = False  # the test's switch: is the sentinel's "stream" past this check?
    pause = 0.0  # seconds a wait for the work takes

    def __init__(self, captured: Any, device: Any) -> None:
        self.captured, self.device = captured, device
        self.launch_seconds = 0.0
        self.waited = False

    def affordable(self, res: Any, flat: List[Any], mutated: Any) -> bool:
        return True

    def launch(self, res: Any, flat: List[Any], pre: Any, mutated: Any) -> None:
        self.outputs = [x.clone() for x in numerics.leaves(res)]
        self.after = {i: flat[i].clone() for i in sorted(mutated)}
        taken = {i: flat[i].clone() for i in self.captured.copied}  # copied at the launch
        self.inputs = [taken.get(i, x) for i, x in enumerate(flat)]
        self.pre, self.runs = pre, None
        self.versions = numerics.versions(flat)

    def _run(self) -> None:
        if self.runs is None:
            self.runs = compare.reference_runs(self.captured.graph, self.inputs, self.pre)

    def finished(self) -> bool:
        if CpuLater.done_now:
            self._run()
        return CpuLater.done_now

    def wait(self, seconds: float = 0.0) -> bool:
        self.waited = True
        time.sleep(CpuLater.pause)
        self._run()
        return True

    def judging(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def release(self) -> None:
        pass



@pytest.fixture
def deferring(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every check of a graph due where the test says, its references "captured"; no repro
    written for the graphs found wrong."""
    monkeypatch.setenv("ROCM_AUTOPATCH_VERIFY_DIR", "off")
    monkeypatch.setattr(deferred, "Later", CpuLater)
    monkeypatch.setattr(replay.Replays, "ready",
                        lambda self, shape, flat, pre: getattr(self, "stand_in", None))
    CpuLater.done_now, CpuLater.pause = False, 0.0
    due_at: set = set()
    real_due = schedule.Schedule.due

    def due(self: Any, flat: List[Any]) -> Any:
        real_due(self, flat)  # counts the call, follows shapes and values
        return schedule.SAMPLED if self.calls in due_at else None

    monkeypatch.setattr(schedule.Schedule, "due", due)
    monkeypatch.setattr(quiet, "until", lambda plan, n, *rest: n + 1)  # every call: ``due``
    yield due_at
    pending.settle_all()  # nothing left pending for the next test


def watched(fn: Any, compiled: Any = None, how: str = "check") -> Graph:
    """A graph under watch; its capture's stand-in reads parameters in place and copies the
    rest, as ``replay`` does (small inputs)."""
    graph = Graph(torch.fx.symbolic_trace(fn), compiled or fn, "t/0", "test", how, 1, 0.01)
    graph.replays.stand_in = SimpleNamespace(graph=graph, copied={0: None}, read={1: None})
    return graph


def step(x: Any, w: Any) -> Any:
    return (x @ w).sin()


def wrong(x: Any, w: Any) -> Any:  # the "compiled" graph: 1.5x too large
    return (x @ w).sin() * 1.5


X, W = torch.randn(4, 16), torch.nn.Parameter(torch.randn(16, 16), requires_grad=False)


def test_a_verdict_is_read_at_the_first_call_after_its_work_is_done(deferring: set) -> None:
    deferring.add(1)
    graph = watched(step)
    with torch.no_grad():
        out = check.call(graph, (X, W), {})
        assert torch.equal(out, step(X, W))  # the program's result, at once
        assert graph.pending is not None and graph.entry["calls_checked"] == 0
        check.call(graph, (X, W), {})  # its work not done yet: nothing waits for it
        assert graph.pending is not None and not graph.pending.later.waited
        CpuLater.done_now = True
        check.call(graph, (X, W), {})
    assert graph.pending is None
    entry = graph.entry
    assert (entry["status"], entry["calls_checked"], entry["checks_read_later"]) == (
        "passed", 1, 1)


def test_a_check_that_falls_due_waits_for_the_verdict_before_it(deferring: set) -> None:
    """...and the wait is the sentinel's cost in its ledger (the program stood still)."""
    deferring.update({1, 2})
    graph = watched(step)
    CpuLater.pause = 0.2
    with torch.no_grad():
        check.call(graph, (X, W), {})
        first, before = graph.pending, schedule.LEDGER.spent
        check.call(graph, (X, W), {})
    assert first.later.waited and graph.pending is not first  # one check at a time
    assert schedule.LEDGER.spent - before >= 0.2
    assert graph.entry["calls_checked"] == 1 and graph.entry["status"] == "passed"


def test_a_deferred_verdict_that_differs_is_confirmed_at_the_call_before_any_alarm(
        deferring: set) -> None:
    deferring.add(3)
    graph = watched(step, wrong)
    with torch.no_grad():
        for _ in range(5):
            check.call(graph, (X, W), {})
        assert graph.entry["status"] == "pending" and graph.pending is not None
        CpuLater.done_now = True
        check.call(graph, (X, W), {})  # call 3's verdict read here; call 6 checked at once
    entry = graph.entry
    assert entry["status"] == "failed" and entry["found_at_call"] == 6, entry
    assert entry["skipped_reason"].startswith("call 3's check, its verdict read later, "
                                              "differed from eager")
    assert graph.schedule.calls == 6 and entry["calls_checked"] == 2
    assert entry["checks_read_later"] == 1 and entry["repro"] == ""


def test_a_deferred_difference_not_confirmed_raises_no_alarm(deferring: set) -> None:
    """A write the version counters cannot see (``.data``) made call 1's deferred check
    differ; the program's next call, checked at the call, passes: no alarm."""
    deferring.add(1)
    graph = watched(step)
    w = torch.nn.Parameter(W.detach().clone(), requires_grad=False)
    with torch.no_grad():
        check.call(graph, (X, w), {})
        w.data.mul_(2.0)  # not seen by w's version counter
        CpuLater.done_now = True
        check.call(graph, (X, w), {})
    entry = graph.entry
    assert entry["status"] == "passed" and entry["found_at_call"] is None, entry
    assert entry["skipped_reason"].startswith("call 1's check, its verdict read later, "
                                              "differed")
    assert entry["calls_checked"] == 2 and graph.confirm == 0


def test_an_input_written_in_place_before_the_verdict_voids_the_check(deferring: set
                                                                       ) -> None:
    deferring.add(1)
    graph = watched(step, wrong)  # wrong: were it judged, it would fail
    w = torch.nn.Parameter(W.detach().clone(), requires_grad=False)  # read in place
    with torch.no_grad():
        check.call(graph, (X, w), {})
        w.mul_(2.0)  # the program updates a weight the references read in place
        CpuLater.done_now = True
        check.call(graph, (X, w), {})
    entry = graph.entry
    assert entry["status"] != "failed" and entry["checks_skipped"] == 1, entry
    assert entry["skipped_reason"].startswith("not checked: the program wrote inputs [1]")


def test_the_exit_reads_the_verdicts_still_pending(deferring: set) -> None:
    deferring.add(1)
    healthy, bad = watched(step), watched(step, wrong)
    with torch.no_grad():
        check.call(healthy, (X, W), {})
        check.call(bad, (X, W), {})
    assert {healthy.entry["status"], bad.entry["status"]} == {"pending"}
    assert healthy in pending._WAITING and bad in pending._WAITING
    pending.settle_all()  # at exit, and before the compile report is written
    assert healthy.entry["status"] == "passed" and healthy.entry["calls_checked"] == 1
    # no next call to confirm a difference: said, not alarmed
    assert bad.entry["status"] == "skipped" and bad.entry["found_at_call"] is None
    assert "not confirmed, the process ended" in bad.entry["reason"]
    assert not pending._WAITING and healthy.pending is None and bad.pending is None


def positioned(x: Any, pos: Any) -> Any:
    return (x + pos / 100).sin()


def positioned_wrong(x: Any, pos: Any) -> Any:  # the "compiled" graph: wrong past position 20
    return (x + pos / 100).sin() * torch.where(pos > 20, 1.5, 1.0)


def _kept(graph: Graph) -> rungs.Kept:
    """The graph's part of the store of rungs (``watch`` makes it at the compile), its
    position (input 1) an integer input on the ladder."""
    graph.rungs = rungs.Kept(graph, {})
    graph.rungs.key, graph.rungs.integer = "key", frozenset({1})
    return graph.rungs


def test_a_deferred_verdict_raises_a_rung_only_once_read_and_passed(deferring: set) -> None:
    deferring.update({1, 2})
    graph = watched(positioned)
    kept = _kept(graph)
    with torch.no_grad():
        check.call(graph, (X, torch.tensor(16)), {})
        assert graph.pending is not None and kept.passed == {}  # launched, not yet judged
        check.call(graph, (X, torch.tensor(17)), {})  # due: the first verdict read first
        assert kept.passed == {1: 16.0}
    pending.settle_all()
    assert kept.passed == {1: 17.0} and not kept.bad()


def test_a_deferred_verdict_that_differs_at_exit_removes_the_graphs_key(
        deferring: set) -> None:
    """Passed at position 16, different at 40 as the process ends (no call left to confirm
    it): the graph stays "passed", and its key leaves the store of rungs."""
    deferring.update({1, 2})
    graph = watched(positioned, positioned_wrong)
    kept = _kept(graph)
    with torch.no_grad():
        check.call(graph, (X, torch.tensor(16)), {})
        check.call(graph, (X, torch.tensor(40)), {})
    pending.settle_all()
    assert graph.entry["status"] == "passed" and kept.passed == {1: 16.0}
    assert "not confirmed, the process ended" in graph.entry["skipped_reason"]
    assert kept.doubted and kept.bad()


def test_an_inference_tensor_read_in_place_is_judged_at_the_call(deferring: set) -> None:
    """Its writes leave no version to compare: deferring could not tell them."""
    deferring.add(1)
    graph = watched(step)
    with torch.inference_mode():
        w = torch.nn.Parameter(torch.randn(16, 16), requires_grad=False)
        check.call(graph, (X, w), {})
    assert graph.pending is None and graph.entry["calls_checked"] == 1
    assert graph.entry["checks_read_later"] == 0


def test_fallback_and_a_checked_backward_never_defer(deferring: set) -> None:
    deferring.update({1})
    fallback = watched(step, how="fallback")
    with torch.no_grad():
        check.call(fallback, (X, W), {})
    assert fallback.pending is None and fallback.entry["calls_checked"] == 1
    graph = watched(step)
    check.call(graph, (X, W.clone().requires_grad_()), {})  # gradients on: checked at once
    assert graph.pending is None and graph.entry["calls_checked"] == 1
    assert graph.entry["checks_read_later"] == 0
