"""One call's references and the judge's verdict on it: eager and float64 run on copies of
the state the call writes (replayed as a device graph where captured, ``runs.replay``, else
op by op), the regions of the written inputs that changed (``regions``), and the judged
values; where a choice the graph computes on was a near tie (``judging.choices``), what it
reaches excused or the references run again with the tie taken each way (``branches``).
Used by a check judged at the call (``check``) and by one whose verdict is read later
(``pending``); for the latter, on a GPU, the judge's device work for a layout of values
seen before is replayed as a captured graph (``judging.errors.Captures``, captured by
``_captured_judge``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from rocm_autopatch.sentinel import regions
from rocm_autopatch.sentinel.judging import choices, errors, judge
from rocm_autopatch.sentinel.runs import capturing, memory, numerics, reference
from rocm_autopatch.sentinel.runs.graph import Graph

# Tied (choice, row) pairs, in the whole graph, up to which every way of taking them is
# tried (2: the references run four times more, in the rare call that needs it).
BRANCH_ROWS = 2


class Undecided(Exception):
    """The call's results differ where one of its choices was a near tie in float64
    (``judging.choices``): not judged; the message says why, the caller names the call.
    ``bad``: what the judge rejected."""

    def __init__(self, message: str, bad: List[Any]) -> None:
        super().__init__(message)
        self.bad = bad


def references(graph: Graph, flat: List[Any], pre: Any, res: Any, mutated: List[int],
               shape: Any = None, need: int = 0, tries: bool = True, later: bool = False
               ) -> Tuple[List[Any], int]:
    """Eager and float64 run on the same inputs: what they write goes to copies of the
    state before the call (overlapping views still overlap); what they only read is
    shared, never copied. Where a near tie leaves the verdict undecided, the other ways
    of taking the tie are tried (``branches``), unless ``tries`` is off (a call whose
    backward is checked: its gradients would follow the other way too). ``later``: the
    graph's next checks may read their verdicts later (``pending``), judged from captures:
    where this check captured its references, the judge's statistics are captured too."""
    runs = reference_runs(graph, flat, pre, shape, need)
    res, after = numerics.leaves(res), {i: flat[i] for i in mutated}
    try:
        return judged(graph, runs, pre, res, after, expected=later and graph.replays.fresh)
    except Undecided as why:
        if not tries:
            raise
        why.__traceback__ = None  # its frames hold the first runs' values
        kept = {c.operand: runs[4].get(c.operand) for c in graph.choices}
        del runs  # the runs again take the memory these took, not twice it
        try:
            found = branches(graph, flat, pre, res, after, kept, why.bad)
        except Exception:  # noqa: BLE001 - a way that cannot be run: undecided, as before
            found = None
        if found is None:
            raise why from None
        return found


def branches(graph: Graph, flat: List[Any], pre: Any, res: List[Any], after: Dict[int, Any],
             kept: Dict[Any, Any], bad: List[Any]) -> Optional[Tuple[List[Any], int]]:
    """Compiled's results against the references run again with every top-k, argmax or
    max/min that can be told taking float64's choice, each tied row each way (in both
    references): one way that passes explains the difference (compiled took the tie the
    other way, as legitimately): nothing rejected. None passes: ``bad`` stands, unless a
    window twice as wide finds more tied rows (eager and compiled may drift further apart
    than the window: undecided). None where it cannot be told: more than ``BRANCH_ROWS``
    tied (choice, row) pairs in all, three candidates within the window of one boundary,
    a tied sort, a NaN in a choice's operand, a graph that holds its own parameters."""
    import itertools

    import torch

    if graph.names:
        return None
    rows = {c: choices.tied_rows(c, kept.get(c.operand)) for c in graph.choices}
    told = [c for c in graph.choices if c.op != "sort" and rows[c] is not None]
    tied = []
    for c, where in rows.items():
        if where is not None and bool(where.any()):
            if c.op == "sort" or bool(choices.tied_rows(c, kept[c.operand], crowded=True).any()):
                return None
            tied += [(c, tuple(r)) for r in where.nonzero().tolist()]
    if not tied or len(tied) > BRANCH_ROWS or any(
            bool(torch.isnan(kept[c.operand]).any()) for c in told):
        return None
    nodes = {n.name: n for n in graph.gm.graph.nodes}
    for flipped in itertools.chain.from_iterable(itertools.combinations(tied, n)
                                                 for n in range(len(tied) + 1)):
        forced = {}
        for c in told:
            taken = choices.branch(c, kept[c.operand], [r for d, r in flipped if d is c])
            forced[nodes[c.name]] = (lambda run, c=c, taken=taken: choices.taken(
                c, run.env[c.operand], taken))
        found, outputs = judged(graph, _forced_runs(graph, flat, pre, forced), pre, res,
                                after, ties=False, note=False)
        if not found:
            return [], outputs
    wide = (choices.tied_rows(c, kept.get(c.operand), ulps=2 * choices.CHOICE_ULPS)
            for c in graph.choices)
    wider = sum(int(where.sum()) for where in wide if where is not None)
    return None if wider > len(tied) else (bad, outputs)


