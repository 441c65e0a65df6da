"""The references replayed as a captured device graph (``sentinel/runs/replay.py``): what
can be decided on a CPU. The capture and its replays themselves need a CUDA/HIP device:
``tests/gpu/gpu_checks.py replayed_references`` holds each replay to the same references
run op by op, bit for bit, with the program's RNG untouched and a bug still found."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.fast
torch = pytest.importorskip("torch")

from conftest import dynamo_graph  # noqa: E402

from rocm_autopatch.sentinel.runs import capturing, reference, replay, snapshot  # noqa: E402


def test_ops_whose_outputs_depend_on_data_are_never_captured() -> None:
    x = torch.randn(8)
    assert replay.unreplayable_ops(dynamo_graph(lambda t: (t.sin() * 2).softmax(0), x)) == []
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        both = dynamo_graph(lambda t: t[t > 0].sum() + t.nonzero().sum(), x)
        found = replay.unreplayable_ops(both)
        why = replay.Replays(dynamo_graph(lambda t: t.nonzero().float().sum(), x)).never
    assert found and all(name in ("nonzero", "masked_select", "index") for name in found), found
    assert why.startswith("run op by op: it calls nonzero") and "depend on data" in why


def test_ops_that_read_the_storage_around_a_view_are_never_captured() -> None:
    """``as_strided`` reads an input's storage, not its view: a replay, which reads copies
    of the small inputs' views, would give eager's reference other elements than the
    program's call read (torch's OpInfo samples of it on an H200, a view at an offset:
    judged wrong in three dtypes). Such graphs run op by op, as the program's call did."""
    base = torch.arange(40.0)
    x = base[3:19].view(4, 4)[:, ::2]  # a view at offset 3 of a larger storage
    alone = torch.empty_strided(x.shape, x.stride())  # what a replay copies
    alone.copy_(x)
    assert not torch.equal(alone.as_strided((2, 2), (1, 1), 1), x.as_strided((2, 2), (1, 1), 1))
    for fn in (lambda t: torch.as_strided(t, (2, 2), (1, 1), 1) * 2,
               lambda t: t.as_strided((2, 2), (1, 1), 1) + 1,
               lambda t: torch.as_strided_scatter(t, torch.ones(2), (2,), (1,), 1)):
        gm = dynamo_graph(fn, x)
        assert set(replay.unreplayable_ops(gm)) & reference.STORAGE_READERS, gm.code
        never = replay.Replays(gm).never
        assert never.startswith("run op by op: it calls as_strided"), never
        assert "storage around a view" in never
    assert replay.unreplayable_ops(dynamo_graph(lambda t: t[1:] * 2, x)) == []


def test_on_a_cpu_the_references_run_op_by_op_and_nothing_is_kept() -> None:
    gm = dynamo_graph(lambda t, c: (c.add_(t), t.cos()), torch.randn(4), torch.zeros(4))
    replays = replay.Replays(gm)
    flat = [torch.randn(4), torch.zeros(4)]
    pre = snapshot.Snapshot(flat, frozenset({1}))
    assert replays.replayed((), None, flat, pre, True) is None
    replays.ran((), flat)
    assert replays.replayed((), None, flat, pre, True) is None
    # nothing kept of a CPU graph's calls (a dynamic graph may see thousands of shapes)
    assert replays.seen == {} and replays.captured == {} and replay.held_bytes() == 0


