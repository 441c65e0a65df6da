"""The sentinel's runs: what it needs to run a graph again, safely, eagerly and in float64.

The sentinel's torch-facing machinery, for one Dynamo graph and one call's inputs:

- ``copy_graph``: the graph before Inductor takes it (``compile_fx`` may rewrite the graph
  it is given); the copy shares parameters and submodules, it copies no tensor;
- ``analyse``: a run on fake tensors (no data, no device work) that finds the inputs the
  graph writes (schema write annotations, the running statistics that batch norm kernels
  update without one, version counters) and the random ops it calls (torch's
  ``nondeterministic_seeded`` tag), the ops that may have side effects (outside torch's
  own namespaces) and the bytes every tensor it creates takes (the memory budget);
- ``communicates``: the collectives a graph calls (never run again);
- ``snapshot``: the state a call writes, copied once per storage (its own module);
- ``quiet``: the program's saved-tensor hooks do not see these runs;
- ``reference``: the run in float64 (its own module);
- ``derived_outputs``: integer outputs computed from floats (argmax, comparisons), whose
  float64 operands the judge reads.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, NamedTuple, Optional, Tuple

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor

from rocm_autopatch.sentinel.runs import footprint
from rocm_autopatch.sentinel.runs.footprint import Footprint, storage_of

# Batch-norm kernels (native, cuDNN, MIOpen) update running_mean/running_var in training
# without a write annotation in their schema; AOT autograd special-cases them too.
_HIDDEN_WRITES = ("running_mean", "running_var")


class Analysis(NamedTuple):
    mutated: FrozenSet[int]  # positions of the inputs the graph writes
    random: Tuple[str, ...]  # random ops it calls (aten names)
    error: str = ""  # why it could not be analysed ("" when it was)
    effects: Tuple[str, ...] = ()  # ops that may act outside the graph (custom ops)
    footprint: Footprint = Footprint()  # what its runs hold at their peak (footprint.py)
    collectives: Tuple[str, ...] = ()  # collectives it dispatches (never run again)


# Ops whose namespace makes them pure functions of their inputs (or random, found apart):
# anything else (a custom op of torch.library, vLLM's or aiter's kernels) may count, log or
# call a runtime, and must not run a second time (docs/rules.md, the numerics sentinel).
PURE_NAMESPACES = ("aten", "prim", "prims", "rngprims")
# Collectives: a graph that communicates is never run again (every rank would have to run
# it again the same number of times, or the collectives pair wrongly: gloo aborts with
# "Received data size doesn't match expected size", NCCL/RCCL hangs).
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd",
                         "c10d", "_dtensor")


def _op_name(target: Any) -> Tuple[str, str]:
    """(namespace, name) of a graph node's target; ("", "") for what is not an op."""
    qualified = getattr(target, "_qualified_op_name", None) or getattr(
        getattr(target, "_overloadpacket", None), "_qualified_op_name", None)
    if isinstance(qualified, str) and "::" in qualified:
        namespace, name = qualified.split("::", 1)
        return namespace, name
    module = getattr(target, "__module__", None) or ""
    if module.startswith("torch.distributed"):
        return "torch.distributed", getattr(target, "__name__", str(target))
    return "", ""


def communicates(gm: torch.fx.GraphModule) -> Tuple[str, ...]:
    """The collectives ``gm`` calls (decided from the graph alone: the same on every rank)."""
    found: Dict[str, None] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        namespace, name = _op_name(node.target)
        if namespace in COLLECTIVE_NAMESPACES or namespace == "torch.distributed":
            found[name] = None
    return tuple(found)


def copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule with its own copy of ``gm``'s graph; attributes are shared, not copied."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    copy = torch.fx.GraphModule(gm, graph)
    copy.meta = dict(getattr(gm, "meta", {}))
    return copy