def _forced_runs(graph: Graph, flat: List[Any], pre: Any, forced: Dict[Any, Any]
                 ) -> Tuple[Any, ...]:
    """``reference_runs``' result, op by op, with the nodes in ``forced`` returning what it
    says (both references taking the same choices)."""
    import torch

    class Forced(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            return forced[n](self) if n in forced else super().run_node(n)

    made, made64 = pre.make(), pre.make(fp64=True)
    eager_inputs = [made.get(i, x) for i, x in enumerate(flat)]
    inputs64 = [made64.get(i, x) for i, x in enumerate(flat)]
    kept: Dict[Any, Any] = {}
    with torch.inference_mode() if graph.inference_mode else torch.no_grad():
        ref = Forced(graph.gm).run(*eager_inputs)
        ref64 = graph.fp64_run(*inputs64, kept=kept, forced=forced)
    return eager_inputs, inputs64, ref, ref64, kept


def judged(graph: Graph, runs: Tuple[Any, ...], pre: Any, res: List[Any],
           after: Dict[int, Any], ties: bool = True, note: bool = True,
           replayed: bool = False, expected: bool = False) -> Tuple[List[Any], int]:
    """The judge's verdict on one call: ``runs`` (``reference_runs``' result) against the
    compiled outputs ``res`` (flattened) and the written inputs as the call left them
    (``after``, by index): (the values it rejects, how many of them are outputs). A value
    that differs where a choice that was a near tie reaches is excused; ``Undecided`` where
    nothing else differs. ``replayed``: the judge's device work for a layout of values seen
    before is replayed from its capture (a verdict read later, ``pending``); ``expected``:
    its layout will be (the shape's references were just captured), captured now."""
    import torch

    eager_inputs, inputs64, ref, ref64, kept = runs
    derived = {i: judge.Derived(op, [kept.get(n, n) if isinstance(n, torch.fx.Node)
                                     else n for n in nodes], dtype, dim, keepdim)
               for i, (op, nodes, dtype, dim, keepdim) in graph.derived.items()}
    outputs = len(numerics.leaves(ref))
    written = regions.written_regions([(pre.before(i), eager_inputs[i], after[i], inputs64[i])
                                       for i in sorted(after)])
    if (replayed or expected) and graph.judges is None:
        graph.judges = errors.Captures(_captured_judge)
    captures = graph.judges if replayed or expected else None
    allowed = judge.Allowance(*graph.allowed, *graph.narrowing(sorted(after)))
    if captures is not None:
        captures.expected = expected
    try:
        verdict = judge.compare(numerics.leaves(ref) + [w[0] for w in written],
                                res + [w[1] for w in written],
                                numerics.leaves(ref64) + [w[2] for w in written],
                                judge.TOL_FORWARD, derived, skip=graph.not_compared,
                                allowed=allowed, captures=captures)
    finally:
        if captures is not None:
            captures.expected = False
    ulps, function = graph.allowed
    bad, undecided = verdict.bad, None
    if bad and graph.choices and ties:
        try:
            bad = _past_ties(graph, bad, kept, outputs, sorted(after))
        except Undecided as why:
            undecided = why
    if note:
        graph.note(judge={"ours": "not judged (a near tie)" if undecided else
                          "failed" if bad else "passed",
                          "torch_criterion": "failed" if verdict.torch_failed else "passed",
                          "math_allowance": f"{function}: {ulps:g} ULPs (float32)" if ulps
                          else "none",
                          "reference_precision": allowed.narrowed or "float64",
                          **{k: round(v, 3) if isinstance(v, float) else v
                             for k, v in verdict.stats.items()}})
    if undecided is not None:
        raise undecided
    return bad, outputs


def _captured_judge(work: Any, device: Any) -> Tuple[Any, Any]:
    """``work`` (the judge's device work for one layout of values, ``errors.Captures``)
    captured as a device graph on the sentinel's capture stream: (the graph, its outputs)."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with capturing.on_stream(device):
        out = capturing.capture_into(graph, work, device)
    return graph, out


def _past_ties(graph: Graph, bad: List[Any], kept: Dict[Any, Any], outputs: int,
               written: List[int]) -> List[Any]:
    """The rejected values a near tie does not excuse: those no tied choice reaches (an
    earlier layer's cache write) and those compiled made NaN or inf (no choice does that).
    Raises ``Undecided`` where none is left."""
    tied = [c for c in graph.choices if choices.near_tie(c, kept.get(c.operand))]

    def reached(m: Any) -> bool:
        if m.nonfinite:
            return False
        if m.index < outputs:
            return any(m.index in c.outputs for c in tied)
        k = m.index - outputs  # a written input; past the placeholders: the graph's state
        return k >= len(written) or written[k] >= len(graph.placeholders) or any(
            written[k] in c.inputs for c in tied)

    left = [m for m in bad if not reached(m)]
    if tied and not left:
        raise Undecided(
            f"its {tied[0].op} ({tied[0].name}) was a near tie in float64, where compiled "
            "code may choose otherwise than eager, and the results differed where that "
            f"choice reaches ({judge.error_figure(bad[0])})", bad)
    return left


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
    replays.fresh = False  # (set again by a capture made now)
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
        except reference.RunAgain:  # op by op on fresh copies (an op without float64?)
            continue
        except Exception as exc:
            if not inference or memory.out_of_memory(exc):
                raise
            inference = False
            continue
        graph.inference_mode = inference
        if shape is not None:
            replays.ran(shape, flat)
        return eager_inputs, inputs64, ref, ref64, kept
