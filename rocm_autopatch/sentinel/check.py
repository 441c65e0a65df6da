"""One call of a graph run checked: the steps in order, each able to end the check early.

``Check.run`` reads as the sequence: analyse what the graph writes (once per shape), decide
whether it can be compared at all, whether its references fit in memory, copy the state it
writes, run it compiled, compute eager and float64, judge, then the backward pass. A step
that cannot go on records why (the graph is skipped for good, or this one check is) and the
call returns the compiled result; the program's call is never lost to a check.

Under ``check``, where a shape's references are captured and no gradient is checked, the
call returns once its references are launched beside the program, and a later call reads
the verdict (``pending``). The references and the judge are ``compare``'s.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from rocm_autopatch import record
from rocm_autopatch.guards import capture
from rocm_autopatch.sentinel import compare, pending
from rocm_autopatch.sentinel.healing import alarm
from rocm_autopatch.sentinel.judging.status import FAILED, PASSED, PENDING, SKIPPED
from rocm_autopatch.sentinel.runs import backward, footprint, memory, numerics, snapshot
from rocm_autopatch.sentinel.runs.graph import Graph, busy
from rocm_autopatch.sentinel.scheduling import coverage, integers, rungs, schedule


class Check:
    """The state of one checked call, from its inputs to its verdict."""

    def __init__(self, graph: Graph, args: Tuple[Any, ...], flat: List[Any], boxed: bool,
                 why: str, res: Any) -> None:
        self.graph = graph
        self.grad = torch.is_grad_enabled()  # at the call (a deferred verdict comes later)
        self.args, self.boxed, self.why = args, boxed, why
        self.res = res  # set: the call already ran, and wrote nothing
        self.count = len(flat)
        held = numerics.held(graph.gm)  # flat: the inputs, then the tensors the graph holds
        self.flat = flat + [held[name] for name in graph.names]
        self.analysis: Any = None
        self.device: Any = None
        self.shape: Any = None  # the shape signature the analysis and captures are kept by
        self.need = 0  # the bytes its references need (the analysis' estimate)
        self.pre: Any = None  # the state the call writes, as it was before the call
        self.values: Any = None  # the inputs' magnitudes now
        # the compiled call's seconds, the check's start, and (a deferred check) its seconds
        # before the compiled call
        self.call_seconds = self.work_start = self.prepared = 0.0
        self.later: Any = None  # a deferred check's work on the device (runs.deferred)
        self.at_call = graph.schedule.calls  # which call of the graph this is
        self.calling = False  # inside the program's own compiled call

    def run(self) -> Any:
        try:
            if (self.unanalysable() or self.not_comparable() or self.too_large()
                    or self.not_copied()):
                return self.unchecked()
            if pending.launch(self):
                res, self.res, self.args = self.res, None, ()  # not held while pending
                return res
            if self.wrote_unforeseen():
                return self.res
            compared = self.compare()
            if compared is None:
                return self.res
            return self.verdict(*compared)
        except Exception as exc:  # noqa: BLE001 - a check never costs the program its call
            if self.calling:
                raise  # the program's own call raised: its error, as without us
            self.graph.skip(f"not checked: the check itself failed ({type(exc).__name__}: "
                            f"{memory.first_line(exc)})")
            memory.release()
            return self.unchecked()

    def unchecked(self) -> Any:  # this call's result, without a check
        return self.graph.compiled(*self.args) if self.res is None else self.res

    # ---- the steps, each True where the check ends there ---------------------------------

    def unanalysable(self) -> bool:
        """What the graph writes, from a run on fake tensors (once per shape)."""
        graph, signature = self.graph, self.graph.schedule.signature(self.flat)
        self.shape = signature
        analysis = graph.analyses.get(signature)
        if analysis is None:
            analysis = numerics.analyse(graph.eager_run, self.flat)
            if len(graph.analyses) < schedule.SHAPE_CAP:
                graph.analyses[signature] = analysis
        self.analysis = analysis
        # The check's cost for the budget leaves out the analysis: it runs once per shape.
        self.work_start = time.perf_counter()
        if not analysis.error:
            return False
        reason = (f"not checked: the graph could not be run on fake tensors to see "
                  f"what it writes ({analysis.error})")
        if graph.schedule.checks:
            graph.skip(reason)
        else:
            graph.finish(SKIPPED, reason)
        return True

    def not_comparable(self) -> bool:
        """Collectives must pair on every rank (the fake run finds those Dynamo's graph does
        not name: tensor parallelism on torch 2.11); random ops differ by design; effects
        (custom ops) must not run twice. Decided from graph and shapes: alike on all ranks."""
        analysis = self.analysis
        if analysis.collectives:
            self.graph.finish(SKIPPED, numerics.not_compared(analysis.collectives))
            return True
        if analysis.random:
            self.graph.finish(SKIPPED, f"not compared: it calls random ops "
                                       f"({', '.join(analysis.random)}), whose compiled and "
                                       "eager results differ by design")
            return True
        if analysis.effects:
            self.graph.finish(SKIPPED, f"not compared: it calls {', '.join(analysis.effects)}, "
                                       "which torch cannot tell free of side effects (a custom "
                                       "op may count, log or call a runtime): re-running it "
                                       "would do that twice")
            return True
        return False

    def too_large(self) -> bool:
        """The budget is decided before anything is copied, from what the fake run saw."""
        plan = self.graph.schedule
        if plan.magnitudes is None:
            schedule.follow(plan, *integers.readers(self.flat, self.count, self.analysis.mutated))
            plan.magnitudes.warm(self.flat)  # its first read's one-time cost, here
            rungs.recall(self.graph, self.flat, plan.dynamic)  # held tensors too
        parts = footprint.reference_parts(self.analysis.footprint, snapshot.Snapshot.bytes_needed(
            self.flat, self.analysis.mutated))
        need = self.need = sum(parts.values())
        self.device = next((t.device for t in self.flat if isinstance(t, torch.Tensor)), None)
        room = memory.free_bytes(self.device) if self.device is not None else None
        if room is None or need <= room * memory.SHARE:
            return False
        self.graph.skip(f"not checked: its eager and float64 references would need "
                        f"{footprint.said(parts)}, more than half of the "
                        f"{room / 2**30:.2f} GiB free")
        return True

    def not_copied(self) -> bool:
        """The magnitudes now, and a copy of the state the call writes."""
        try:
            plan = self.graph.schedule
            self.values = plan.crossings.take(plan.calls)
            if self.values is None:
                self.values = plan.magnitudes.now(self.flat)
            self.pre = snapshot.Snapshot(self.flat, self.analysis.mutated)
        except Exception as exc:  # noqa: BLE001 - out of memory, odd aliasing: not checked
            self.graph.skip("not checked: the state it writes could not be copied "
                            f"({type(exc).__name__}: {memory.first_line(exc)})")
            memory.release()
            return True
        return False

    def wrote_unforeseen(self) -> bool:
        """Run the call compiled (timed alone), unless it already ran; True where it wrote an
        input the analysis did not foresee (its copies would be wrong)."""
        if self.res is not None:
            return False
        before = numerics.versions(self.flat)
        memory.sync(self.device)
        began = time.perf_counter()
        self.calling = True
        self.res = self.graph.compiled(*self.args)
        self.calling = False
        memory.sync(self.device)
        self.call_seconds = time.perf_counter() - began
        return self._unforeseen(before)

    def _unforeseen(self, before: List[Optional[int]]) -> bool:
        """Did the call write an input the analysis did not foresee (then the graph is not
        checked again: its copies would be wrong)?"""
        unforeseen = numerics.changed(self.flat, before) - self.analysis.mutated
        if not unforeseen:
            return False
        self.graph.finish(SKIPPED, "not checked: the compiled graph wrote inputs "
                                   f"{sorted(unforeseen)} that the analysis did not foresee")
        return True

    def compare(self) -> Optional[Tuple[List[Any], int]]:
        """(the values the judge rejects, how many are outputs); None: skipped, said why."""
        try:
            with numerics.quiet():
                return compare.references(self.graph, self.flat, self.pre, self.res, sorted(
                    self.analysis.mutated), self.shape, self.need, tries=not self.grad,
                    later=pending.deferrable(self))
        except compare.Undecided as why:
            return undecided(self, why)
        except Exception as exc:  # noqa: BLE001 - out of memory, no float64 kernel (FP8)...
            self.graph.skip("not checked: computing the eager or float64 reference "
                            f"failed ({type(exc).__name__}: {memory.first_line(exc)})")
            memory.release()
            schedule.lost(self.graph.schedule,
                          time.perf_counter() - self.work_start - self.call_seconds)
            return None

    def verdict(self, bad: List[Any], outputs: int) -> Any:
        """The backward pass where the forward passed, the schedule told, the record kept;
        a graph that differs raises the alarm."""
        graph, grad = self.graph, self.grad
        if not grad:
            graph.note(backward="not applicable: gradients are off (inference)")
        elif not bad:
            graph.note(backward=backward.check(graph, self.flat, self.pre, self.res,
                                               self.boxed))
        passed = not bad and not graph.entry["backward"].startswith(FAILED)
        graph.confirm = graph.untied = 0  # a deferred verdict's confirmation is here
        graph.schedule.checked(self.why, self.flat, self.values, passed, self.call_seconds,
                               time.perf_counter() - self.work_start,
                               numerics.leaves(self.res))
        with record.LOCK:
            graph.entry["calls_checked"] += 1
            graph.entry.update(coverage.of(graph.schedule))
        if bad:
            if grad:
                graph.note(backward="not checked: the forward pass already differs")
            return alarm.raise_alarm(graph, bad[0], outputs, self.why, self.flat, self.pre,
                                     self.res, grad, "forward")
        if not passed:
            return alarm.raise_alarm(graph, None, outputs, self.why, self.flat, self.pre,
                                     self.res, grad, "backward")
        rungs.passed(graph, self.values)
        if graph.entry["status"] in (PENDING, SKIPPED):
            graph.settle(PASSED)
        return self.res


def undecided(check: Check, why: Exception) -> None:
    """A check whose results differed only where a near tie reaches (``compare.Undecided``):
    skipped, saying why, and counted by the schedule as a check that ran (its cost, the
    values it covered: else each read of the values would check again). The graph's next
    call is checked (``Graph.untie``): a tie is the call's own (another token's router need
    not tie), and a bug it hid is found there."""
    graph = check.graph
    graph.skip(f"not judged at call {graph.schedule.calls:,}: {why}")
    graph.untie()
    graph.schedule.checked(check.why, check.flat, check.values, False, check.call_seconds,
                           time.perf_counter() - check.work_start,
                           numerics.leaves(check.res))


# A quiet call's wrapper is timed at one quiet call in this many (counted apart: the calls
# just after a read are busy, so a call number would pick the same kind of call every time)
# and charged for all of them, instead of two clock reads and the ledger's bookkeeping at
# every call: with ``compiled_call``, a quiet call inside a real decode loop on the CPU cost
# 9.9 us instead of 14.0 (BENCHMARKS.md, "The wrapper's quiet path inside a decode loop").
QUIET_TIMED = 16


def call(graph: Graph, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """One call of ``graph``: run compiled, or checked where the schedule says it is due.
    Never checked inside graph capture (nothing may synchronise there), on fake tensors
    (a compiler's propagation), inside another check, or while another thread checks it.
    A quiet call (nothing due but counting, ``scheduling.quiet``: most calls of a decode
    loop) takes the fewest steps that keep those rules: inside a program's loop each costs
    1-3 us (most likely its caches cold from the program's own work)."""
    plan = graph.schedule
    n = plan.calls + 1
    began = time.perf_counter() if plan.quiet_calls % QUIET_TIMED == 0 else 0.0
    if (n < plan.quiet and not kwargs and graph.pending is None and not graph.confirm
            and graph.fast is None and capture.none_open() and not getattr(busy, "checking", False)
            and not numerics.fake_call(args) and graph.matches(args)
            and graph.lock.acquire(blocking=False)):
        try:  # under the lock, as counted: another thread may have counted meanwhile
            quiet = (n == plan.calls + 1 and n < plan.quiet and graph.pending is None
                     and not graph.confirm)
            if quiet:
                plan.calls = graph.entry["calls"] = n
                plan.quiet_calls += 1
                if began:
                    wrapped(plan, began, schedule.LEDGER.spent, QUIET_TIMED)
        finally:
            graph.lock.release()
        if quiet:
            return compiled_call(graph, args)
    return watched(graph, args, kwargs)


def compiled_call(graph: Graph, args: Tuple[Any, ...]) -> Any:
    """``graph``'s compiled call, past Dynamo's disable() wrapper where that wrapper changes
    nothing in ordinary use: no frame callback is set on this thread (this call came
    through the disable() Dynamo put around ours, or from no compiled frame). A step fewer
    at every call (``graph.bare``, ``torch_releases.inside_disable``)."""
    bare = graph.bare
    if bare is not None and bare[1]() is None:
        return bare[0](*args)
    return graph.compiled(*args)


def watched(graph: Graph, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """A call that is not quiet, or that may be inside a capture the count does not see
    (``call``)."""
    began, spent = time.perf_counter(), schedule.LEDGER.spent
    # Whether the stream captures is known before anything else, the quiet calls included:
    # a call made inside the program's capture is never counted, so every rank and every
    # run numbers the same calls the same way (known only off the quiet calls, the calls of
    # a capture were counted or not by where the quiet window ended, which follows
    # timings). While no capture begun through torch's graph classes is open (counted by
    # ``guards.capture``), a quiet call does not ask the runtime (7-8 us a call on an H200);
    # a call that may do more than count asks it (``elsewhere``).
    counted = capture.none_open()
    if kwargs or getattr(busy, "checking", False) or \
            (not counted and capture.capturing(torch)) or \
            numerics.fake_call(args) or not graph.lock.acquire(blocking=False):
        # Inside graph capture nothing may synchronise; fake tensors are a compiler's
        # propagation, not the program's call; another thread is checking it.
        return graph.compiled(*args, **kwargs)
    try:
        if graph.pending is not None:
            if elsewhere(counted):
                return graph.compiled(*args)
            counted = False  # asked
            pending.settle(graph, wait=False)
        if graph.fast is not None:
            return graph.fast(*args)
        plan = graph.schedule
        if plan.calls + 1 < plan.quiet and not graph.confirm and graph.matches(args):
            plan.calls += 1  # nothing due but counting (``scheduling.quiet``)
            graph.entry["calls"] = plan.calls
            wrapped(plan, began, spent)
            return compiled_call(graph, args)
        if elsewhere(counted):
            return graph.compiled(*args)
        return scheduled(graph, args, began, spent)
    finally:
        graph.lock.release()


def scheduled(graph: Graph, args: Tuple[Any, ...], began: float, spent: float) -> Any:
    """A call outside the quiet calls (the graph's lock held): the schedule decides whether
    it is checked, from its inputs."""
    plan = graph.schedule
    flat, boxed = graph.inputs(args)
    if flat is None:
        pending.settle(graph, wait=True)
        graph.finish(SKIPPED, "not checked: called with inputs that do not match the "
                             "graph")
        return graph.compiled(*args)
    seen = plan.shapes_seen
    try:
        why = plan.due(flat)
    except Exception:  # noqa: BLE001 - an input it cannot read: this call runs unchecked
        why = None
    if why is None and graph.confirm:  # a deferred verdict differed: confirmed here
        why = schedule.SAMPLED
    graph.entry["calls"] = plan.calls
    if (plan.shapes_seen != seen or plan.stride != graph.entry["values_stride"]
            or plan.period != graph.entry["period"]):  # (a period set with no check)
        graph.note(**coverage.of(plan))
    wrapped(plan, began, spent)
    if why is None:
        res = compiled_call(graph, args)
        if plan.dynamic and large_output_is_new(graph, res) and graph.pending is None:
            return timed(graph, args, flat, boxed, schedule.SHAPE, res)
        return res
    if graph.pending is not None:  # one check at a time: the last one's verdict first
        pending.settle(graph, wait=True)
        if graph.fast is not None:
            return graph.fast(*args)
    return timed(graph, args, flat, boxed, why, None)


def elsewhere(counted: bool) -> bool:
    """Where only the count answered (``counted``), a capture begun outside torch's graph
    classes (a C++ extension's own), which the runtime alone sees: asked before a call
    reads a verdict, its inputs or checks, none of which may run inside a capture. Such a
    capture's quiet calls are counted (the one case where ranks may number calls apart)."""
    return counted and capture.capturing(torch)


def wrapped(plan: schedule.Schedule, began: float, spent: float, calls: int = 1) -> None:
    """Count in the ledger, and in ``plan``'s own (its checks answer to it:
    ``schedule.checks_share``), what the wrapper took of a call since ``began`` beyond what
    the ledger counted meanwhile (``spent`` then: the reads ``due`` made count themselves),
    for ``calls`` calls (a quiet call timed stands for those not timed)."""
    ledger = schedule.LEDGER
    seconds = calls * max(time.perf_counter() - began - (ledger.spent - spent), 0.0)
    ledger.wrapper += seconds
    if plan.clock is not None:  # the first calls' wrapper is not set against the budget
        plan.wrapper += seconds


def large_output_is_new(graph: Graph, res: Any) -> bool:
    """An output of 2^31 bytes or elements or more, where no checked call had one, from
    a graph that writes none of its inputs (so it can be checked after the call)."""
    if (graph.schedule.large_output_checked or not graph.analyses
            or any(a.mutated for a in graph.analyses.values())):
        return False
    return schedule.large(numerics.leaves(res))


def timed(graph: Graph, args: Tuple[Any, ...], flat: List[Any], boxed: bool, why: str,
          res: Any) -> Any:
    """One checked call, its seconds added to the graph's record."""
    busy.checking = True
    start = time.perf_counter()
    try:
        return Check(graph, args, flat, boxed, why, res).run()
    finally:
        busy.checking = False
        with record.LOCK:
            graph.entry["seconds"] = round(graph.entry["seconds"]
                                          + time.perf_counter() - start, 3)
