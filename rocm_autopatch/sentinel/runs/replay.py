"""A graph's eager and float64 references captured once per shape as a device graph
(CUDA/HIP) and replayed at later checks: one launch instead of Python dispatching each of
their ops, which was most of a decode step's check (BENCHMARKS.md, "A cheaper check").

Replayed only where a replay computes what a run would:
- every tensor input on the graph's one device, no Python value changed since the capture;
- the inputs the references write get buffers of their own, refilled from the snapshot
  before each replay (``Snapshot.fill``); inputs that are not parameters, up to
  ``COPY_BYTES`` each (token ids, positions, a mask: a program makes them anew or refills
  them at every call), and inputs seen to move between two checks are copied into buffers
  of their own; the rest (parameters, a large cache) are read where they are, and a replay
  whose inputs moved from where the capture read them is not made (the references run op
  by op, and the input is copied from then on);
- no op whose output depends on data (torch tags it ``data_dependent_output`` or
  ``dynamic_output_shape``: a capture cannot read a value back);
- captured on a stream of the sentinel's own, right after a run on that same stream: a
  first use allocates (a BLAS handle per device and stream on ROCm, rocBLAS's workspace
  with ``hipMalloc``), which a capture forbids, and a capture that did so failed or hung
  (ROCm/aiter#4352, ROCm/TransformerEngine#644, openxla/xla#16337); that run is the
  check's references (at a first check, see below), so a capture costs no run of its
  own. Captured at a shape's first
  check where its references are estimated within ``HELD_SHARE`` of the device's memory,
  else at its second (its third where the second times a warm check:
  ``schedule.calibrating``); never while the program captures (``check.call`` runs no check
  then). At a first check the capture's first replay gives the check's references in
  place of that run's: a device graph's first launch costs more than the next, and a
  first check is left out of the budget. The program's RNG is untouched: a graph with
  random ops is never compared.
What the captures hold (their memory pools, the buffers) counts against ``HELD_SHARE`` of
the device's memory, all graphs together. A capture that would pass it first takes the
place of captures never replayed (a prompt's shape, checked once), oldest first; past it
still, or where capture fails, the references run op by op as before, and the graph's
record says why (``references``).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch

from rocm_autopatch.sentinel.runs import capturing, numerics, reference, stand_ins
from rocm_autopatch.sentinel.scheduling import schedule

# All captures of a process together hold at most this share of the device's memory.
HELD_SHARE = 0.05
RECAPTURES = 2  # captures of a shape whose inputs keep moving; then op by op
# Captured at a shape's first check where its references need at most this share of the
# device's memory (the analysis' estimate), else at its second, paid inside the budget: an
# 8B Llama's decode step (5.5 GB captured) cost 185 ms at the check that captured against
# 121 op by op and 9-17 replayed, 1.5% of a 2,048 + 3 x 256-token run by itself
# (BENCHMARKS.md, "At 8B on one GPU"); at the first check it is part of the graph's first
# check, which the budget leaves out as it does the analysis.
FIRST_SHARE = HELD_SHARE
# Inputs that are not parameters, up to this size each, are copied at each replay rather
# than read where they are (a program refills or remakes them between calls)...
COPY_BYTES = 64 << 20
COPY_TOTAL = 256 << 20  # ...and this much together (buffers past it are read in place)
_HELD = {"bytes": 0}
# Every live capture, oldest first: (its Replays, its shape), for ``_make_room``; changed
# under ``_ROOM`` (not ``_LOCK``, which a capture's finalizer takes while it is held).
_LIVE: List[Tuple[Any, Any]] = []
_ROOM = threading.RLock()
_LOCK = threading.Lock()

Refs = Tuple[List[Any], List[Any], Any, Any, Dict[Any, Any]]  # check.reference_runs' result


def _where(x: Any) -> Any:
    """What a replay depends on for one input: a tensor's address and layout, or a value."""
    if isinstance(x, torch.Tensor):
        return (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device)
    return ("value", x)