def placeholders(gm: torch.fx.GraphModule) -> List[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


# ---- parameters and buffers that a graph holds itself ------------------------------------
# Dynamo's graphs hold a module's parameters and buffers as attributes (get_attr and
# call_module nodes) where it does not inline torch.nn modules: by default on torch 2.4
# (torch._dynamo.config.inline_inbuilt_nn_modules, on by default from 2.5), and on any
# release that turns it off. A graph that updates such a buffer (batch norm's running
# statistics) must run eagerly on copies of it, or the check advances the state twice: the
# eager and float64 runs get them as extra inputs, swapped into the graph's modules for the
# call as torch.func.functional_call does (and AOT autograd did for these graphs).

def held(gm: torch.fx.GraphModule) -> Dict[str, torch.Tensor]:
    """The parameters and buffers ``gm`` holds itself now, by name (none where Dynamo
    inlined the modules)."""
    found = dict(gm.named_parameters())
    found.update(gm.named_buffers())
    return found


def bind_state(fn: Callable[..., Any], gm: torch.fx.GraphModule, names: List[str]
               ) -> Callable[..., Any]:
    """``fn(*inputs)`` as ``run(*inputs, *state)``: the trailing values replace ``gm``'s
    own tensors named ``names`` for the call."""
    if not names:
        return fn
    from torch.nn.utils.stateless import _reparametrize_module

    count = len(names)

    def run(*values: Any) -> Any:
        with _reparametrize_module(gm, dict(zip(names, values[-count:]))):
            return fn(*values[:-count])

    return run


def not_compared(collectives: Tuple[str, ...]) -> str:
    """Why a graph that communicates is not compared (the record's reason)."""
    return (f"not compared: it communicates ({', '.join(collectives)}); running it again on "
            "one rank would pair its collectives with the wrong ones on the others")


def analyse(gm: Callable[..., Any], args: List[Any]) -> Analysis:
    """Which inputs ``gm`` (a graph, or one bound to its state) writes and which random ops
    it calls, from a run on fake tensors with the call's own, concrete shapes. Only a graph
    whose output shapes depend on data (nonzero, masked_select) is run again with symbolic
    shapes: under a shape environment many ops' fake kernels refuse symbolic sizes
    (diagonal, narrow_copy, split_with_sizes_copy, addbmm: "Cannot call storage_offset() on
    tensor with symbolic sizes/strides"), and graphs made of them went unchecked."""
    found = _analyse(gm, args, symbolic=False)
    if found.error.startswith(("DynamicOutputShapeException", "DataDependentOutputException")):
        found = _analyse(gm, args, symbolic=True)
    return found


def _analyse(gm: Callable[..., Any], args: List[Any], symbolic: bool) -> Analysis:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.utils._python_dispatch import TorchDispatchMode

    written: set = set()
    random: Dict[str, None] = {}
    effects: Dict[str, None] = {}
    talks: Dict[str, None] = {}
    given: set = set()
    counter = footprint.Counter(given)
    autocasting = footprint.autocasting(gm)

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            kw = kw or {}
            schema = func._schema
            values = {arg.name: (a[i] if i < len(a) else kw.get(arg.name, _default(arg)))
                      for i, arg in enumerate(schema.arguments)}
            for arg in schema.arguments:
                info = arg.alias_info
                hidden = arg.name in _HIDDEN_WRITES and values.get("training") is True
                if (info is not None and info.is_write) or hidden:
                    value = values.get(arg.name)
                    for t in value if isinstance(value, (list, tuple)) else (value,):
                        if isinstance(t, torch.Tensor):
                            written.add(storage_of(t))
            if _draws_random(func, values):
                random[str(func.overloadpacket.__name__)] = None
            namespace = getattr(func, "namespace", "aten")
            if namespace in COLLECTIVE_NAMESPACES:
                talks[f"{namespace}::{func.overloadpacket.__name__}"] = None
            elif namespace not in PURE_NAMESPACES:
                effects[f"{namespace}::{func.overloadpacket.__name__}"] = None
            counter.before(leaves((a, kw)))
            out = func(*a, **kw)
            counter.after(leaves(out), cast=autocasting and footprint.kept_cast(func, a, out))
            return out

    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True,
                              shape_env=ShapeEnv() if symbolic else None)
        fakes = [_fake(mode, x) if isinstance(x, torch.Tensor) else x for x in args]
        given.update(storage_of(f) for f in fakes if isinstance(f, torch.Tensor))
        before = [_version(f) for f in fakes]
        with mode, Recorder(), quiet():
            found = counter.result(leaves(gm(*fakes)))
        mutated = frozenset(
            i for i, (f, v) in enumerate(zip(fakes, before))
            if isinstance(f, torch.Tensor) and (storage_of(f) in written or _version(f) != v))
    except Exception as exc:  # noqa: BLE001 - a graph we cannot analyse is not checked
        return Analysis(frozenset(), (), f"{type(exc).__name__}: {_first_line(exc)}")
    return Analysis(mutated, tuple(random), "", tuple(effects), found, tuple(talks))