def test_the_check_that_times_a_warm_check_captures_nothing_the_next_one_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """STAND-INS for a device (none here): ``_device`` names one, ``Captured`` records that
    a capture was made, the device's memory is large. A graph whose references need too much
    memory to be captured at their first check is captured at its next, except where that
    check times a warm one (``schedule.calibrating``): the capture's cost would be timed as a
    check's (88 of 393 ms at call 33 of an H200's training loop) and paid in the budget."""
    from types import SimpleNamespace

    from rocm_autopatch.sentinel.scheduling import schedule

    made: list = []

    class Graph:  # what ``replayed`` reads of a watched graph: its schedule
        schedule: Any = None

    class Captured:  # stand-in: what a capture would keep
        def __init__(self, graph: Any, *rest: Any) -> None:
            made.append(graph.schedule.calls)
            self.held, self.first = 0, ("refs",)

    monkeypatch.setattr(replay, "_device", lambda flat: "cuda:0")
    monkeypatch.setattr(replay, "Captured", Captured)
    monkeypatch.setattr(replay, "_LIVE", [])
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=1 << 40))
    gm = dynamo_graph(lambda t: t.cos(), torch.randn(4))
    flat = [torch.randn(4)]
    pre = snapshot.Snapshot(flat, frozenset())
    for calls, remembered, captured in ((1 + schedule.CALIBRATE_AFTER, None, []),
                                        (2 + schedule.CALIBRATE_AFTER, None, [34]),
                                        (1 + schedule.CALIBRATE_AFTER, 0.01, [33])):
        made.clear()
        plan = schedule.Schedule(1, 0.01, [])
        plan.calls, plan.remembered = calls, remembered
        graph = Graph()
        graph.schedule = plan
        replays = replay.Replays(gm)
        need = 1 << 50  # past what a first check captures
        assert replays.replayed((), graph, flat, pre, True, need) is None  # the first check
        replays.ran((), flat)
        got = replays.replayed((), graph, flat, pre, True, need)
        assert made == captured and (got == ("refs",)) == bool(captured), (calls, remembered)

    """What a capture keeps for the inputs the references write: one buffer per storage
    (float64 for the float64 run), views re-made as ``make`` makes them, refilled from the
    next call's snapshot; a snapshot of another layout does not fit them."""
    base = torch.arange(12.0)
    flat = [base[:6].view(2, 3), base[6:], torch.ones(3)]  # two views of one storage
    pre = snapshot.Snapshot(flat, frozenset({0}))
    bases, bases64 = pre.bases(), pre.bases(fp64=True)
    views, views64 = pre.views(bases), pre.views(bases64)
    assert set(views) == {0, 1} and views64[0].dtype == torch.float64
    assert torch.equal(views[1], flat[1]) and views[0].data_ptr() == bases[0].data_ptr()
    for made in (pre.make(), views):  # the same as ``make``
        assert all(torch.equal(made[i], flat[i]) for i in (0, 1))
    views[0].fill_(-1.0)
    views64[1].fill_(-1.0)
    base += 100  # the next call's state
    later = snapshot.Snapshot(flat, frozenset({0}))
    assert later.layout_key() == pre.layout_key()
    later.fill(bases)
    later.fill(bases64)
    assert torch.equal(views[0], flat[0]) and torch.equal(views64[1], flat[1].double())
    other = snapshot.Snapshot([torch.zeros(5)], frozenset({0}))
    assert other.layout_key() != pre.layout_key()


class _StandInCapture:
    """Stands in for ``replay.Captured``, which needs a CUDA/HIP device: what ``_make_room``
    reads of one (its size, its replays, its device)."""

    def __init__(self, held: int, replays: int) -> None:
        self.held, self.replays, self.device = held, replays, "cuda:0"


class _Calls:
    """Stands in for a graph: its schedule (its calls so far) and its record (``note``)."""

    def __init__(self, calls: int) -> None:
        self.calls, self.noted, self.schedule = calls, {}, self

    def note(self, **fields: str) -> None:
        self.noted.update(fields)


