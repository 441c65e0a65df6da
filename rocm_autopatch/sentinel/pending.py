"""The verdicts read later (``check`` on a GPU, ``runs.deferred``): a check launched beside the
program (``launch``), the graphs waiting for a verdict, reading one at a later call of its
graph once its device work is done (``settle``), and every one still pending at exit or
before the compile report is written (``settle_all``).

A verdict read later that differs raises no alarm by itself: an input written where its
version counter cannot see it (``.data``, a kernel writing through a raw pointer) would make
a deferred check differ, so the graph's next call is checked at the call (``confirm``), and
only that verdict counts.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any, List

from rocm_autopatch import record
from rocm_autopatch.sentinel import compare
from rocm_autopatch.sentinel.judging import judge
from rocm_autopatch.sentinel.judging.status import PASSED, PENDING, SKIPPED
from rocm_autopatch.sentinel.runs import deferred, memory, numerics
from rocm_autopatch.sentinel.runs.graph import Graph, busy
from rocm_autopatch.sentinel.scheduling import coverage, rungs, schedule


def deferrable(check: Any) -> bool:
    """May ``check`` (a ``check.Check``) read its verdict later: under ``check``, with no
    gradient to check (the backward pass is checked at the call)?"""
    import torch

    return check.graph.how == "check" and not (check.grad and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in check.flat))


def launch(self: Any) -> bool:
    """``self``, a ``check.Check`` at its compiled call. Under ``check``, with no gradient to
    check and this shape's references captured: run the call, launch its references beside
    the program and return (True); the verdict is read at a later call (``settle``). False
    where it is judged at the call."""
    graph = self.graph
    if self.res is not None or graph.confirm or not deferrable(self):
        return False
    captured = graph.replays.ready(self.shape, self.flat, self.pre)
    if captured is None:
        return False
    before = numerics.versions(self.flat)
    if any(before[i] is None for i in captured.read):
        return False  # an inference tensor read in place: a write to it cannot be seen
    self.prepared = time.perf_counter() - self.work_start
    later = deferred.Later(captured, self.device)
    self.calling = True
    self.res = graph.compiled(*self.args)
    self.calling = False
    if self._unforeseen(before):
        return True
    mutated = self.analysis.mutated
    if not later.affordable(self.res, self.flat, mutated):
        memory.sync(self.device)  # too much to copy: judged now, the call untimed
        compared = self.compare()
        if compared is not None:
            self.res = self.verdict(*compared)
        return True
    later.launch(self.res, self.flat, self.pre, mutated)
    # Counted now, by the call's number, as a check at the call is (ranks that launch
    # the same checks schedule the same calls, whenever each reads its verdict); what
    # the verdict costs is added when it is read.
    graph.schedule.checked(self.why, self.flat, self.values, True, 0.0,
                           self.prepared + later.launch_seconds, numerics.leaves(self.res))
    graph.note(references=graph.replays.why, **coverage.of(graph.schedule))
    self.later = later
    graph.pending = self
    _waiting(graph)
    return True


def resolve(self: Any, wait: float = 0.0) -> None:
    """``self``, a ``check.Check`` launched by ``launch``: its verdict, once its
    references have run (``settle``; ``wait``: seconds to wait at most, at exit), judged on
    the sentinel's stream (its reads wait for nothing of the program's). Its call was
    already counted by the schedule at the launch. A verdict that differs raises no alarm:
    the graph's next call is checked at the call (``confirm``), and only that verdict
    counts."""
    graph, later = self.graph, self.later
    try:
        began = time.perf_counter()  # a wait for its device work is the sentinel's too
        if not later.wait(wait):
            schedule.charge(graph.schedule, time.perf_counter() - began)
            graph.skip("not checked: its references, replayed beside the program, had "
                       "not finished when the process ended")
            return
        moved = later.overwritten(self.flat)
        if moved:
            graph.replays.written_later(self.shape, moved)
            graph.skip(f"not checked: the program wrote inputs {moved} in place before "
                       "the references, replayed beside it, had read them (copied "
                       "from the next capture on)")
            return
        try:
            with later.judging(), numerics.quiet():
                bad, _ = compare.judged(graph, later.runs, self.pre, later.outputs,
                                        later.after, replayed=not wait)  # not at exit
        except compare.Undecided as why:  # counted at its launch; the judging charged
            schedule.charge(graph.schedule, time.perf_counter() - began)
            graph.skip(f"not judged at call {self.at_call:,}: {why}")
            graph.untie()
            return
        schedule.charge(graph.schedule, time.perf_counter() - began)
        with record.LOCK:
            graph.entry["calls_checked"] += 1
            graph.entry["checks_read_later"] += 1
        if not bad:
            rungs.passed(graph, self.values)
            if graph.entry["status"] in (PENDING, SKIPPED):
                graph.settle(PASSED)
            return
        said = (f"call {self.at_call:,}'s check, its verdict read later, differed from "
                f"eager ({judge.error_figure(bad[0])})")
        if wait:  # at exit: no next call to confirm it
            graph.skip(f"not checked: {said}; not confirmed, the process ended")
            rungs.doubt(graph)  # its key leaves the store of rungs
            return
        graph.confirm = self.at_call
        graph.note(skipped_reason=f"{said}: its next call is checked at the call before "
                                  "any alarm")
    except Exception as exc:  # noqa: BLE001 - a check never costs the program anything
        graph.skip(f"not checked: the check itself failed ({type(exc).__name__}: "
                   f"{memory.first_line(exc)})")
        graph.judges = None  # nor its judge's captures (their memory)
        memory.release()
    finally:
        try:
            later.release()
        except Exception:  # noqa: BLE001 - a sticky device error is the program's to see
            pass


# Graphs whose last check's verdict is not read yet (``launch``); read at exit at the
# latest, before the verdict line and the compile report (registered later, run first).
_WAITING: List[Graph] = []
_EXIT = threading.Lock()


def _waiting(graph: Graph) -> None:
    from rocm_autopatch.reporting import document

    with _EXIT:
        if not _WAITING and not getattr(_waiting, "registered", False):
            atexit.register(settle_all)
            document.before_write(settle_all)  # a multiprocessing child exits without atexit
            _waiting.registered = True  # type: ignore[attr-defined]
        if graph not in _WAITING:
            _WAITING.append(graph)


def settle(graph: Graph, wait: bool, seconds: float = 0.0) -> None:
    """Read the verdict of ``graph``'s deferred check where its device work is done, or
    waiting for it (``wait``: a check fell due, or the process exits, waiting at most
    ``seconds`` there). The caller holds ``graph.lock``. Never raises."""
    pending = graph.pending
    try:
        if pending is None or not (wait or pending.later.finished()):
            return
    except Exception:  # noqa: BLE001 - a device error: the verdict is dropped, said
        graph.pending = None
        graph.skip("not checked: the device failed before its verdict could be read")
        return
    graph.pending = None
    with _EXIT:
        if graph in _WAITING:
            _WAITING.remove(graph)
    busy.checking = True
    start = time.perf_counter()
    try:
        resolve(pending, seconds)
    finally:
        busy.checking = False
        with record.LOCK:
            graph.entry["seconds"] = round(graph.entry["seconds"]
                                          + time.perf_counter() - start, 3)


# At exit, how long a verdict's device work and a thread still checking are waited for.
EXIT_WAIT = 10.0


def settle_all() -> None:
    """At exit (and before the report and the verdict line): every verdict not read yet,
    each waited for ``EXIT_WAIT`` seconds at most (a program whose stream is stuck does
    not hang its exit on us)."""
    with _EXIT:
        graphs = list(_WAITING)
    for graph in graphs:
        if graph.lock.acquire(timeout=EXIT_WAIT):
            try:
                settle(graph, wait=True, seconds=EXIT_WAIT)
            except Exception:  # noqa: BLE001 - never at exit
                pass
            finally:
                graph.lock.release()
