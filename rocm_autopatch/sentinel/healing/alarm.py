"""A graph that computes wrong numbers: its record, its repro, its warning, and under
``fallback`` eager's result for the call that found it.

One warning per bug, at most six lines: the graph (named by the user's line), the value
that differs with its largest error against float64 and the rule, the call it was found at
and how many ran unchecked before it, what became of the results, the repro directory and
what to do next. The shapes of one graph that fail the same way share a fingerprint: one
warning, one repro, one bisection. The report keeps the rest (``report().verify``). A graph
compiled with a remembered fix that fails again forgets it.
"""

from __future__ import annotations

from typing import Any, List

from rocm_autopatch import frames, log, settings
from rocm_autopatch.sentinel.healing import fixes, repro
from rocm_autopatch.sentinel.judging import judge
from rocm_autopatch.sentinel.judging.status import FAILED, FELL_BACK
from rocm_autopatch.sentinel.runs import numerics
from rocm_autopatch.sentinel.runs.graph import Graph
from rocm_autopatch.sentinel.scheduling import schedule

ENV = settings.VERIFY


def bisect_limit() -> float:
    """``ROCM_AUTOPATCH_VERIFY_BISECT``: seconds a background bisection may take (0: off)."""
    return log.setting(settings.VERIFY_BISECT)


def raise_alarm(graph: Graph, m: Any, outputs: int, why: str, flat: List[Any], pre: Any,
                res: Any, grad: bool, which: str) -> Any:
    """``m``: the first value the judge rejected (None: the backward pass differs); ``why``
    the call was checked; ``flat`` its inputs, ``pre`` their state before it, ``res`` its
    compiled result. The call's result: the compiled one under ``check``, eager's under
    ``fallback``."""
    _record(graph, m, outputs, why)
    bug = repro.fingerprint(graph.gm)  # before ``finish``, which lets the graph go
    falling_back = graph.how == "fallback"
    made = pre.make()  # the inputs as they were before the call, for the repro
    count = len(graph.placeholders)
    folder = repro.write(graph.gm, [made.get(i, x) for i, x in enumerate(flat[:count])],
                         {**graph.entry, "status": FELL_BACK if falling_back else FAILED,
                          "reason": f"{which} differs from eager"})
    graph.note(repro=folder)
    if falling_back:
        # This call gets eager's result, computed on the real inputs from their state
        # before the call (what the compiled call wrote is undone first).
        pre.restore(flat)
        with numerics.grad_mode(grad):
            res = graph.gm(*flat[:count])
    healed = ""
    if graph.healed is not None:
        # The remembered fix did not hold (another shape, other values): not used again.
        healed = (f", even compiled with the remembered fix ({graph.entry.get('healed')}), "
                  "now forgotten")
        fixes.forget(graph.healed.get("fingerprint"))
    plan = graph.schedule
    graph.finish(FELL_BACK if falling_back else FAILED, f"{which} differs from eager"
                 + (f" (at call {plan.calls:,}, {schedule.BECAUSE[why]})"
                    if plan.calls > 1 else "") + healed)
    # One warning per bug: the shapes of one graph share its fingerprint.
    log.warn_once(("verify", bug), _warning(graph, m, outputs, why, folder, falling_back))
    return res


def _record(graph: Graph, m: Any, outputs: int, why: str) -> None:
    plan = graph.schedule
    found = {"mismatch": None if m is None else {
                 **m._asdict(), "what": ("output" if m.index < outputs else "written input"),
                 "origin": numerics.origin(graph.gm, m.index) if m.index < outputs else ""},
             "found_at_call": plan.calls, "found_because": why,
             # The calls between the last check that passed and this one ran unchecked.
             "unverified_calls": max(plan.calls - plan.last_good - 1, 0) if plan.last_good
             else 0}
    if why == schedule.SAMPLED:
        found["found_period"] = plan.sampled_period
    elif why == schedule.VALUES:  # the stride adapts to measured costs afterwards
        found["found_stride"] = plan.values_read_stride
    graph.note(**found)


def _warning(graph: Graph, m: Any, outputs: int, why: str, folder: str,
             falling_back: bool) -> str:
    """At most six lines: which graph, what differs and by how much (the one figure: the
    largest error against float64) under which rule, when it was found, what became of the
    results, the repro and what to do next."""
    plan = graph.schedule
    lines = [f"numerics: {graph.label()} computes wrong numbers",
             headline(m, outputs) if m is not None
             else f"its backward pass differs: {graph.entry['backward']}"]
    if plan.calls > 1:
        unverified = graph.entry["unverified_calls"]
        lines.append(f"found at call {plan.calls:,} ({schedule.BECAUSE[why]})" + (
            f"; {unverified:,} earlier call(s) ran unchecked" if unverified else ""))
    lines.append("results: eager's from this call on, for this graph only (the others stay "
                 "compiled)" if falling_back else
                 f"results: the compiled ones, unchanged ({ENV}=fallback runs this graph "
                 "eagerly)")
    if folder:
        short = frames.short(folder)
        lines.append(f"repro: {short} (attach it to an issue; its repro.py exits 1 while "
                     "it reproduces)")
        lines.append("next: a bisection runs in the background at exit and remembers the "
                     f"fix ({settings.VERIFY_BISECT}=0: not)" if falling_back and
                     bisect_limit() else
                     f"next: `rocm-autopatch bisect {short}` names the compiler step")
    else:
        lines.append("repro: TORCHDYNAMO_REPRO_AFTER=aot TORCHDYNAMO_REPRO_LEVEL=4 writes one")
    return "\n  ".join(lines)


def headline(m: Any, outputs: int) -> str:
    """The first rejected value in a few words: which, shape and dtype, its largest error
    against float64 (eager's beside it), the rule that rejected it."""
    if m.index < outputs:
        what = f"output {m.index}"
    else:
        what = f"the input it writes (#{m.index - outputs})"
    return f"{what} {list(m.shape)} {m.dtype}: {judge.error_figure(m)} (rule: {m.rule})"