def test_room_is_made_from_captures_never_replayed_of_graphs_called_no_more_often(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The eviction's bookkeeping (on an H200, ``tests/gpu/gpu_checks.py capture_gives_way``
    drove an earlier form with real captures): only captures never replayed go, of graphs
    called no more often than the one asking, the least called first; as few as make the
    room; where all of them together would not, none goes. A give-way is not counted
    against the shape's recaptures."""
    import weakref

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    schedules = [_Calls(n) for n in (2, 300, 1, 250)]
    graphs = [replay.Replays(dynamo_graph(lambda t: t.cos(), torch.randn(4))) for _ in "abcd"]
    prompt, step, other, idle_step = graphs
    for g, plan, (shape, held, replays) in zip(graphs, schedules, (
            ("p", 10, 0), ("d", 10, 3), ("q", 5, 0), ("e", 10, 0))):
        g.graph = weakref.ref(plan)
        g.captured[shape] = _StandInCapture(held, replays)
        g.captures[shape] = 1
    monkeypatch.setattr(replay, "_LIVE", [(weakref.ref(g), k) for g, k in
                                          ((prompt, "p"), (step, "d"), (other, "q"),
                                           (idle_step, "e"))])
    replay._make_room(20, "cuda:0", calls=2)  # the prompt and the other hold 15: too little
    assert prompt.captured and other.captured and idle_step.captured
    replay._make_room(3, "cuda:0", calls=2)  # the least called goes first
    assert not other.captured and prompt.captured and "gave way" in other.why
    assert schedules[2].noted == {"references": other.why}  # its record says so at once
    assert other.captures["q"] == 0  # captured again at its next check, if there is room
    replay._make_room(8, "cuda:0", calls=2)  # the prompt; never a step called 250 times
    assert not prompt.captured and idle_step.captured and step.captured
    replay._make_room(8, "cuda:0", calls=300)  # a graph called as often may take its place
    assert not idle_step.captured and step.captured and len(replay._LIVE) == 1


