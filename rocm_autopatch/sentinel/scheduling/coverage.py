"""What a graph's schedule covered, for the report: its calls, the checks and why they
ran, the shapes and values checked, the period, the stride and the share of the program's
time the graph's checks and wrapper took (``judging.graph_record`` holds the fields)."""

from __future__ import annotations

from typing import Any, Dict

from rocm_autopatch.sentinel.scheduling.ledger import share_since
from rocm_autopatch.sentinel.scheduling.schedule import Schedule


def of(plan: Schedule) -> Dict[str, Any]:
    """What ``plan``'s checks covered, for the report (one graph)."""
    largest = max(plan.checked_max.values(), default=None)
    return {
        "calls": plan.calls,
        "checked_because": dict(plan.because),
        "shapes": {"dynamic": bool(plan.dynamic),
                   "seen": plan.shapes_seen if plan.dynamic else min(plan.calls, 1),
                   "checked": len(plan.checked_shapes) if plan.dynamic
                   else min(plan.checks, 1)},
        # (with rungs remembered, the largest an earlier process checked counts)
        "values": {"largest_checked": largest,
                   # where the ladder started: rungs an earlier process passed (``rungs``)
                   "remembered": dict(plan.crossings.remembered),
                   # no rung forced below it (``crossings.floor``): 0, none
                   "ladder_floor": round(plan.crossings.floor, 1),
                   "non_finite_checked": bool(plan.checked_non_finite),
                   "inputs_followed": len(plan.magnitudes.watch) if plan.magnitudes
                   else 0,
                   "read_every_call": list(plan.integers.indices)
                   if plan.integers and plan.integers.every_call else [],
                   "stopped": "; ".join(x.stopped for x in (plan.magnitudes, plan.integers)
                                        if x is not None and x.stopped)},
        "period": plan.period, "budget": plan.budget, "values_stride": plan.stride,
        "sampled_calls": list(plan.sampled_calls),
        # until now (graph_record): the checks and the wrapper, the two the period answers to
        "budget_spent": share_since(plan.spent + plan.wrapper, plan.clock),
        "checks_skipped": plan.skipped,
        "large_output_checked": plan.large_output_checked,
    }