def _layout(where: Any) -> Any:
    """An input's ``_where`` without the address (what a copied input must keep)."""
    return where if where[0] == "value" else where[1:]


def unreplayable_ops(gm: Any) -> List[str]:
    """The ops of ``gm`` a capture cannot hold: their outputs depend on data, or on the
    storage around an input's view (``reference.STORAGE_READERS``)."""
    found = []
    tags = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
    for node in gm.graph.nodes:
        target = node.target
        # A storage reader: a replay reads copies of the small inputs, each of its view
        # alone, so eager's reference would read other elements than the program's call did
        # (torch's OpInfo samples of ``as_strided``, a view at an offset, were judged wrong
        # on an H200 in fp32, bf16 and fp16, 2026-11-28, BENCHMARKS.md). An op that
        # synchronises: its float64 stand-in reads the host.
        if (reference.reads_storage(node) or node.op == "call_function" and (
                any(t in getattr(target, "tags", ()) for t in tags)
                or stand_ins.synchronises(target))
                or node.op == "call_method" and target in ("item", "tolist", "nonzero",
                                                           "numpy")):
            found.append(numerics.node_name(node))
    return sorted(set(found))


class Captured:
    """One shape's references, captured: the device graph, its buffers, its outputs."""

    def __init__(self, graph: Any, flat: List[Any], pre: Any, copied: List[int],
                 inference: bool, device: Any) -> None:
        graph.schedule.capturing = True  # this check's cost is partly a capture's (rungs)
        written = pre.indices
        self.copied = {i: torch.empty_strided(flat[i].shape, flat[i].stride(),
                                              dtype=flat[i].dtype, device=device)
                       for i in copied if i not in written}
        for i, buf in self.copied.items():  # the warm-up below reads them (an index...)
            buf.copy_(flat[i])
        self.bases, self.bases64 = pre.bases(), pre.bases(fp64=True)
        self.layout_key = pre.layout_key()
        made, made64 = pre.views(self.bases), pre.views(self.bases64)
        self.eager_inputs = [made.get(i, self.copied.get(i, x)) for i, x in enumerate(flat)]
        self.inputs64 = [made64.get(i, self.copied.get(i, x)) for i, x in enumerate(flat)]
        where = [_where(x) for x in flat]
        self.read = {i: w for i, w in enumerate(where) if i not in self.copied
                     and i not in written}
        self.layouts = [_layout(w) for w in where]
        self.kept: Dict[Any, Any] = {}
        self.replays = 0  # a capture never replayed gives way to another's (_make_room)
        self.device = device
        self.held = sum(t.untyped_storage().nbytes()
                        for t in [*self.copied.values(), *self.bases, *self.bases64])
        self.device_graph = torch.cuda.CUDAGraph()
        mode = torch.inference_mode if inference else torch.no_grad

        def runs(kept: Dict[Any, Any]) -> Tuple[Any, Any]:
            with mode():
                return (graph.eager_run(*self.eager_inputs),
                        graph.fp64_run(*self.inputs64, kept=kept))

        with capturing.on_stream(device):
            # Warmed up on the stream it is captured on: on ROCm a BLAS handle is made per
            # (device, stream) at its first use, which a capture cannot do
            # (ROCm/TransformerEngine#644: a capture error, or a hang). The warm-up is this
            # check's references (``first``): the capture records, it computes nothing.
            warm_kept: Dict[Any, Any] = {}
            ref, ref64 = runs(warm_kept)
            self.first: Optional[Refs] = (self.eager_inputs, self.inputs64, ref, ref64,
                                          warm_kept)
            torch.cuda.synchronize(device)
            reserved = torch.cuda.memory_reserved(device)
            self.ref, self.ref64 = capturing.capture_into(
                self.device_graph, lambda: runs(self.kept), device)
        self.held += max(0, torch.cuda.memory_reserved(device) - reserved)
        with _LOCK:
            _HELD["bytes"] += self.held
        weakref.finalize(self, _release, self.held)

    def fits(self, flat: List[Any], pre: Any) -> List[int]:
        """The inputs that moved from where the capture reads them ([] where it can replay);
        [-1] where a layout or a value changed (never replayable for these inputs)."""
        now = [_where(x) for x in flat]
        if pre.layout_key() != self.layout_key or [_layout(w) for w in now] != self.layouts:
            return [-1]
        return [i for i, where in self.read.items() if now[i] != where]

    def replay(self, flat: List[Any], pre: Any) -> Refs:
        self.take(flat)
        return self.run(pre)

    def first_replay(self, pre: Any) -> Refs:
        """The capturing check's references from the capture's first replay, not from its
        warm-up: a device graph's first launch costs more than the next ones (a deferred
        check's first launch took 2.4-2.8 ms beyond the compiled call against 1.4-1.6 on an
        H100, BENCHMARKS.md), and paid here it is part of the shape's first check, which
        the budget leaves out; its verdict is then the replay's, as every later one is.
        Not counted as a replay (``_make_room``: a shape checked once gives way)."""
        self.first = None  # the warm-up's results go before the replay's are made
        with capturing.on_stream(self.device):
            return self.run(pre, counted=False)

    def take(self, flat: List[Any]) -> None:
        """Copy the inputs a replay does not read in place into its buffers (a deferred
        check does so on the program's stream, before the program can change them)."""
        for i, buf in self.copied.items():
            buf.copy_(flat[i])

    def run(self, pre: Any, counted: bool = True) -> Refs:
        """Refill the written inputs' buffers from the snapshot and replay (``counted``
        among its ``replays``)."""
        pre.fill(self.bases)
        pre.fill(self.bases64)
        self.replays += counted
        self.device_graph.replay()
        return self.eager_inputs, self.inputs64, self.ref, self.ref64, dict(self.kept)


