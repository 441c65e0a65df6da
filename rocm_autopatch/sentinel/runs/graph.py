"""One compiled graph under the sentinel's watch: its eager copy, its compiled function, its
schedule and its record, and the runs a check makes of it (eager, float64). Once a graph is
settled for good (passed for its life, skipped, fallen back) every call goes straight to
``fast``. What happens to each call is ``check``'s.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from rocm_autopatch import frames, record, torch_releases
from rocm_autopatch.sentinel.judging import allowance, choices, graph_record
from rocm_autopatch.sentinel.judging.status import FELL_BACK, PENDING, SKIPPED
from rocm_autopatch.sentinel.runs import numerics, reference, replay
from rocm_autopatch.sentinel.scheduling import coverage, schedule

# Per thread: a check in progress (compile_fx calls itself; a check's own compiles and calls
# are not the program's), a compile in progress.
busy = threading.local()
# Checks in a row not judged for a near tie after which the next call is no longer checked
# at once (a long MoE prefill ties at every call: the schedule's own checks go on).
UNTIED = 3


class Graph:
    """One compiled graph under watch."""

    def __init__(self, gm: Any, compiled: Any, graph_id: str, where: str, how: str,
                 checks: int, share: float) -> None:
        self.gm = gm
        self.compiled = compiled
        # The function inside Dynamo's disable() wrapper of ``compiled`` (torch wraps the
        # compiled forward in one), and how to know it may be called directly: our own
        # wrapper already runs inside the disable() that Dynamo put around it (``check``)
        self.bare = torch_releases.inside_disable(compiled)
        self.how = how
        self.fast: Any = None  # what every call runs once the graph is settled for good
        self.healed: Optional[Dict[str, Any]] = None  # the remembered fix it compiled with
        self.shown = ""  # where it was compiled from, as a warning says it (``label``)
        self.lock = threading.Lock()
        self.analyses: Dict[Any, Any] = {}  # by shape signature
        self.names = list(numerics.held(gm))  # tensors the graph holds itself (torch 2.4)
        self.inference_mode = True  # its reference runs run in inference mode (check.py)
        self.pending: Any = None  # a check whose verdict is read later (sentinel.pending)
        self.confirm = 0  # the call whose deferred verdict differed: the next is checked at once
        self.untied = 0  # checks in a row not judged for a near tie (``check.undecided``)
        self.judges: Any = None  # its judge's device work, captured by layout (``compare``)
        self.rungs: Any = None  # its part of the store of rungs (``scheduling.rungs``)
        self.schedule = schedule.Schedule(checks, share,
                                          schedule.dynamic_inputs(self.placeholders))
        self.entry = graph_record.new(graph_id, where, **coverage.of(self.schedule))
        with record.LOCK:
            found = graph_record.section()
            found["graphs"].append(self.entry)
            found["totals"][PENDING] += 1

    # ---- the record ----------------------------------------------------------------------

    def note(self, **fields: Any) -> None:
        """Change fields of this graph's record (declared in ``graph_record``)."""
        unknown = set(fields) - graph_record.FIELDS
        if unknown:
            raise KeyError(f"not a field of the graph record: {sorted(unknown)}")
        with record.LOCK:
            self.entry.update(fields)

    def finish(self, status: str, reason: str = "") -> None:
        """Settle the graph for good: no call of it is checked again."""
        self.settle(status, reason)
        if status == SKIPPED:
            self.note(backward="not checked: the graph is not compared (see reason)")
        self.fast = self.eager_call if status == FELL_BACK else self.compiled
        self.gm = self.gm if status == FELL_BACK else None  # nothing kept once judged
        self.__dict__.pop("replays", None)  # nor its captured references (their memory)
        self.judges = None  # nor its judge's

    def settle(self, status: str, reason: str = "") -> None:
        with record.LOCK:
            totals = graph_record.section()["totals"]
            totals[self.entry["status"]] -= 1
            totals[status] += 1
            self.entry["status"] = status
            if reason:
                self.entry["reason"] = reason

    def skip(self, reason: str) -> None:
        """This check could not run (memory, a shape that cannot be analysed): said, counted;
        later calls are still checked."""
        self.schedule.skipped += 1
        self.note(skipped_reason=reason, checks_skipped=self.schedule.skipped)
        if self.entry["status"] == PENDING:
            self.settle(SKIPPED, reason)

    def untie(self) -> None:
        """After a check not judged for a near tie (``compare.Undecided``): the next call is
        checked at the call (``confirm``), up to ``UNTIED`` checks in a row not judged."""
        self.untied += 1
        self.confirm = self.schedule.calls if self.untied <= UNTIED else 0

    def label(self) -> str:
        """How a warning names it: Dynamo's id (and its piece), and where it was compiled
        from, short (``shown``; the record keeps the whole paths)."""
        return f"graph {self.entry['graph']} of {self.shown or self.entry['where']}"

    # ---- the graph and its runs -------------------------------------------------------------

    @functools.cached_property
    def placeholders(self) -> List[Any]:
        return numerics.placeholders(self.gm)

    @functools.cached_property
    def eager_run(self) -> Any:
        """The graph run eagerly on its inputs followed by the tensors it holds itself,
        as a function (``as_function``): the program's module hooks never see it, and
        where it raises (a capture that fails, an op a fake tensor cannot run) nothing is
        printed: the graph's record says why."""
        return numerics.bind_state(as_function(self.gm), self.gm, self.names)

    @functools.cached_property
    def _fp64(self) -> reference.Fp64Run:
        import torch

        keep = [n for op in self.derived.values() for n in op[1] if isinstance(n, torch.fx.Node)]
        return reference.Fp64Run(self.gm, keep + [c.operand for c in self.choices])

    def fp64_run(self, *inputs: Any, kept: Optional[Dict[Any, Any]] = None,
                 forced: Optional[Dict[Any, Any]] = None) -> Any:
        """The same, as the float64 reference; the float64 values of the nodes a judge needs
        (the operands of argmax, comparisons and choices) go to ``kept`` where it is given;
        the nodes in ``forced`` return what it says (``compare.branches``)."""
        run = self._fp64
        with subgraphs_as_functions(self.gm):  # as ``eager_run`` calls them
            return numerics.bind_state(lambda *xs: run(list(xs), kept, forced), self.gm,
                                       self.names)(*inputs)

    def narrowing(self, written: List[int]) -> Tuple[Any, str, Any]:
        """What its float64 run ran narrower, its float64 call having failed
        (``reference``): the coarsest precision (None where nothing did), the ops in
        words, and the values judged (the outputs, then the inputs ``written``, by index)
        that they reach: their output feeds them, or a node they feed uses that input (a
        frozenset)."""
        narrowed = self._fp64.narrowed if "_fp64" in self.__dict__ else {}
        if not narrowed:
            return None, "", None
        nodes = {n.name: n for n in self.gm.graph.nodes}
        said = {f"{numerics.node_name(nodes[name])} in {str(dtype).split('.')[-1]}": None
                for name, dtype in narrowed.items()}
        coarsest = max(narrowed.values(), key=lambda d: reference.torch_eps(d))
        reached: set = set()
        for node in self.gm.graph.nodes:  # in order: a node's inputs come before it
            if node.name in narrowed or any(a in reached for a in node.all_input_nodes):
                reached.add(node)
        (out,) = [n for n in self.gm.graph.nodes if n.op == "output"]
        leaves = numerics.leaves(out.args[0])
        found = {i for i, node in enumerate(leaves) if node in reached}
        for j, i in enumerate(written):
            users = self.placeholders[i].users if i < len(self.placeholders) else reached
            if any(user in reached for user in users):
                found.add(len(leaves) + j)
        return coarsest, ", ".join(said) + " (its float64 call failed)", frozenset(found)

    @functools.cached_property
    def replays(self) -> replay.Replays:
        """Its references captured on the device, by shape (``replay``)."""
        return replay.Replays(self.gm)

    @functools.cached_property
    def derived(self) -> Dict[int, Any]:
        return numerics.derived_outputs(self.gm)

    @functools.cached_property
    def choices(self) -> List[Any]:
        """The choices it makes from floats and computes on (``judging.choices``)."""
        return choices.find(self.gm)

    @functools.cached_property
    def not_compared(self) -> Dict[int, str]:
        """{output index: why} for its outputs that are not values it computes."""
        return numerics.outputs_not_compared(self.gm)

    @functools.cached_property
    def allowed(self) -> Tuple[float, str]:
        """What its math functions may round: (ULPs, the function)."""
        return allowance.ulps(op_names(self.gm))

    def inputs(self, args: Tuple[Any, ...]) -> Tuple[Optional[List[Any]], bool]:
        """The graph's inputs as a list, and whether the call was boxed (one list that the
        compiled function empties). The ``_boxed_call`` attribute is not trusted: torch's
        ``aot_module_simplified`` copies it onto an unboxed function."""
        if not self.matches(args):
            return None, False
        if len(args) == len(self.placeholders):
            return list(args), False
        return list(args[0]), True

    def matches(self, args: Tuple[Any, ...]) -> bool:
        """Are ``args`` as many inputs as the graph's (``inputs`` would take them)?"""
        count = len(self.placeholders)
        return len(args) == count or (len(args) == 1 and isinstance(args[0], list)
                                      and len(args[0]) == count)

    def eager_call(self, *args: Any) -> Any:
        flat, boxed = self.inputs(args)
        if flat is None:
            return self.compiled(*args)
        if boxed:
            args[0].clear()  # the convention: the callee releases the caller's list
        return self.gm(*flat)


