"""A graph that computes wrong numbers: its record, its repro, its warning, and under
``fallback`` eager's result for the call that found it.

One warning per graph names it (the user's line), what differs and by how much under which
rule, the call it was found at and how many calls ran unchecked before, the repro directory
and what to do next. A graph compiled with a remembered fix that fails again forgets it.
"""

from __future__ import annotations

from typing import Any, List

from rocm_autopatch import log, settings
from rocm_autopatch.sentinel.healing import fixes, repro
from rocm_autopatch.sentinel.judging.status import FAILED, FELL_BACK, REF
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
    log.warn_once(("verify", id(graph)), _warning(graph, m, outputs, why, folder,
                                                  falling_back))
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
    """The warning, a line a thing: which graph and what differs under which rule first,
    then when it was found, the details, what happened to the results, the repro and what
    to do, the evidence. The report keeps the rest (``report().verify``)."""
    plan = graph.schedule
    lines = [f"numerics: {graph.label()} computes wrong numbers when compiled: "
             + (headline(m, outputs, graph.gm) if m is not None
                else f"the backward pass differs ({graph.entry['backward']})")]
    if plan.calls > 1:
        unverified = graph.entry["unverified_calls"]
        lines.append(f"Found at call {plan.calls:,} ({schedule.BECAUSE[why]})" + (
            f"; the {unverified:,} call(s) since its last good check (call "
            f"{plan.last_good:,}) ran compiled and may have returned wrong numbers"
            if unverified else ""))
    if m is not None:
        lines.append(f"rule: {detail(m)}")
    lines.append("This call returned eager's result and this graph runs eagerly from now on; "
                 "other graphs stay compiled" if falling_back else
                 f"Your results are the compiled ones, unchanged: set {ENV}=fallback to run "
                 "this graph eagerly instead")
    if folder:
        lines.append(f"repro: attach {folder} to a report (`python {folder}/repro.py` exits 1 "
                     "while it reproduces; env.json is the environment)")
        lines.append(f"next: a bisection starts in the background at exit to name the "
                     f"compiler step and remember the fix for the next run "
                     f"({settings.VERIFY_BISECT}=0: not)" if falling_back and bisect_limit()
                     else f"next: `rocm-autopatch bisect {folder}` names the compiler step "
                     "and remembers the fix for the next run")
    else:
        lines.append("repro: TORCHDYNAMO_REPRO_AFTER=aot TORCHDYNAMO_REPRO_LEVEL=4 writes a "
                     "minimal one, and `rocm-autopatch doctor --json` the environment")
    lines.append(f"why it matters: compiled kernels that silently compute wrong numbers have "
                 f"been reported on AMD GPUs ({REF})")
    return "\n  ".join(lines)


def headline(m: Any, outputs: int, gm: Any) -> str:
    """The first rejected value in a few words: which, shape and dtype, by how much, the
    rule that rejected it."""
    if m.index < outputs:
        where = numerics.origin(gm, m.index)
        what = f"output {m.index}" + (f" (made at {where})" if where else "")
    else:
        what = f"the input it writes (#{m.index - outputs})"
    return (f"{what}, shape {list(m.shape)}, {m.dtype}, differs from eager by up to "
            f"{m.max_abs_diff:.3g} ({m.rule} rule)")


def detail(m: Any) -> str:
    """What the rule measured: its detail, the errors against float64, torch's verdict."""
    text = f"{m.rule}: {m.detail}"
    if m.compiled_rmse is not None and m.eager_rmse is not None:
        text += (f"; error against float64: compiled {m.compiled_rmse:.3g}, eager "
                 f"{m.eager_rmse:.3g} (RMSE)")
    if m.torch_ok:
        text += "; torch's own criterion alone would have passed it"
    return text
