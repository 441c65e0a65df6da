"""The float64 reference of a graph, run without copying what the graph only reads: each
node's floating inputs are upcast for that node alone, floating dtypes named in the graph
become float64 (as torch's ``cast_dtype_args_to_fp64`` does), and autocast regions are left
as they are (autocast never casts float64). The judge measures compiled and eager against
it; the values of the nodes it is asked to keep (argmax's and comparisons' operands) are
kept.

An op with no float64 kernel (a grouped GEMM) runs its exact float64 stand-in
(``stand_ins``).

The graph is rewritten once into that form (a cast before each floating use), and the
rewritten code runs as Python, as the graph's own does: an FX interpreter pays tens of
microseconds of Python per node, which on a GPU was most of a decode step's check. Graphs
that call modules (``call_module``: their parameters must be cast too) keep the interpreter.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.fx

from rocm_autopatch.sentinel.runs import stand_ins

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


def _upcast_uses(node: torch.fx.Node) -> bool:
    """Are ``node``'s floating inputs cast to float64 for it? Calls are, except autocast's
    own (autocast skips float64, so its dtype stays)."""
    return (node.op in ("call_function", "call_method", "call_module")
            and "autocast" not in str(node.target))


def _float64_target(op: str, target: Any) -> Any:
    """What a node calls in the float64 run: a method named for a narrow dtype calls the
    float64 one; an op with no float64 kernel calls its exact stand-in (``stand_ins``)."""
    if op == "call_method":
        return _LOW_PRECISION_METHODS.get(target, target)
    if op == "call_function":
        return stand_ins.for_target(target)
    return target


class _Fp64Interpreter(torch.fx.Interpreter):
    """Runs a graph in float64, upcasting each node's inputs for that node only; keeps the
    float64 values of the nodes in ``keep`` (what the judge needs)."""

    def __init__(self, gm: torch.fx.GraphModule, keep: Any = (),
                 forced: Optional[Dict[Any, Callable[[Any], Any]]] = None) -> None:
        super().__init__(gm)
        self.keep = set(keep)
        self.kept: Dict[Any, Any] = {}
        self.forced = forced or {}  # node: what it returns, from the interpreter's values

    def run_node(self, n: torch.fx.Node) -> Any:
        value = self.forced[n](self) if n in self.forced else self._run_node(n)
        if n in self.keep:
            self.kept[n] = value
        return value

    def _run_node(self, n: torch.fx.Node) -> Any:
        if n.op not in ("call_function", "call_method", "call_module"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        target = n.target
        if _upcast_uses(n):
            args, kwargs = _map(_up, args), _map(_up, kwargs)
        target = _float64_target(n.op, target)
        if n.op == "call_module":
            from torch.func import functional_call

            module = self.fetch_attr(target)
            state = {k: _up(v) for k, v in module.state_dict(keep_vars=True).items()}
            return functional_call(module, state, tuple(args), kwargs)
        return getattr(self, n.op)(target, args, kwargs)


def _rewritten(gm: torch.fx.GraphModule, keep: Sequence[torch.fx.Node]
               ) -> Optional[torch.fx.GraphModule]:
    """``gm``'s graph with each floating use cast to float64 (what the interpreter does
    node by node), returning ``(output, [the kept nodes' values])``; None where it calls
    modules."""
    from torch.fx.node import map_aggregate

    if any(n.op == "call_module" for n in gm.graph.nodes):
        return None
    graph = torch.fx.Graph()
    env: Dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            out = torch.fx.node.map_arg(node.args[0], env.__getitem__)
            graph.output((out, [env[n] for n in keep]))
        elif _upcast_uses(node):
            def up(a: Any) -> Any:
                return graph.call_function(_up, (env[a],)) if isinstance(a, torch.fx.Node) \
                    else _up(a)

            target = _float64_target(node.op, node.target)
            env[node] = graph.create_node(node.op, target, map_aggregate(node.args, up),
                                          map_aggregate(node.kwargs, up), name=node.name)
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    return torch.fx.GraphModule(gm, graph)


class Fp64Run:
    """``gm`` run in float64, keeping the float64 values of the nodes in ``keep``."""

    def __init__(self, gm: torch.fx.GraphModule, keep: Sequence[torch.fx.Node]) -> None:
        self.gm = gm
        self.keep = list(dict.fromkeys(keep))
        self.module = _rewritten(gm, self.keep)

    def __call__(self, args: List[Any], kept: Optional[Dict[Any, Any]],
                 forced: Optional[Dict[Any, Callable[[Any], Any]]] = None) -> Any:
        """The float64 output; the kept nodes' values go to ``kept`` (if given); the nodes
        in ``forced`` return what it says instead of running (a choice taken one way)."""
        if self.module is None or forced:
            interpreter = _Fp64Interpreter(self.gm, self.keep, forced)
            out = interpreter.run(*args)
            values = [interpreter.kept[n] for n in self.keep]
        else:
            # The rewritten code runs with ``gm`` as ``self``: what gm holds, and what a
            # reparametrisation of gm swaps in for the call, is what its ``get_attr``s read.
            out, values = type(self.module).forward(self.gm, *args)
        if kept is not None:
            kept.update(zip(self.keep, values))
        return out
