"""The float64 reference of a graph, run without copying what the graph only reads: each
node's floating inputs are upcast for that node alone, floating dtypes named in the graph
become float64 (as torch's ``cast_dtype_args_to_fp64`` does), and autocast regions are left
as they are (autocast never casts float64). The judge measures compiled and eager against
it; the values of the nodes it is asked to keep (argmax's and comparisons' operands) are
kept.

An op with no float64 kernel runs its exact float64 stand-in where it has one (a grouped
GEMM, ``stand_ins``), else in the highest precision it has a kernel for (float32, then its
inputs' own dtype, bfloat16, float16: ``Fp64Run.narrowed``), learnt by an op-by-op run
after the rewritten one fails, its outputs cast back to float64 (an op that writes its
arguments is never narrowed); the rest of the graph keeps its float64 truth, and the judge
knows which values that reference cannot hold to more than their own precision
(``judge``).

The graph is rewritten once into that form (a cast before each floating use), and the
rewritten code runs as Python, as the graph's own does: an FX interpreter pays tens of
microseconds of Python per node, which on a GPU was most of a decode step's check. Graphs
that call modules (``call_module``: their parameters must be cast too) keep the interpreter.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.fx

from rocm_autopatch.sentinel.runs import memory, numerics, stand_ins

_FLOAT_UP = {torch.float16: torch.float64, torch.bfloat16: torch.float64,
             torch.float32: torch.float64, torch.complex32: torch.complex128,
             torch.complex64: torch.complex128}
_LOW_PRECISION_METHODS = {"float": "double", "half": "double", "bfloat16": "double"}
# What an op with no float64 kernel runs in instead, most precise first; after float32 the
# op's own dtype (float16 keeps more digits than bfloat16 but overflows past 65504, so
# where the op's own is neither, bfloat16 goes first).
NARROWER = (torch.float32, torch.bfloat16, torch.float16)
_DOWN = {torch.float32: {torch.float64: torch.float32, torch.complex128: torch.complex64},
         torch.bfloat16: {torch.float64: torch.bfloat16},
         torch.float16: {torch.float64: torch.float16}}


def torch_eps(dtype: torch.dtype) -> float:
    """A floating dtype's rounding unit (what orders the precisions)."""
    return float(torch.finfo(dtype).eps)


class RunAgain(Exception):
    """The rewritten float64 run failed (an op with no float64 kernel, or another cause):
    it stopped part-way and may have written the inputs it writes, so the caller runs it
    again on fresh copies; that run goes op by op and narrows what refuses float64."""