def test_after_a_failed_capture_the_generator_and_the_pool_are_released_nothing_raised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture that fails leaves the GPU's random generator marked as captured (every
    random op of the program raised after it on an H200): one capture of the sentinel's
    own, begun and ended, releases it. Its memory pool, which torch releases only after a
    capture that succeeded (what the references allocated stayed reserved), is routed back
    and released. STAND-INS for ``torch.cuda.CUDAGraph`` and the pool bindings (no CUDA
    device here) record the calls; where a release fails, one warning says what may follow
    and nothing is raised. The real device: ``gpu_checks.py capture_fails``."""
    from rocm_autopatch import record

    calls = []

    class StandIn:
        def capture_begin(self, capture_error_mode: str = "global") -> None:
            calls.append(("begin", capture_error_mode))

        def capture_end(self) -> None:
            calls.append(("end",))

    monkeypatch.setattr(torch.cuda, "CUDAGraph", StandIn)
    capturing._close_rng_capture("cpu")
    assert calls == [("begin", "thread_local"), ("end",)]

    class Unclosable(StandIn):  # even the capture that would release it fails
        def capture_end(self) -> None:
            raise RuntimeError("operation not permitted when stream is capturing")

    # STAND-INS for the pool bindings (a CPU build has them but no device): the capture's
    # pool, its allocations routed elsewhere again, then released (torch's use_mem_pool;
    # before 2.8 the first is _cuda_endAllocateCurrentStreamToPool, which replay.py takes
    # where this one is missing: stood in under the newer name there too).
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool",
                        lambda i, p: calls.append(("route back", i, p)), raising=False)
    monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda i, p: calls.append(("free", i, p)))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Unclosable)
    before = list(record.REPORT.warnings)
    capturing._after_failed_capture("cpu", (0, 10))  # nothing raised
    said = [w for w in record.REPORT.warnings if w not in before]
    assert len(said) <= 1 and all("random ops may raise on this GPU" in w for w in said)
    assert any("random ops may raise on this GPU" in w for w in record.REPORT.warnings)
    assert calls[-1] == ("free", 0, (0, 10))  # the pool released all the same
    monkeypatch.setattr(torch.cuda, "CUDAGraph", StandIn)

    class Pooled(StandIn):  # torch's signature: the pool the capture allocates from
        def capture_begin(self, pool: object = None, capture_error_mode: str = "global"
                          ) -> None:
            calls.append(("begin", pool, capture_error_mode))

    class Invalidated(Pooled):  # capture_end of a capture an op broke
        def capture_end(self) -> None:
            raise RuntimeError("operation failed due to a previous error during capture")

    pools = iter([(0, 11), (0, 12), (0, 13)])
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(pools))
    closed: list = []
    monkeypatch.setattr(capturing, "_close_rng_capture", closed.append)

    def synchronises() -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    calls.clear()
    with pytest.raises(RuntimeError, match="not permitted"):  # the op's own error is kept
        capturing.capture_into(Invalidated(), synchronises, "cuda:0")
    assert calls == [("begin", (0, 11), "thread_local"), ("route back", 0, (0, 11)),
                     ("free", 0, (0, 11))]
    with pytest.raises(RuntimeError, match="previous error"):
        capturing.capture_into(Invalidated(), lambda: 1, "cuda:1")
    assert closed == ["cuda:0", "cuda:1"] and calls[-1] == ("free", 1, (0, 12))
    calls.clear()
    assert capturing.capture_into(Pooled(), lambda: 2, "cuda:2") == 2 and len(closed) == 2
    assert calls == [("begin", (0, 13), "thread_local"), ("end",)]  # reset releases it

    def unreleasable(i: int, p: object) -> None:
        raise RuntimeError("no such pool")

    monkeypatch.setattr(torch._C, "_cuda_releasePool", unreleasable)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 14))
    with pytest.raises(RuntimeError, match="previous error"):  # said once, never raised
        capturing.capture_into(Invalidated(), lambda: 1, "cuda:0")
    assert any("memory pool could not be released" in w and "stays reserved" in w
               for w in record.REPORT.warnings)

    def ended(i: int, p: object) -> None:  # capture_end stopped the routing before failing
        raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", ended)
    monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda i, p: calls.append(("free", p)))
    calls.clear()
    with pytest.raises(RuntimeError, match="previous error"):  # reset releases it: not twice
        capturing.capture_into(Invalidated(), lambda: 1, "cuda:0")
    assert calls == [("begin", (0, 14), "thread_local")]


def test_work_on_the_sentinels_stream_is_ordered_both_ways(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``capturing.on_stream``: the sentinel's stream waits for what the program's stream
    queued before the work is put on it, the work runs with that stream current and the
    lock held, and the program's stream waits for it after (not after work that raised:
    nothing of it is to be waited for). STAND-INS for CUDA streams: a CPU has none."""
    import threading

    import torch

    from rocm_autopatch.sentinel.runs import capturing

    said: list = []

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_stream(self, other: Stream) -> None:
            said.append(f"{self.name} waits for {other.name}")

    program, sentinel = Stream("program"), Stream("sentinel")
    current = [program]

    class Current:
        def __init__(self, stream: Stream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            current.append(self.stream)

        def __exit__(self, *exc: object) -> None:
            current.pop()

    monkeypatch.setattr(capturing, "capture_stream", lambda device: sentinel)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])
    monkeypatch.setattr(torch.cuda, "stream", Current)
    with capturing.on_stream("cuda:0") as stream:
        assert stream is sentinel and current[-1] is sentinel
        elsewhere: list = []  # another thread cannot take the lock meanwhile
        other = threading.Thread(target=lambda: elsewhere.append(
            capturing.STREAM_LOCK.acquire(blocking=False)))
        other.start()
        other.join()
        assert elsewhere == [False]
        said.append("work")
    assert said == ["sentinel waits for program", "work", "program waits for sentinel"]
    said.clear()
    with pytest.raises(RuntimeError), capturing.on_stream("cuda:0"):
        raise RuntimeError("capture failed")
    assert said == ["sentinel waits for program"] and current == [program]
