"""One call of a graph run checked: the steps in order, each able to end the check early.

``Check.run`` reads as the sequence: analyse what the graph writes (once per shape), decide
whether it can be compared at all, whether its references fit in memory, copy the state it
writes, run it compiled, compute eager and float64, judge, then the backward pass. A step
that cannot go on records why (the graph is skipped for good, or this one check is) and the
call returns the compiled result; the program's call is never lost to a check.

Under ``check``, where a shape's references are captured and gradients are off, the call
returns once its references are launched beside the program (``runs.deferred``), and a
later call reads the verdict (``settle``; ``Check.resolve``).
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from rocm_autopatch import record
from rocm_autopatch.sentinel.healing import alarm
from rocm_autopatch.sentinel.judging import judge
from rocm_autopatch.sentinel.judging.status import FAILED, PASSED, PENDING, SKIPPED
from rocm_autopatch.sentinel.runs import (
    backward,
    deferred,
    footprint,
    memory,
    numerics,
    snapshot,
)
from rocm_autopatch.sentinel.runs.graph import Graph, busy
from rocm_autopatch.sentinel.scheduling import magnitudes, schedule


class Check:
    """The state of one checked call, from its inputs to its verdict."""

    def __init__(self, graph: Graph, args: Tuple[Any, ...], flat: List[Any], boxed: bool,
                 why: str, res: Any) -> None:
        import torch

        self.graph = graph
        self.grad = torch.is_grad_enabled()  # at the call (a deferred verdict comes later)
        self.args = args
        self.boxed = boxed
        self.why = why
        self.res = res  # set: the call already ran, and wrote nothing
        self.count = len(flat)
        # From here, flat is the inputs followed by the tensors the graph holds itself.
        held = numerics.held(graph.gm)
        self.flat = flat + [held[name] for name in graph.names]
        self.analysis: Any = None
        self.shape: Any = None  # the shape signature the analysis and captures are kept by
        self.need = 0  # the bytes its references need (the analysis' estimate)
        self.device: Any = None
        self.pre: Any = None  # the state the call writes, as it was before the call
        self.values: Any = None  # the inputs' magnitudes now
        self.call_seconds = 0.0
        self.work_start = 0.0
        self.prepared = 0.0  # a deferred check: its seconds before the compiled call
        self.later: Any = None  # a deferred check's work on the device (runs.deferred)
        self.at_call = graph.schedule.calls  # which call of the graph this is
        self.calling = False  # inside the program's own compiled call

    def run(self) -> Any:
        try:
            if (self.unanalysable() or self.not_comparable() or self.too_large()
                    or self.not_copied()):
                return self.unchecked()
            if self.deferred() or self.wrote_unforeseen():
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

    def unchecked(self) -> Any:
        """This call's result, without a check."""
        return self.graph.compiled(*self.args) if self.res is None else self.res

    # ---- the steps, each True where the check ends there ---------------------------------

    def unanalysable(self) -> bool:
        """What the graph writes, from a run on fake tensors (once per shape)."""
        graph = self.graph
        signature = self.shape = graph.schedule.signature(self.flat)
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
        import torch

        plan = self.graph.schedule
        if plan.magnitudes is None:
            watch = magnitudes.watched_inputs(self.flat, self.count, self.analysis.mutated)
            plan.magnitudes = magnitudes.Magnitudes(
                watch, magnitudes.integer_inputs(self.flat, watch))
        need = self.need = footprint.reference_bytes(
            self.analysis.footprint,
            snapshot.Snapshot.bytes_needed(self.flat, self.analysis.mutated))
        self.device = next((t.device for t in self.flat if isinstance(t, torch.Tensor)), None)
        room = memory.free_bytes(self.device) if self.device is not None else None
        if room is None or need <= room * memory.SHARE:
            return False
        self.graph.skip(f"not checked: its eager and float64 references would need about "
                        f"{need / 2**30:.2f} GiB, more than half of the "
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

    def deferred(self) -> bool:
        """Under ``check``, with no gradient to check and this shape's references captured:
        run the call, launch its references beside the program and return (True); the
        verdict is read at a later call (``settle``). False where it is judged at the call."""
        import torch

        graph = self.graph
        if self.res is not None or graph.how != "check" or self.grad and any(
                isinstance(x, torch.Tensor) and x.requires_grad for x in self.flat):
            return False  # (with gradients, the backward pass is checked at the call)
        captured = graph.replays.ready(self.shape, self.flat, self.pre)
        if captured is None:
            return False
        self.prepared = time.perf_counter() - self.work_start
        later = deferred.Later(captured, self.device)
        before = numerics.versions(self.flat)
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
        self.later = later
        graph.pending = self
        _waiting(graph)
        return True

    def resolve(self) -> None:
        """A deferred check's verdict, once its references have run (``settle``): judged on
        the sentinel's stream (its reads wait for nothing of the program's)."""

        graph, later = self.graph, self.later
        try:
            later.wait()  # done already, unless a check fell due or the process exits
            moved = later.overwritten(self.flat, self.analysis.mutated)
            if moved:
                graph.replays.written_later(self.shape, moved)
                graph.skip(f"not checked: the program wrote inputs {moved} in place before "
                           "the references, replayed beside it, had read them (copied "
                           "from the next capture on)")
                return
            self.call_seconds = later.call_seconds()
            # the check's own time: before the call, its launch, and from here
            self.work_start = time.perf_counter() - (self.prepared + later.launch_seconds
                                                     + self.call_seconds)
            self.res = later.result()
            graph.note(references=graph.replays.why,
                       checks_read_later=graph.entry["checks_read_later"] + 1)
            plan, now = graph.schedule, graph.schedule.calls
            plan.calls = self.at_call  # the verdict is the checked call's: the schedule and
            try:  # the record (``found_at_call``) read its number
                with later.judging(), numerics.quiet():
                    bad, outputs = judged(graph, later.runs, self.pre, later.outputs,
                                          later.after)
                    self.verdict(bad, outputs)
            finally:
                plan.calls = now
                graph.note(**schedule.coverage(plan))
        except Exception as exc:  # noqa: BLE001 - a check never costs the program anything
            graph.skip(f"not checked: the check itself failed ({type(exc).__name__}: "
                       f"{memory.first_line(exc)})")
            memory.release()
        finally:
            later.release()

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
        """(the values the judge rejects, how many of them are outputs); None where the
        references could not be computed (the check is skipped)."""
        try:
            with numerics.quiet():
                return references(self.graph, self.flat, self.pre, self.res,
                                  sorted(self.analysis.mutated), self.shape, self.need)
        except Exception as exc:  # noqa: BLE001 - out of memory, no float64 kernel (FP8)...
            self.graph.skip("not checked: computing the eager or float64 reference "
                            f"failed ({type(exc).__name__}: {memory.first_line(exc)})")
            memory.release()
            return None

    def verdict(self, bad: List[Any], outputs: int) -> Any:
        """The backward pass where the forward passed, the schedule told, the record kept;
        a graph that differs raises the alarm."""

        graph = self.graph
        grad = self.grad
        if not grad:
            graph.note(backward="not applicable: gradients are off (inference)")
        elif not bad:
            graph.note(backward=backward.check(graph, self.flat, self.pre, self.res,
                                               self.boxed))
        passed = not bad and not graph.entry["backward"].startswith(FAILED)
        graph.schedule.checked(self.why, self.flat, self.values, passed, self.call_seconds,
                               time.perf_counter() - self.work_start,
                               numerics.leaves(self.res))
        with record.LOCK:
            graph.entry["calls_checked"] += 1
            graph.entry.update(schedule.coverage(graph.schedule))
        if bad:
            if grad:
                graph.note(backward="not checked: the forward pass already differs")
            return alarm.raise_alarm(graph, bad[0], outputs, self.why, self.flat, self.pre,
                                     self.res, grad, "forward")
        if not passed:
            return alarm.raise_alarm(graph, None, outputs, self.why, self.flat, self.pre,
                                     self.res, grad, "backward")
        if graph.entry["status"] in (PENDING, SKIPPED):
            graph.settle(PASSED)
        return self.res


def references(graph: Graph, flat: List[Any], pre: Any, res: Any, mutated: List[int],
               shape: Any = None, need: int = 0) -> Tuple[List[Any], int]:
    """Eager and float64 run on the same inputs: what they write goes to copies of the
    state before the call (overlapping views still overlap); what they only read is
    shared, never copied."""
    runs = reference_runs(graph, flat, pre, shape, need)
    return judged(graph, runs, pre, numerics.leaves(res), {i: flat[i] for i in mutated})


def judged(graph: Graph, runs: Tuple[Any, ...], pre: Any, res: List[Any],
           after: Dict[int, Any]) -> Tuple[List[Any], int]:
    """The judge's verdict on one call: ``runs`` (``reference_runs``' result) against the
    compiled outputs ``res`` (flattened) and the written inputs as the call left them
    (``after``, by index): (the values it rejects, how many of them are outputs)."""
    import torch

    eager_inputs, inputs64, ref, ref64, kept = runs
    derived = {i: judge.Derived(op, [kept.get(n, n) if isinstance(n, torch.fx.Node)
                                     else n for n in nodes], dtype, dim, keepdim)
               for i, (op, nodes, dtype, dim, keepdim) in graph.derived.items()}
    outputs = len(numerics.leaves(ref))
    empty = {i: f"uninitialised memory ({op})" for i, op in graph.uninitialised.items()}
    written = written_regions([(pre.before(i), eager_inputs[i], after[i], inputs64[i])
                               for i in sorted(after)])
    verdict = judge.compare(numerics.leaves(ref) + [w[0] for w in written],
                            res + [w[1] for w in written],
                            numerics.leaves(ref64) + [w[2] for w in written],
                            judge.TOL_FORWARD, derived, skip=empty,
                            allowed=judge.Allowance(*graph.allowed))
    ulps, function = graph.allowed
    graph.note(judge={"ours": "failed" if verdict.bad else "passed",
                      "torch_criterion": "failed" if verdict.torch_failed else "passed",
                      "math_allowance": f"{function}: {ulps:g} ULPs (float32)" if ulps
                      else "none",
                      **{k: round(v, 3) if isinstance(v, float) else v
                         for k, v in verdict.stats.items()}})
    return verdict.bad, outputs


def reference_runs(graph: Graph, flat: List[Any], pre: Any, shape: Any = None,
                   need: int = 0) -> Tuple[Any, ...]:
    """Eager's and float64's inputs and results, and the float64 values the judge keeps:
    replayed where this shape's references are captured on the device (``replay``), else
    run op by op. Run in inference mode: without autograd's bookkeeping per op a decode
    step's references took 6% less on an H100, alternating the two modes check by check
    (BENCHMARKS.md). Its results never reach the program (``fallback``
    runs the graph again on the program's own tensors). A graph that refuses inference
    mode (an op that will not take its tensors), and runs under ``no_grad``, is run so from
    then on; running out of memory says nothing of that, and is not retried."""
    import torch

    replays = graph.replays
    if shape is not None:
        replayed = replays.replayed(shape, graph, flat, pre, graph.inference_mode, need)
        if graph.entry["references"] != replays.why:
            graph.note(references=replays.why)
        if replayed is not None:
            return replayed
    inference = graph.inference_mode
    while True:
        made, made64 = pre.make(), pre.make(fp64=True)  # fresh: a failed run wrote them
        eager_inputs = [made.get(i, x) for i, x in enumerate(flat)]
        inputs64 = [made64.get(i, x) for i, x in enumerate(flat)]
        kept: Dict[Any, Any] = {}
        try:
            with torch.inference_mode() if inference else torch.no_grad():
                ref = graph.eager_run(*eager_inputs)
                ref64 = graph.fp64_run(*inputs64, kept=kept)
        except Exception as exc:
            if not inference or memory.out_of_memory(exc):
                raise
            inference = False
            continue
        graph.inference_mode = inference
        if shape is not None:
            replays.ran(shape, flat)
        return eager_inputs, inputs64, ref, ref64, kept


Written = Tuple[Any, Any, Any, Any]  # a written input: before, eager, compiled, float64


def written_regions(items: List[Written]) -> List[Tuple[Any, Any, Any]]:
    """Written inputs as the judge sees them: the elements that eager or compiled changed,
    flattened (the rest is the state before the call in both, and judging it would dilute
    the statistics: a static KV cache is written one position per decode step, and judging
    all of it was most of a decode check's time). Inputs of one shape and dtype are judged
    at the elements any of them changed, found with one synchronisation (a decode step's
    16 caches, written at the same position: one, not 16). Where everything or nothing
    changed, the whole inputs."""
    import torch

    found: List[Any] = [None] * len(items)
    groups: Dict[Any, List[int]] = {}
    for k, item in enumerate(items):
        if _comparable(*item):
            groups.setdefault((item[0].shape, item[0].dtype, item[0].device), []).append(k)
        else:
            found[k] = item[1:]
    for ks in groups.values():
        changed = None
        for k in ks:  # in place: two ops a value (a decode check is Python-bound)
            before, eager, compiled, _ = items[k]
            if changed is None:
                changed = eager != before
            else:
                changed |= eager != before
            changed |= compiled != before
        where = changed.flatten().nonzero().squeeze(1)
        whole = where.numel() in (0, changed.numel())
        for k in ks:  # ``take`` indexes the elements in order, whatever the strides
            found[k] = items[k][1:] if whole else tuple(torch.take(x, where)
                                                        for x in items[k][1:])
    return found


def _comparable(before: Any, eager: Any, compiled: Any, fp64: Any) -> bool:
    import torch

    return (isinstance(before, torch.Tensor) and isinstance(eager, torch.Tensor)
            and isinstance(compiled, torch.Tensor) and isinstance(fp64, torch.Tensor)
            and before.shape == eager.shape == compiled.shape == fp64.shape
            and eager.dtype == compiled.dtype == before.dtype)


def call(graph: Graph, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """One call of ``graph``: run compiled, or checked where the schedule says it is due.
    Never checked inside graph capture (nothing may synchronise there), on fake tensors
    (a compiler's propagation), inside another check, or while another thread checks it."""
    import torch

    from rocm_autopatch.guards import capture

    if kwargs or getattr(busy, "checking", False) or capture.capturing(torch) or \
            numerics.fake_call(args) or not graph.lock.acquire(blocking=False):
        # Inside graph capture nothing may synchronise; fake tensors are a compiler's
        # propagation, not the program's call; another thread is checking it.
        return graph.compiled(*args, **kwargs)
    try:
        if graph.pending is not None:
            settle(graph, wait=False)
        if graph.fast is not None:
            return graph.fast(*args)
        flat, boxed = graph.inputs(args)
        if flat is None:
            graph.finish(SKIPPED, "not checked: called with inputs that do not match the "
                                 "graph")
            return graph.compiled(*args)
        plan = graph.schedule
        seen = plan.shapes_seen
        try:
            why = plan.due(flat)
        except Exception:  # noqa: BLE001 - an input it cannot read: this call runs unchecked
            why = None
        graph.entry["calls"] = plan.calls
        if plan.shapes_seen != seen or plan.stride != graph.entry["values_stride"]:
            graph.note(**schedule.coverage(plan))
        if why is None:
            res = graph.compiled(*args)
            if plan.dynamic and large_output_is_new(graph, res) and graph.pending is None:
                return timed(graph, args, flat, boxed, schedule.SHAPE, res)
            return res
        if graph.pending is not None:  # one check at a time: the last one's verdict first
            settle(graph, wait=True)
            if graph.fast is not None:
                return graph.fast(*args)
        return timed(graph, args, flat, boxed, why, None)
    finally:
        graph.lock.release()


# Graphs whose last check's verdict is not read yet (``Check.deferred``); read at exit at the
# latest, before the verdict line and the compile report (registered later, run first).
_WAITING: List[Graph] = []
_EXIT = threading.Lock()


def _waiting(graph: Graph) -> None:
    with _EXIT:
        if not _WAITING and not getattr(_waiting, "registered", False):
            atexit.register(settle_all)
            _waiting.registered = True  # type: ignore[attr-defined]
        if graph not in _WAITING:
            _WAITING.append(graph)


def settle(graph: Graph, wait: bool) -> None:
    """Read the verdict of ``graph``'s deferred check where its device work is done, or
    waiting for it (``wait``: a check fell due, or the process exits). The caller holds
    ``graph.lock``."""
    pending = graph.pending
    if pending is None or not (wait or pending.later.finished()):
        return
    graph.pending = None
    with _EXIT:
        if graph in _WAITING:
            _WAITING.remove(graph)
    busy.checking = True
    start = time.perf_counter()
    try:
        pending.resolve()
    finally:
        busy.checking = False
        with record.LOCK:
            graph.entry["seconds"] = round(graph.entry["seconds"]
                                          + time.perf_counter() - start, 3)


def settle_all() -> None:
    """At exit: every verdict not read yet (a thread still checking is waited for 10 s)."""
    with _EXIT:
        graphs = list(_WAITING)
    for graph in graphs:
        if graph.lock.acquire(timeout=10):
            try:
                settle(graph, wait=True)
            except Exception:  # noqa: BLE001 - never at exit
                pass
            finally:
                graph.lock.release()


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