class Replays:
    """A graph's captures by shape, and what it saw of its inputs before capturing."""

    def __init__(self, gm: Any) -> None:
        ops = unreplayable_ops(gm)
        storage = [op for op in ops if op in reference.STORAGE_READERS]
        self.never = "" if not ops else (
            f"run op by op: it calls {', '.join(storage[:3])}, which reads the storage "
            "around a view (a replay reads copies of the views)" if storage else
            f"run op by op: it calls {', '.join(ops[:3])}, whose outputs depend on data (a "
            "device graph cannot hold them)")
        self.seen: Dict[Any, List[Any]] = {}  # shape -> the inputs' addresses at a run
        self.captured: Dict[Any, Captured] = {}
        self.moved: Dict[Any, set] = {}  # shape -> inputs copied at the next capture
        self.captures: Dict[Any, int] = {}
        self.why = self.never or "run op by op: not captured yet (the first run warms up)"
        self.graph: Any = None  # a weak reference to its graph (its calls, its record)
        # The references just run came from a capture made by that run (its references will
        # be replayed: the judge's statistics are captured at once too,
        # ``errors.Captures.expected``); cleared by each run (``compare.reference_runs``).
        self.fresh = False

    def replayed(self, shape: Any, graph: Any, flat: List[Any], pre: Any,
                 inference: bool, need: int = 0) -> Optional[Refs]:
        """The references from a replay, or from the run a capture begins with (at a shape's
        first check where they ``need`` little memory, else at its second); None where
        they must run op by op (then call ``ran``)."""
        device = None if self.never else _device(flat)
        if device is None:
            return None
        plan = getattr(graph, "schedule", None)  # (none: a test's bare graph)
        self.graph = self.graph or (weakref.ref(graph) if plan is not None else None)
        captured = self.captured.get(shape)
        if captured is not None:
            moved = captured.fits(flat, pre)
            if not moved:
                self._replaying()
                return captured.replay(flat, pre)
            self._drop(shape, moved)
            return None
        if schedule.calibrating(plan):
            return None  # captured at a later check: this one times a warm check
        seen = self.seen.get(shape)
        if self.captures.get(shape, 0) >= RECAPTURES or seen is None and not (
                0 < need <= FIRST_SHARE * torch.cuda.get_device_properties(device)
                .total_memory):
            return None
        moved = self.moved.get(shape, set()) | {
            i for i, (was, x) in enumerate(zip(seen or [], flat)) if was != _where(x)}
        moved |= _small_inputs(flat)
        try:
            captured = Captured(graph, flat, pre, sorted(moved), inference, device)
        except Exception as exc:  # noqa: BLE001 - an op that synchronises: op by op for good
            torch.cuda.synchronize()
            if seen is None:  # a first run may fail for a reason a second has learned
                torch.cuda.empty_cache()  # (inference mode, memory): captured at the next
                return None
            self.never = (f"run op by op: capturing them failed ({type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0][:120] if str(exc) else ''})")
            self.why = self.never
            return None
        self.captures[shape] = self.captures.get(shape, 0) + 1
        return self._keep(shape, captured, device, first=seen is None, pre=pre)

    def _keep(self, shape: Any, captured: Captured, device: Any, first: bool, pre: Any
              ) -> Refs:
        """A new capture kept, room made for it among the process's (``HELD_SHARE``), or let
        go where none can be made; this check's references either way."""
        limit = HELD_SHARE * torch.cuda.get_device_properties(device).total_memory
        if _HELD["bytes"] > limit:
            _make_room(_HELD["bytes"] - limit, device, self.calls())
        if _HELD["bytes"] > limit:
            self.why = (f"run op by op: a capture would hold {captured.held / 2**20:.0f} MiB, "
                        f"past {HELD_SHARE:.0%} of the device's memory with the others' "
                        f"({(_HELD['bytes'] - captured.held) / 2**20:.0f} MiB)")
            self.captures[shape] = RECAPTURES  # not tried again
            refs, captured.first = captured.first, None
            del captured  # its pool and buffers go back (``_release``)
            torch.cuda.empty_cache()
            return refs  # type: ignore[return-value]
        self.captured[shape] = captured
        with _ROOM:  # a shape captured again is as young as its new capture
            _LIVE[:] = [e for e in _LIVE if e[0]() is not self or e[1] != shape]
            _LIVE.append((weakref.ref(self), shape))
        self.why = (f"run op by op and captured as a device graph, "
                    f"{'its first replay judged' if first else 'replayed from the next check on'}"
                    f" (the process's captures hold {_HELD['bytes'] / 2**20:.0f} MiB)")
        self.fresh = True
        if first:  # a first check, left out of the budget: the first launch's extra cost here
            return captured.first_replay(pre)
        # (at a second check, inside the budget, a replay's device time is not worth it: an
        # 8B decode step's replay took 9-17 ms)
        refs, captured.first = captured.first, None
        return refs  # type: ignore[return-value]

    def ready(self, shape: Any, flat: List[Any], pre: Any) -> Optional[Captured]:
        """This shape's capture, where it can replay on these inputs now (none moved); None
        where ``replayed`` must decide (capture, recapture, or op by op)."""
        captured = self.captured.get(shape)
        if captured is None or _device(flat) is None or captured.fits(flat, pre):
            return None
        self._replaying()
        return captured

    def _replaying(self) -> None:
        self.why = (f"replayed as a device graph (the process's captures hold "
                    f"{_HELD['bytes'] / 2**20:.0f} MiB)")

    def ran(self, shape: Any, flat: List[Any]) -> None:
        """The references of ``shape`` ran op by op: where its inputs were (on a GPU, for
        as many shapes as are analysed, ``schedule.SHAPE_CAP``: a dynamic graph may see
        thousands)."""
        if (self.never or shape in self.captured or _device(flat) is None
                or self.captures.get(shape, 0) >= RECAPTURES):
            return
        if shape in self.seen or len(self.seen) < schedule.SHAPE_CAP:
            self.seen[shape] = [_where(x) for x in flat]

    def written_later(self, shape: Any, inputs: List[int]) -> None:
        """``inputs`` were written in place by the program before a deferred replay read
        them: copied from the next capture on, as inputs that move are."""
        if shape in self.captured:
            self._drop(shape, inputs)
            self.why = ("run op by op: the program wrote inputs the capture read in place "
                        "before a replay read them (copied from the next capture on)")

    def calls(self) -> int:
        """Its graph's calls so far (0 before its first check)."""
        graph = self.graph() if self.graph is not None else None
        return graph.schedule.calls if graph is not None else 0

    def give_way(self, shape: Any) -> None:
        """``shape``'s capture, never replayed, goes (its memory for another's); captured
        again at its next check if there is room then (a give-way is not one of its
        ``RECAPTURES``)."""
        del self.captured[shape]
        self.captures[shape] = max(self.captures.get(shape, 1) - 1, 0)
        self.why = ("run op by op: its capture, never replayed, gave way to another "
                    "graph's (the captures' memory is bounded)")
        graph = self.graph() if self.graph is not None else None
        if graph is not None:  # said now, not at its next check (which may never come)
            graph.note(references=self.why)

    def _drop(self, shape: Any, moved: List[int]) -> None:
        del self.captured[shape]  # its pool and buffers go back (``_release``)
        if moved == [-1]:
            self.captures[shape] = RECAPTURES
        else:
            self.moved.setdefault(shape, set()).update(moved)
        self.why = "run op by op: its inputs moved from where the capture read them"