def as_function(gm: Any) -> Callable[..., Any]:
    """``gm``'s code called as a function, not through the module's ``__call__``, which
    runs the program's global module hooks (``register_module_forward_hook``) and, where the
    code raises, prints the failing line and a traceback on stderr before raising
    (``torch/fx/graph_module.py`` ``_WrappedCall``, read in torch 2.13; seen on an H200
    with torch 2.11, 39 tracebacks in one run of torch's OpInfo samples). The subgraphs
    of its higher-order ops (``cond``'s branches, ``checkpoint``'s body), which the op
    calls as modules, are called so too for the run (``subgraphs_as_functions``). A lazy
    graph module (``torch/fx/_lazy_graph_module.py``) makes its code at its first call;
    its ``forward`` until then calls the module."""
    def run(*args: Any) -> Any:
        with subgraphs_as_functions(gm):
            return _forward(gm, *args)

    return run


def _forward(module: Any, *args: Any, **kwargs: Any) -> Any:
    _make_code(module)
    return type(module).forward(module, *args, **kwargs)


def _make_code(module: Any) -> None:
    """A lazy graph module's code, made now (``real_recompile``; a no-op once made)."""
    recompile = getattr(module, "real_recompile", None)
    if recompile is not None:
        recompile()


@contextlib.contextmanager
def subgraphs_as_functions(gm: Any) -> Iterator[None]:
    """For the sentinel's run: ``gm``'s subgraphs called as ``_forward`` calls a module,
    then as they were (the program's own calls of them see its hooks). FX gives each graph
    module a class of its own (``GraphModule.__new__``), so no other module changes; a lazy
    one makes its code first (a recompile would keep the ``__call__`` it found:
    ``_WrappedCall``). Another thread's call of a subgraph during the run skips its hooks."""
    import torch

    kept = []
    for sub in gm.modules():
        if sub is not gm and isinstance(sub, torch.fx.GraphModule):
            _make_code(sub)
            kept.append((type(sub), vars(type(sub)).get("__call__")))
            type(sub).__call__ = _forward
    try:
        yield
    finally:
        for cls, call in reversed(kept):
            if call is None:
                del cls.__call__
            else:
                cls.__call__ = call


def op_names(gm: Any) -> List[str]:
    """The names of the ops ``gm`` calls, in order; [] where its graph cannot be read."""
    try:
        return [numerics.node_name(n) for n in gm.graph.nodes
                if n.op in ("call_function", "call_method", "call_module")]
    except Exception:  # noqa: BLE001 - no names: no allowance, judged as before
        return []


def label(entry: Dict[str, Any]) -> str:
    """A graph's record as the exit line names it, paths short: ``graph 0/1 of run.py:12
    (into forward (transformers/models/opt/modeling_opt.py:840))``."""
    return f"graph {entry['graph']} of {frames.shortened(str(entry['where']))}"
