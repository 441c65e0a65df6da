"""Numerics: does a compiled graph compute what the same graph computes eagerly?

The torch-facing machinery of the numerics sentinel (``hook`` owns the hook and the
policy). For one Dynamo graph and one call's inputs:

- ``copy_graph``: the graph before Inductor takes it (``compile_fx`` may rewrite the graph
  it is given); the copy shares parameters and submodules, it copies no tensor;
- ``analyse``: a run on fake tensors (no data, no device work) that finds the inputs the
  graph writes (schema write annotations, the running statistics that batch norm kernels
  update without one, version counters) and the random ops it calls (torch's
  ``nondeterministic_seeded`` tag);
- ``run_fp64``: the reference in float64 without copying what the graph only reads: each
  node's floating inputs are upcast for that node alone, floating dtypes named in the graph
  become float64 (as torch's ``cast_dtype_args_to_fp64`` does), autocast regions are left
  as they are (autocast never casts float64);
- ``compare``: torch's own accuracy criterion, ``torch._dynamo.utils.same(ref, res,
  fp64_ref, tol, equal_nan=True)``, as its minifier (``torch/_dynamo/debug_utils.py``
  ``same_two_models``) and its benchmark suite use it, plus non-finite values that the
  compiled graph introduces and eager does not.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, NamedTuple, Optional, Tuple

import torch
import torch.fx

# torch's tolerances for this criterion: the minifier's repro_tolerance and the benchmark
# suite's inference tolerance (benchmarks/dynamo/huggingface.py, timm_models.py
# get_tolerance_and_cosine_flag); gradients get the suite's training tolerance.
TOL_FORWARD = 1e-3
TOL_BACKWARD = 1e-2

_FLOAT_UP = {torch.float16: torch.float64, torch.bfloat16: torch.float64,
             torch.float32: torch.float64, torch.complex32: torch.complex128,
             torch.complex64: torch.complex128}
_LOW_PRECISION_METHODS = {"float": "double", "half": "double", "bfloat16": "double"}
# Batch-norm kernels (native, cuDNN, MIOpen) update running_mean/running_var in training
# without a write annotation in their schema; AOT autograd special-cases them too.
_HIDDEN_WRITES = ("running_mean", "running_var")


class Analysis(NamedTuple):
    mutated: FrozenSet[int]  # positions of the inputs the graph writes
    random: Tuple[str, ...]  # random ops it calls (aten names)
    error: str = ""  # why it could not be analysed ("" when it was)


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


def _storage(t: torch.Tensor) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(t.untyped_storage())


def analyse(gm: Callable[..., Any], args: List[Any]) -> Analysis:
    """Which inputs ``gm`` (a graph, or one bound to its state) writes and which random ops
    it calls, from a run on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.utils._python_dispatch import TorchDispatchMode

    written: set = set()
    random: Dict[str, None] = {}

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
                            written.add(_storage(t))
            if _draws_random(func, values):
                random[str(func.overloadpacket.__name__)] = None
            return func(*a, **kw)

    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
        fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args]
        before = [_version(f) for f in fakes]
        with mode, Recorder():
            gm(*fakes)
        mutated = frozenset(
            i for i, (f, v) in enumerate(zip(fakes, before))
            if isinstance(f, torch.Tensor) and (_storage(f) in written or _version(f) != v))
    except Exception as exc:  # noqa: BLE001 - a graph we cannot analyse is not checked
        return Analysis(frozenset(), (), f"{type(exc).__name__}: {_first_line(exc)}")
    return Analysis(mutated, tuple(random))


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


# ---- the float64 reference ----------------------------------------------------------------

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
    """Runs a graph in float64, upcasting each node's inputs for that node only."""

    def run_node(self, n: torch.fx.Node) -> Any:
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


def run_fp64(gm: torch.fx.GraphModule, args: List[Any]) -> Any:
    return _Fp64Interpreter(gm).run(*args)


def reference_bytes(values: List[Any]) -> int:
    """Memory a forward check needs beyond the compiled result: per floating value the eager
    copy, the float64 reference and the two float64 temporaries of torch's RMSE."""
    return sum(v.numel() * (v.element_size() + 3 * 8) for v in values
               if isinstance(v, torch.Tensor) and v.is_floating_point())


# ---- judging ------------------------------------------------------------------------------

class Mismatch(NamedTuple):
    index: int  # position among the compared values
    shape: Tuple[int, ...]
    dtype: str
    max_abs_diff: float  # compiled vs eager
    compiled_rmse: Optional[float]  # against the float64 reference
    eager_rmse: Optional[float]
    nonfinite: int  # NaN/inf in compiled where eager is finite
    detail: str  # what torch's criterion said


def leaves(value: Any) -> List[Any]:
    from torch.utils._pytree import tree_flatten

    return tree_flatten(value)[0]


def _say(said: List[str], msg: str, *args: Any) -> None:
    said.append(msg % args if args else msg)


def _rmse(a: torch.Tensor, b: torch.Tensor) -> Optional[float]:
    try:
        return float(torch.sqrt(torch.mean(torch.square(a.double() - b.double()))))
    except Exception:  # noqa: BLE001 - a metric for the message only
        return None


def compare(ref: List[Any], res: List[Any], ref64: List[Any], tol: float) -> List[Mismatch]:
    """The values where ``res`` (compiled) fails torch's criterion against ``ref`` (eager)
    with ``ref64`` (float64) as the reference; empty when all pass."""
    from torch._dynamo.utils import same

    bad: List[Mismatch] = []
    for index, (r, c, f) in enumerate(zip(ref, res, ref64)):
        said: List[str] = []
        log_error = functools.partial(_say, said)
        if isinstance(r, torch.Tensor):
            r, c, f = (t.detach() if isinstance(t, torch.Tensor) else t for t in (r, c, f))
        ok = same(r, c, f, tol=tol, equal_nan=True, log_error=log_error)
        nonfinite = 0
        if isinstance(r, torch.Tensor) and isinstance(c, torch.Tensor) and \
                r.is_floating_point() and c.shape == r.shape:
            nonfinite = int((~torch.isfinite(c) & torch.isfinite(r)).sum())
        if ok and not nonfinite:
            continue
        tensor = isinstance(r, torch.Tensor) and isinstance(c, torch.Tensor)
        floating = tensor and r.is_floating_point() and c.shape == r.shape
        bad.append(Mismatch(
            index=index,
            shape=tuple(r.shape) if tensor else (),
            dtype=str(r.dtype).replace("torch.", "") if tensor else type(r).__name__,
            max_abs_diff=float((c.double() - r.double()).abs().nan_to_num(float("inf")).max())
            if floating and r.numel() else 0.0,
            compiled_rmse=_rmse(c, f) if floating and isinstance(f, torch.Tensor) else None,
            eager_rmse=_rmse(r, f) if floating and isinstance(f, torch.Tensor) else None,
            nonfinite=nonfinite,
            detail="; ".join(said)[:300] or ("non-finite values" if nonfinite else "differs"),
        ))
    return bad


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
