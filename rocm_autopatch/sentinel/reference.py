"""The float64 reference of a graph, run without copying what the graph only reads: each
node's floating inputs are upcast for that node alone, floating dtypes named in the graph
become float64 (as torch's ``cast_dtype_args_to_fp64`` does), and autocast regions are left
as they are (autocast never casts float64). The judge measures compiled and eager against
it; the values of the nodes it is asked to keep (argmax's and comparisons' operands) are
kept.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch
import torch.fx

_FLOAT_UP = {torch.float16: torch.float64, torch.bfloat16: torch.float64,
             torch.float32: torch.float64, torch.complex32: torch.complex128,
             torch.complex64: torch.complex128}
_LOW_PRECISION_METHODS = {"float": "double", "half": "double", "bfloat16": "double"}



def _up(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _FLOAT_UP:
        return value.to(_FLOAT_UP[value.dtype])
    if isinstance(value, torch.dtype) and value in _FLOAT_UP:
        return _FLOAT_UP[value]
    return value


def to_fp64(value: Any) -> Any:
    """A float64 copy of a floating tensor; other values as they are."""
    return _up(value)


def fp64_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` for the float64 run to write into: float64 when floating."""
    up = _up(t)
    return up if up is not t else t.clone()


def _map(fn: Callable[[Any], Any], value: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(fn, value)


class _Fp64Interpreter(torch.fx.Interpreter):
    """Runs a graph in float64, upcasting each node's inputs for that node only; keeps the
    float64 values of the nodes in ``keep`` (what the judge needs)."""

    def __init__(self, gm: torch.fx.GraphModule, keep: Any = ()) -> None:
        super().__init__(gm)
        self.keep = set(keep)
        self.kept: Dict[Any, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        value = self._run_node(n)
        if n in self.keep:
            self.kept[n] = value
        return value

    def _run_node(self, n: torch.fx.Node) -> Any:
        if n.op not in ("call_function", "call_method", "call_module"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        target = n.target
        if "autocast" not in str(target):  # autocast's own dtype stays: it skips float64
            args, kwargs = _map(_up, args), _map(_up, kwargs)
        if n.op == "call_method" and target in _LOW_PRECISION_METHODS:
            target = _LOW_PRECISION_METHODS[target]
        if n.op == "call_module":
            from torch.func import functional_call

            module = self.fetch_attr(target)
            state = {k: _up(v) for k, v in module.state_dict(keep_vars=True).items()}
            return functional_call(module, state, tuple(args), kwargs)
        return getattr(self, n.op)(target, args, kwargs)


def run_fp64(gm: torch.fx.GraphModule, args: List[Any], kept: Optional[Dict[Any, Any]] = None
             ) -> Any:
    """``gm`` run in float64; the float64 values of the nodes named in ``kept`` go there."""
    interpreter = _Fp64Interpreter(gm, kept or ())
    out = interpreter.run(*args)
    if kept is not None:
        kept.update(interpreter.kept)
    return out
