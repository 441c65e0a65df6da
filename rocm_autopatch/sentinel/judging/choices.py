"""Choices a graph makes from floats and computes on (a Mixture-of-Experts router's top-k,
an argmax that indexes, a sort that orders): where float64 sees a near tie there, compiled
code may choose otherwise than eager, as legitimately, and then their results differ by
the whole choice (another expert's output for that token, and all that attends to it).

This module finds them (``find``: the node, its operand, what it reaches), tells a near
tie (``tied_rows``: the gap float64 sees at the choice's boundary, the k-th against the
next value or two neighbours of a sort, within ``CHOICE_ULPS`` rounding units of the
coarsest precision the operand was computed from, scaled by the operand's largest
magnitude along the choice; a bf16 model's router probabilities are float32 values of
bf16 logits) and makes a choice taken one way (``branch``, ``taken``). What the judge
does with them is ``sentinel/compare.py``'s: the references run again with a tie taken
each way, or the call left unjudged. Choices the graph returns (argmax as an output) are
the judge's own rule (``judge._ties``).
"""

from __future__ import annotations

import math
from typing import Any, FrozenSet, List, NamedTuple, Optional, Tuple

import torch
import torch.fx

# Two values this close in float64 may be chosen either way by code that rounds differently:
# eager and compiled differ by a rounding unit or two in the values a choice is made from.
CHOICE_ULPS = 2.0
# top-k-like ops: k, dim and largest from their arguments; (positions of k, dim, largest)
_TOPK = {"topk": (1, 2, 3)}
_ONE = {"argmax": True, "argmin": False, "max": True, "min": False}  # k = 1; largest
_ORDER = ("sort", "argsort")
_INDICES_AT = {"topk": 1, "max": 1, "min": 1, "sort": 1}  # else the node is the indices
_ANCESTORS = 64  # how far back the coarsest precision is looked for


class Choice(NamedTuple):
    name: str  # the node, as a warning names it
    op: str  # "topk", "sort", "argmax" or "argmin"
    operand: torch.fx.Node
    dtype: torch.dtype  # the coarsest precision the operand was computed from
    dim: Optional[int]
    k: int
    largest: bool
    outputs: FrozenSet[int] = frozenset()  # the graph's outputs computed from it
    inputs: FrozenSet[int] = frozenset()  # its inputs (placeholders) written after it
    called: str = ""  # what the node calls (topk, max, argmax...): the form it returns
    keepdim: bool = False


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        return str(target)
    return (getattr(target, "__name__", "") or str(target)).split(".")[0]


def _dtype(node: Any) -> Optional[torch.dtype]:
    value = node.meta.get("example_value", node.meta.get("val")) \
        if isinstance(node, torch.fx.Node) else None
    dtype = getattr(value, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def _coarsest(node: torch.fx.Node) -> Optional[torch.dtype]:
    seen, todo, found = {node}, [node], _dtype(node)
    while todo and len(seen) < _ANCESTORS:
        for parent in todo.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
                dtype = _dtype(parent)
                if dtype is not None and (found is None or
                                          torch.finfo(dtype).eps > torch.finfo(found).eps):
                    found = dtype
    return found


def _computed_on(node: torch.fx.Node, name: str) -> bool:
    """Does the graph compute on the choice (its indices), beyond returning it?"""
    at = _INDICES_AT.get(name)
    users = list(node.users) if at is None else [
        u for u in node.users if u.op == "call_function"
        and getattr(u.target, "__name__", "") == "getitem"
        and len(u.args) > 1 and u.args[1] == at]
    return any(v.op != "output" for u in users for v in ([u] if at is None else u.users))


def _reach(gm: torch.fx.GraphModule, node: torch.fx.Node
           ) -> Tuple[FrozenSet[int], FrozenSet[int]]:
    """The outputs (by index) and the inputs (placeholders, by index) that nodes computed
    from ``node`` return or take: where a choice can move a value. An input a later node
    only reads counts too (a cache read after the choice): erring toward excusing."""
    from torch.utils._pytree import tree_flatten

    seen, todo = {node}, [node]
    while todo:
        for user in todo.pop().users:
            if user not in seen:
                seen.add(user)
                todo.append(user)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = frozenset(i for i, p in enumerate(placeholders)
                       if any(u in seen for u in p.users))
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    leaves = tree_flatten(out.args[0])[0]  # as the judge counts the outputs
    return frozenset(i for i, leaf in enumerate(leaves) if leaf in seen), inputs


def find(gm: torch.fx.GraphModule) -> List[Choice]:
    """The choices ``gm`` makes from floats and computes on."""
    found: List[Choice] = []
    try:
        for node in gm.graph.nodes:
            if node.op not in ("call_function", "call_method") or not node.args:
                continue
            name = _target_name(node)
            args, kwargs = list(node.args), dict(node.kwargs)
            keepdim = False
            if name in _TOPK:
                at_k, at_dim, at_largest = _TOPK[name]
                k = kwargs.get("k", args[at_k] if len(args) > at_k else None)
                dim = kwargs.get("dim", args[at_dim] if len(args) > at_dim else -1)
                largest = kwargs.get("largest", args[at_largest] if len(args) > at_largest
                                     else True)
            elif name in _ONE:
                k, largest = 1, _ONE[name]
                dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
                keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 else False)
                if name in ("max", "min") and not isinstance(dim, int):
                    continue  # a reduction, or an elementwise max: no choice
            elif name in _ORDER:
                k, largest = 0, False
                dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
            else:
                continue
            operand = args[0]
            dtype = _coarsest(operand) if isinstance(operand, torch.fx.Node) else None
            if (dtype is None or not isinstance(k, int) or not isinstance(largest, bool)
                    or not (dim is None or isinstance(dim, int))
                    or not _computed_on(node, name)):
                continue
            op = "sort" if name in _ORDER else "topk" if name in _TOPK else \
                ("argmax" if largest else "argmin")
            found.append(Choice(node.name, op, operand, dtype, dim, k, largest,
                                *_reach(gm, node), name, keepdim is True))
    except Exception:  # noqa: BLE001 - then every difference is judged as it is
        return []
    return found