def _make_room(needed: int, device: Any, calls: int) -> None:
    """Free at least ``needed`` bytes of captures never replayed whose graphs were called
    no more often than the one asking (``calls``), the least called first, then the
    oldest: a prompt's shape, checked once, gives way to a decode step's, never the other
    way round (the two would take each other's place at every check). Where all of them
    together would not free enough, none goes."""
    with _ROOM:
        live = [(entry, entry[0]()) for entry in _LIVE]
        live = [(entry, owner) for entry, owner in live  # dropped, or its graph gone
                if owner is not None and entry[1] in owner.captured]
        _LIVE[:] = [entry for entry, _ in live]
        idle = []  # (its graph's calls, its age, the entry, its graph's Replays, its bytes)
        for age, (entry, owner) in enumerate(live):
            captured, used = owner.captured[entry[1]], owner.calls()
            if not captured.replays and captured.device == device and used <= calls:
                idle.append((used, age, entry, owner, captured.held))
        idle.sort(key=lambda x: x[:2])
        if sum(held for *_, held in idle) < needed:
            return
        freed = 0
        for _, _, entry, owner, held in idle:
            if freed >= needed:
                break
            freed += held
            _LIVE.remove(entry)
            owner.give_way(entry[1])  # its pool and buffers go back (``_release``)
    torch.cuda.empty_cache()  # the freed pools' blocks, for the capture that needs them


def _small_inputs(flat: List[Any]) -> set:
    """The inputs that are not parameters, up to ``COPY_BYTES`` each and ``COPY_TOTAL``
    together (in order): copied at each replay, not read in place."""
    found, total = set(), 0
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter):
            size = x.untyped_storage().nbytes()
            if size <= COPY_BYTES and total + size <= COPY_TOTAL:
                found.add(i)
                total += size
    return found


def _release(held: int) -> None:  # a capture's finalizer
    with _LOCK:
        _HELD["bytes"] -= held


def held_bytes() -> int:
    """What the captures of this process hold now."""
    return _HELD["bytes"]


def _device(flat: List[Any]) -> Any:
    """The one CUDA/HIP device all of ``flat``'s tensors are on; None where there is none
    (a CPU graph, or tensors on several devices)."""
    devices = {x.device for x in flat if isinstance(x, torch.Tensor)}
    device = next(iter(devices)) if len(devices) == 1 else None
    return device if device is not None and device.type == "cuda" else None