def _fake(mode: Any, x: torch.Tensor) -> Any:
    """``x`` on fake tensors. A one-element CPU tensor (a Python scalar that ``dynamic=True``
    made an input, read back with ``.item()``) keeps its value: as an unknown it became an
    unbacked symbol that softshrink's ``lambd`` and addmv's ``beta`` could not be guarded on
    (``GuardOnDataDependentSymNode``), and their graphs went unchecked."""
    if x.numel() == 1 and x.device.type == "cpu" and not x.requires_grad:
        try:
            # A copy: fake tensor mode runs some ops on a constant for real, and a write
            # there must not reach the program's tensor (a decode loop's cache position).
            return mode.fake_tensor_converter.from_real_tensor(mode, x.detach().clone(),
                                                               make_constant=True)
        except Exception:  # noqa: BLE001 - an older converter: faked without its value
            pass
    return mode.from_tensor(x)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The program's saved-tensor hooks (activation offloading, checkpointing) do not see
    the sentinel's runs: identity hooks on top of the stack stand in for them (torch uses the
    innermost pair only; the stack is per thread)."""
    with torch.autograd.graph.saved_tensors_hooks(_same, _same):
        yield


def _same(t: Any) -> Any:
    return t


def _default(arg: Any) -> Any:
    return arg.default_value if arg.has_default_value() else None


def _draws_random(func: Any, values: Dict[str, Any]) -> bool:
    """Does this call draw random numbers? torch tags an op ``nondeterministic_seeded`` when it
    can (attention kernels take a ``dropout_p``); it does not where its dropout probability
    is 0 or it is told it is not training."""
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    for name in ("dropout_p", "p"):
        if isinstance(values.get(name), (int, float)) and values[name] == 0:
            return False
    return not any(values.get(name) is False for name in ("train", "training"))


def fake_call(args: Any) -> bool:
    """Is this a call on fake tensors? Dynamo's DDPOptimizer runs each compiled piece of a
    DDP model on fake tensors while it compiles the next one
    (``torch/_dynamo/backends/distributed.py`` ``SubmodCompiler``): a propagation of shapes,
    not a call of the program's, which must neither be checked nor counted. The first
    tensor decides (a boxed call passes one list). On every call of a watched graph."""
    for x in (args[0] if len(args) == 1 and isinstance(args[0], list) else args):
        if isinstance(x, torch.Tensor):
            return isinstance(x, _FakeTensor)
    return False


def _version(t: Any) -> Optional[int]:
    try:
        return t._version if isinstance(t, torch.Tensor) else None
    except RuntimeError:  # inference tensors have no version counter
        return None


def versions(args: List[Any]) -> List[Optional[int]]:
    return [_version(x) for x in args]


def changed(args: List[Any], before: List[Optional[int]]) -> FrozenSet[int]:
    """Inputs whose version counter moved since ``before``: what a call wrote."""
    return frozenset(i for i, (x, v) in enumerate(zip(args, before))
                     if v is not None and _version(x) != v)


# ---- what the judge needs from the graph -------------------------------------------------

def leaves(value: Any) -> List[Any]:
    from torch.utils._pytree import tree_flatten

    return tree_flatten(value)[0]


_ARG_OPS = {"argmax": "argmax", "argmin": "argmin"}
_COMPARE_OPS = {"gt": "gt", "lt": "lt", "ge": "ge", "le": "le", "eq": "eq", "ne": "ne",
                "__gt__": "gt", "__lt__": "lt", "__ge__": "ge", "__le__": "le",
                "__eq__": "eq", "__ne__": "ne", "greater": "gt", "less": "lt"}


def node_name(node: torch.fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        return str(target)
    name = getattr(target, "__name__", "") or str(target)
    return name.split(".")[0]


def _meta_dtype(node: Any) -> Optional[torch.dtype]:
    if not isinstance(node, torch.fx.Node):
        return None
    value = node.meta.get("example_value", node.meta.get("val"))
    return getattr(value, "dtype", None)


# Ops whose result is uninitialised memory: an output made by one is not a value to judge.
_UNINITIALISED = ("empty", "empty_like", "empty_permuted", "new_empty", "empty_strided",
                  "new_empty_strided")


def outputs_not_compared(gm: torch.fx.GraphModule) -> Dict[int, str]:
    """{output index: why} for outputs that are not values the graph computes, never
    compared and said so: uninitialised memory (``torch.empty`` and its kin, returned as
    they are) and the random generator's state a seeded op returns: torch's attention
    kernels return a seed and an offset that they leave uninitialised where their dropout
    is 0 (``aten/src/ATen/native/transformers/cuda/attention.cu``, "Not using dropout":
    ``seed_t = at::empty({}, ...)``; ``flash_attn/flash_api.cpp`` ``mha_fwd``:
    ``rng_state = at::empty({2}, ...)``, filled only where ``p_dropout > 0``)."""
    try:
        (out,) = [n for n in gm.graph.nodes if n.op == "output"]
        found: Dict[int, str] = {}
        for i, node in enumerate(leaves(out.args[0])):
            if not (isinstance(node, torch.fx.Node) and node.op in ("call_function",
                                                                     "call_method")):
                continue
            if node_name(node) in _UNINITIALISED:
                found[i] = f"uninitialised memory ({node_name(node)})"
            state = _generator_state(node)
            if state:
                found[i] = state
        return found
    except Exception:  # noqa: BLE001 - then every output is compared
        return {}


def _generator_state(node: torch.fx.Node) -> str:
    """For ``node = op(...)[k]``, where ``op`` is seeded and its k-th return is the
    generator's state (named for a seed, an offset or an RNG state in its schema, or
    ``unused``: flash attention's, an ``at::empty`` beside it), what it is, in words; ""
    otherwise."""
    import operator

    if node.target is not operator.getitem or not isinstance(node.args[0], torch.fx.Node):
        return ""
    op, k = node.args[0].target, node.args[1]
    op = getattr(op, "default", op)  # an overload packet's schema: its default's
    try:
        if torch.Tag.nondeterministic_seeded not in op.tags or k >= len(op._schema.returns):
            return ""
        name = op._schema.returns[k].name or ""
    except Exception:  # noqa: BLE001 - no schema to read (not an ATen op): compared
        return ""
    if not any(word in name for word in ("seed", "offset", "rng", "unused")):
        return ""
    return (f"the random generator's state that {node_name(node.args[0])} returns ({name}; "
            "uninitialised where nothing is drawn)")


_CASTS = ("float", "double", "half", "bfloat16", "to", "type", "_to_copy",
          "convert_element_type")


def computed_dtype(node: Any) -> Optional[torch.dtype]:
    """The precision ``node``'s values were computed in: followed back through casts, the
    least precise floating dtype on the way (soft-capped bf16 logits cast to float32 for
    argmax are bf16 values)."""
    dtype = _meta_dtype(node)
    for _ in range(8):
        if not (isinstance(node, torch.fx.Node) and node.op in ("call_function", "call_method")
                and node_name(node) in _CASTS and node.args):
            break
        node = node.args[0]
        before = _meta_dtype(node)
        if before is None or not before.is_floating_point:
            break
        if dtype is None or torch.finfo(before).eps > torch.finfo(dtype).eps:
            dtype = before
    return dtype


def derived_outputs(gm: torch.fx.GraphModule) -> Dict[int, Tuple[str, List[Any], torch.dtype,
                                                                 Optional[int], bool]]:
    """Integer and bool outputs that come from floats through argmax, argmin or a
    comparison: {output index: (op, operand nodes or numbers, their dtype, dim, keepdim)}."""
    found: Dict[int, Tuple[str, List[Any], torch.dtype, Optional[int], bool]] = {}
    try:
        (out,) = [n for n in gm.graph.nodes if n.op == "output"]
        for index, node in enumerate(leaves(out.args[0])):
            if not isinstance(node, torch.fx.Node) or node.op not in ("call_function",
                                                                      "call_method"):
                continue
            name = node_name(node)
            args, kwargs = list(node.args), dict(node.kwargs)
            if name in _ARG_OPS and args:
                dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
                keepdim = bool(kwargs.get("keepdim", args[2] if len(args) > 2 else False))
                dtype = computed_dtype(args[0])
                if dtype is not None and dtype.is_floating_point and (dim is None or
                                                                      isinstance(dim, int)):
                    found[index] = (_ARG_OPS[name], [args[0]], dtype, dim, keepdim)
            elif name in _COMPARE_OPS and len(args) >= 2:
                dtypes = [d for d in (computed_dtype(a) for a in args[:2]) if d is not None]
                if dtypes and all(d.is_floating_point for d in dtypes):
                    coarse = max(dtypes, key=lambda d: torch.finfo(d).eps)
                    found[index] = (_COMPARE_OPS[name], list(args[:2]), coarse, None, False)
    except Exception:  # noqa: BLE001 - then integers are judged exactly
        return {}
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


@contextlib.contextmanager
def grad_mode(enabled: bool) -> Iterator[None]:
    with torch.set_grad_enabled(enabled):
        yield


def origin(gm: torch.fx.GraphModule, output_index: int) -> str:
    """Where the user's code made output ``output_index`` of ``gm`` ("" when unknown):
    the innermost ``File "...", line N, in fn`` of its node's stack trace."""
    try:
        (out,) = [n for n in gm.graph.nodes if n.op == "output"]
        values = leaves(out.args[0])
        node = values[output_index] if output_index < len(values) else None
        trace = node.meta.get("stack_trace", "") if isinstance(node, torch.fx.Node) else ""
    except Exception:  # noqa: BLE001
        return ""
    for line in reversed(trace.strip().splitlines()):
        line = line.strip()
        if line.startswith("File "):
            try:
                path = line.split('"')[1]
                number = line.split(", line ")[1].split(",")[0]
                name = line.rsplit(" in ", 1)[1]
            except IndexError:
                return ""
            return f"{name} ({path}:{number})"
    return ""