def _up(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _FLOAT_UP:
        return value.to(_FLOAT_UP[value.dtype])
    if isinstance(value, torch.dtype) and value in _FLOAT_UP:
        return _FLOAT_UP[value]
    return value


# Ops that read a tensor's storage beyond its view (its storage offset, the elements around
# it), by name: ``as_strided`` of a view at an offset reads elements the view does not hold.
STORAGE_READERS = frozenset({"as_strided", "as_strided_", "as_strided_scatter",
                             "as_strided_copy"})


def reads_storage(node: torch.fx.Node) -> bool:
    """Does ``node`` call an op of ``STORAGE_READERS``?"""
    return (node.op in ("call_function", "call_method")
            and numerics.node_name(node) in STORAGE_READERS)


def _up_whole(value: Any) -> Any:
    """``_up`` for an op that reads the storage around a view: the float64 copy is of the
    whole storage, viewed as the value is (a copy of the view alone starts at offset 0,
    and ``as_strided`` read other elements there than in the program)."""
    if isinstance(value, torch.Tensor) and value.dtype in _FLOAT_UP and \
            value.layout == torch.strided:
        try:
            whole = value.new_empty(0).set_(value.untyped_storage())
            return whole.to(_FLOAT_UP[value.dtype]).as_strided(
                value.size(), value.stride(), value.storage_offset())
        except Exception:  # noqa: BLE001 - a tensor without a storage of its own: the view
            pass
    return _up(value)


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


def in_precision(target: Any, dtype: torch.dtype) -> Callable[..., Any]:
    """``target`` called with its float64 inputs (and float64 dtype arguments) narrowed to
    ``dtype``, its floating outputs cast back to float64."""
    down = _DOWN[dtype]

    def narrow(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype in down:
            return value.to(down[value.dtype])
        return down.get(value, value) if isinstance(value, torch.dtype) else value

    def run(*args: Any, **kwargs: Any) -> Any:
        return _map(_up, target(*_map(narrow, args), **_map(narrow, kwargs)))

    # the rewritten graph's code names it: ``<op>_in_float32``
    run.__name__ = f"{getattr(target, '__name__', 'op')}_in_{str(dtype).split('.')[-1]}"
    run.__qualname__ = run.__name__
    return run


def _writes(target: Any, kwargs: Dict[str, Any]) -> bool:
    """Does ``target`` write an argument (its schema says so, an in-place name, ``out=``)?
    Run narrower it would write a narrowed copy, not the float64 value: never narrowed."""
    schema = getattr(getattr(target, "default", target), "_schema", None)
    name = getattr(target, "__name__", "").split(".")[0]
    return (bool(getattr(schema, "is_mutable", False)) or "out" in kwargs
            or name.endswith("_") and not name.endswith("__"))


def _precisions(node: torch.fx.Node) -> List[torch.dtype]:
    """The precisions to try ``node``'s op in, most precise first: float32, the floating
    dtypes its inputs had in the program (Dynamo's ``example_value``, AOT's ``val``), then
    the rest of ``NARROWER``."""
    own = []
    for arg in node.all_input_nodes:
        value = arg.meta.get("example_value", arg.meta.get("val"))
        if isinstance(value, torch.Tensor) and value.dtype in _DOWN:
            own.append(value.dtype)
    return list(dict.fromkeys([torch.float32, *own, *NARROWER]))


def _float64_target(op: str, target: Any, narrower: Optional[torch.dtype] = None) -> Any:
    """What a node calls in the float64 run: a method named for a narrow dtype calls the
    float64 one; an op with no float64 kernel calls its exact stand-in (``stand_ins``), or
    itself in ``narrower``, the highest precision it has (learnt: ``Fp64Run.narrowed``)."""
    if op == "call_method":
        return _LOW_PRECISION_METHODS.get(target, target)
    if op == "call_function":
        return in_precision(target, narrower) if narrower is not None \
            else stand_ins.for_target(target)
    return target


class _Fp64Interpreter(torch.fx.Interpreter):
    """Runs a graph in float64, upcasting each node's inputs for that node only; keeps the
    float64 values of the nodes in ``keep`` (what the judge needs)."""

    def __init__(self, gm: torch.fx.GraphModule, keep: Any = (),
                 forced: Optional[Dict[Any, Callable[[Any], Any]]] = None,
                 narrowed: Optional[Dict[str, torch.dtype]] = None) -> None:
        super().__init__(gm)
        self.keep = set(keep)
        self.kept: Dict[Any, Any] = {}
        self.forced = forced or {}  # node: what it returns, from the interpreter's values
        self.narrowed = narrowed if narrowed is not None else {}  # node name: its precision

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
            up = _up_whole if reads_storage(n) else _up
            args, kwargs = _map(up, args), _map(up, kwargs)
        target = _float64_target(n.op, target, self.narrowed.get(n.name))
        if n.op == "call_module":
            from torch.func import functional_call

            module = self.fetch_attr(target)
            state = {k: _up(v) for k, v in module.state_dict(keep_vars=True).items()}
            return functional_call(module, state, tuple(args), kwargs)
        try:
            return getattr(self, n.op)(target, args, kwargs)
        except Exception as exc:
            # An op with no float64 kernel refuses before it computes (a dtype check), so
            # the node can run again narrower; one with a stand-in, or already narrowed
            # (its target is not its own either), keeps its refusal.
            if (n.op != "call_function" or target is not n.target
                    or memory.out_of_memory(exc) or _writes(n.target, kwargs)):
                raise
            for dtype in _precisions(n):
                try:
                    value = in_precision(n.target, dtype)(*args, **kwargs)
                except Exception:  # noqa: BLE001 - not this precision either
                    continue
                self.narrowed[n.name] = dtype
                return value
            raise


def _rewritten(gm: torch.fx.GraphModule, keep: Sequence[torch.fx.Node],
               narrowed: Dict[str, torch.dtype]) -> Optional[torch.fx.GraphModule]:
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
            cast = _up_whole if reads_storage(node) else _up

            def up(a: Any, cast: Any = cast) -> Any:
                return graph.call_function(cast, (env[a],)) if isinstance(a, torch.fx.Node) \
                    else cast(a)

            target = _float64_target(node.op, node.target, narrowed.get(node.name))
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
        # the nodes run narrower, their float64 call having failed: {node name: dtype}
        self.narrowed: Dict[str, torch.dtype] = {}
        self.module = _rewritten(gm, self.keep, self.narrowed)
        self.learning = False  # the next run goes op by op (the rewritten one failed)
        self.unlearnable = False  # an op-by-op run failed, narrowing nothing: not again

    def __call__(self, args: List[Any], kept: Optional[Dict[Any, Any]],
                 forced: Optional[Dict[Any, Callable[[Any], Any]]] = None) -> Any:
        """The float64 output; the kept nodes' values go to ``kept`` (if given); the nodes
        in ``forced`` return what it says instead of running (a choice taken one way).
        Raises ``RunAgain`` where the rewritten run failed for a cause it has not met: the
        next call runs op by op on the caller's fresh copies, narrowing what refuses
        float64 as it goes, and rewrites the graph with it."""
        if self.module is None or forced or self.learning:
            learning, self.learning = self.learning, False
            known = len(self.narrowed)
            interpreter = _Fp64Interpreter(self.gm, self.keep, forced, self.narrowed)
            try:
                out = interpreter.run(*args)
            except Exception:
                self.unlearnable |= learning and len(self.narrowed) == known
                raise
            finally:
                if len(self.narrowed) != known and self.module is not None:
                    self.module = _rewritten(self.gm, self.keep, self.narrowed)
            values = [interpreter.kept[n] for n in self.keep]
        else:
            failed = ""
            try:
                # The rewritten code runs with ``gm`` as ``self``: what gm holds, and what a
                # reparametrisation of gm swaps in for the call, is what its ``get_attr``s
                # read.
                out, values = type(self.module).forward(self.gm, *args)
            except Exception as exc:
                if memory.out_of_memory(exc) or self.unlearnable:
                    raise
                failed = f"{type(exc).__name__}: {memory.first_line(exc)}"
            if failed:  # raised here, not in the handler: the failed run's values go now
                self.learning = True
                raise RunAgain(f"the float64 run failed ({failed}): run again op by op")
        if kept is not None:
            kept.update(zip(self.keep, values))
        return out
