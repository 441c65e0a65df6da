"""Exact float64 stand-ins for the ops that have no float64 kernel, so that one such op does
not leave the whole graph without its float64 reference.

A grouped GEMM (``torch._grouped_mm``, which ``torch.nn.functional.grouped_mm`` calls) takes
bfloat16, float16 and float32 only ("Expected mat_a to be Float32, BFloat16 or Float16
matrix, got Double"), and the Mixture-of-Experts layers of transformers 5 call it
(``transformers/integrations/moe.py``, ``_grouped_mm``): before this, every graph of a
Mixtral-, Qwen-MoE- or DeepSeek-shaped model was skipped. Its stand-in is its definition (one
GEMM per group, ``torch/nn/functional.py``, ``grouped_mm``) computed in float64 by ``mm``:
exact, so the judge's allowance is unchanged and the rest of the graph keeps its float64
truth. It reads the group offsets on the host, one synchronisation a call, as transformers'
own fallback does: a capture cannot hold that, so a graph that calls one has its references
run op by op, never captured as a device graph (``replay.unreplayable_ops``). Rows (or
columns) past the last offset, which torch's kernel leaves uninitialised, are not computed:
such a call's reference fails and its check says so.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch


def grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None
               ) -> torch.Tensor:
    """``torch._grouped_mm`` by its definition, in the dtype of its operands (float64 here:
    ``out_dtype`` names a narrower accumulation, which the truth does not take)."""
    if bias is not None:  # no torch release here accepts one (a kernel's "not supported")
        raise NotImplementedError("the float64 stand-in of a grouped GEMM takes no bias")
    if offs is None:  # both 3-D: a batched GEMM, group by group
        return torch.bmm(mat_a, mat_b)
    ends: List[int] = [int(e) for e in offs.tolist()]
    spans = list(zip([0] + ends[:-1], ends))
    if mat_a.dim() == 2 and mat_b.dim() == 3:  # the rows of mat_a in groups (MoE forward)
        if ends and ends[-1] != mat_a.size(0):
            raise NotImplementedError("rows past the grouped GEMM's last offset are "
                                      "uninitialised in torch's kernel")
        out = mat_a.new_zeros(mat_a.size(0), mat_b.size(-1))
        for group, (start, end) in enumerate(spans):
            if end > start:
                out[start:end] = torch.mm(mat_a[start:end], mat_b[group])
        return out
    if mat_a.dim() == 2:  # both 2-D: the shared dimension in groups (a weight gradient)
        out = mat_a.new_zeros(len(spans), mat_a.size(0), mat_b.size(1))
        for group, (start, end) in enumerate(spans):
            if end > start:
                out[group] = torch.mm(mat_a[:, start:end], mat_b[start:end])
        return out
    if ends and ends[-1] != mat_b.size(1):  # the columns of mat_b in groups
        raise NotImplementedError("columns past the grouped GEMM's last offset are "
                                  "uninitialised in torch's kernel")
    out = mat_a.new_zeros(mat_a.size(1), mat_b.size(1))
    for group, (start, end) in enumerate(spans):
        if end > start:
            out[:, start:end] = torch.mm(mat_a[group], mat_b[:, start:end])
    return out


def _table() -> Dict[Any, Callable[..., Any]]:
    """What the running torch names the ops that have a stand-in (older releases have none
    of them)."""
    table: Dict[Any, Callable[..., Any]] = {}
    native = getattr(torch, "_grouped_mm", None)
    if native is not None:  # the Python binding, its ATen op and the op's overload
        packet = torch.ops.aten._grouped_mm
        table.update(dict.fromkeys((native, packet, packet.default), grouped_mm))
    functional = getattr(torch.nn.functional, "grouped_mm", None)
    if functional is not None:
        table[functional] = grouped_mm
    return table


STAND_INS = _table()


def synchronises(target: Any) -> bool:
    """Does ``target``'s stand-in read a device tensor on the host (all of them do)?"""
    return for_target(target) is not target


def for_target(target: Any) -> Any:
    """The float64 run's target for a node's ``target``: its stand-in, or itself."""
    try:
        return STAND_INS.get(target, target)
    except TypeError:  # an unhashable target (a bound method, say) has none
        return target