def near_tie(choice: Choice, values: Any) -> bool:
    """Is ``choice`` a near tie where its operand's float64 value is ``values``?"""
    rows = tied_rows(choice, values)
    return rows is not None and bool(rows.any())


def _rows_last(choice: Choice, x: torch.Tensor) -> torch.Tensor:
    """The operand with the choice's dimension last (flattened where it has none)."""
    return x.flatten() if choice.dim is None else x.movedim(choice.dim, -1)


def tied_rows(choice: Choice, values: Any, ulps: float = CHOICE_ULPS, crowded: bool = False
              ) -> Optional[torch.Tensor]:
    """Where ``choice`` is a near tie (within ``ulps`` rounding units), row by row (the
    operand's other dimensions, in order; one row where it has no dimension); None where
    it cannot be told. ``crowded``: where a third candidate is within the window of the
    boundary too (taking the tie each way would not cover every choice compiled code
    might make)."""
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        return None
    x = _rows_last(choice, values.detach().double())
    if x.dim() == 0 or x.size(-1) < 2:
        return None
    # What is not finite (a router's -inf mask) neither sets the scale nor ties (inf - inf
    # is NaN, which compares false); NaN ranks last.
    finite = torch.isfinite(x)
    scale = x.masked_fill(~finite, 0).abs().amax(-1).clamp(min=1e-30)
    window = ulps * torch.finfo(choice.dtype).eps * scale
    x = x.nan_to_num(nan=-math.inf if choice.largest or choice.op == "sort" else math.inf,
                     posinf=math.inf, neginf=-math.inf)
    if choice.op == "sort":
        return (x.sort(-1).values.diff(dim=-1) <= window.unsqueeze(-1)).any(-1)
    if choice.k < 1 or choice.k >= x.size(-1):
        return None
    ranked = x.topk(min(choice.k + 2, x.size(-1)), -1, largest=choice.largest).values
    near = (ranked[..., choice.k - 1] - ranked[..., choice.k]).abs() <= window
    if not crowded:
        return near
    third = torch.zeros_like(near)
    if choice.k >= 2:
        third |= (ranked[..., choice.k - 2] - ranked[..., choice.k]).abs() <= window
    if choice.k + 1 < ranked.size(-1):
        third |= (ranked[..., choice.k - 1] - ranked[..., choice.k + 1]).abs() <= window
    return near & third


def branch(choice: Choice, values: torch.Tensor, flipped: List[Tuple[int, ...]]
           ) -> torch.Tensor:
    """The indices a top-k or argmax ``choice`` takes on every row: float64's (``values``,
    its operand in float64), with the last one chosen and the next exchanged in the rows
    ``flipped`` (a near tie taken the other way). Choice dimension last."""
    x = _rows_last(choice, values.detach().double()).nan_to_num(
        nan=-math.inf if choice.largest else math.inf)
    ranked = x.topk(choice.k + 1, -1, largest=choice.largest).indices
    taken = ranked[..., :choice.k].clone()
    for row in flipped:
        taken[row + (choice.k - 1,)] = ranked[row + (choice.k,)]
    return taken


def taken(choice: Choice, operand: torch.Tensor, indices: torch.Tensor) -> Any:
    """The value of a top-k, max/min over a dimension or argmax/argmin node that took
    ``indices`` (``branch``) over ``operand`` (this run's own: eager's or float64's), in the
    form the node returns."""
    indices = indices.to(operand.device)
    x = _rows_last(choice, operand)
    values = x.gather(-1, indices)
    if choice.called == "topk":
        return torch.return_types.topk((values.movedim(-1, choice.dim).contiguous(),
                                        indices.movedim(-1, choice.dim).contiguous()))
    index, value = indices[..., 0], values[..., 0]
    if choice.keepdim and choice.dim is None:  # argmax(keepdim=True): every dimension kept
        index = index.reshape([1] * operand.dim())
    elif choice.keepdim:
        index, value = index.unsqueeze(choice.dim), value.unsqueeze(choice.dim)
    if choice.called in ("max", "min"):
        return getattr(torch.return_types, choice.called)((value, index))
    return index
