"""The regions of a call's written inputs that the judge sees (``written_regions``): the
elements eager or compiled changed, flattened, the inputs alike in shape and dtype taken
as a group at the elements any of them changed.

Op by op, a group costs one synchronisation (its changed elements are counted before they
are taken) and some twenty small ops, each a Python dispatch and a launch: 0.6-0.8 ms of a
deferred verdict's 2.5 ms in an 8-layer decode loop on an H100 or H200 (BENCHMARKS.md).
Where the caller keeps a graph's ``Regions`` (a verdict read later, on a GPU), a group seen
before at a count of changed elements is found again without those: the same device work
at that count (``torch.nonzero_static``, which reads no size back: pytorch/pytorch#141838,
CUDA from torch 2.6) is captured as a device graph over buffers of its own, and replayed
after one copy of the group into them; whether each group's count held is read in one
transfer for all of them, and a group whose count moved is found op by op (and not
captured again).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from rocm_autopatch.sentinel.runs import footprint

Written = Tuple[Any, Any, Any, Any]  # a written input: before, eager, compiled, float64

# On a GPU, inputs of one shape are compared and gathered stacked, ``footprint.STACK_BYTES``
# of one kind at a time: one launch per chunk, not per input (an 8B Llama's decode step
# writes 64 caches: 5.7 ms one by one, 2.6 stacked, on an H200; BENCHMARKS.md), its
# temporaries bounded and in the memory estimate. On the CPU a launch costs little and the
# stack's copy is all cost (64 small caches: 10 ms one by one, 32 stacked, on the 2-core
# CI machine): one by one there.
STACK_ON_CPU = False

# Groups captured per graph (a decode step's caches: one or two: keys and values alike).
CAPTURED_GROUPS = 4
# Bytes of the copies all of the process's captured groups hold (four per written input:
# before, eager, compiled, float64); a group past it is found op by op. The capture's own
# temporaries are the stacks of ``footprint.STACK_BYTES`` and one flag per element.
CAPTURED_BYTES_ALL = 256 << 20
_HELD = {"bytes": 0}
_HELD_LOCK = threading.Lock()


def written_regions(items: List[Written], regions: Optional[Regions] = None,
                    expected: bool = False) -> List[Tuple[Any, Any, Any]]:
    """Written inputs as the judge sees them: the elements that eager or compiled changed,
    flattened (the rest is the state before the call in both, and judging it would dilute
    the statistics: a static KV cache is written one position per decode step, and judging
    all of it was most of a decode check's time). Inputs of one shape and dtype are judged
    at the elements any of them changed (a decode step's 16 caches, written at the same
    position: one synchronisation, not 16). Where everything or nothing changed, the whole
    inputs. ``regions``: the graph's captured groups (``Regions``); ``expected``: its
    groups will be found again (its shape's references were just captured), captured now."""
    found: List[Any] = [None] * len(items)
    groups: Dict[Any, List[int]] = {}
    for k, item in enumerate(items):
        if _comparable(*item):
            groups.setdefault((item[0].shape, item[0].dtype, item[0].device), []).append(k)
        else:
            found[k] = item[1:]
    replayed = regions.replayed(groups, items) if regions is not None else {}
    for name, ks in groups.items():
        group = [items[k] for k in ks]
        if name in replayed:
            taken = replayed[name]
        else:
            changed = _changed(group)
            where = changed.flatten().nonzero().squeeze(1)
            if where.numel() in (0, changed.numel()):
                taken = [item[1:] for item in group]
            else:
                taken = _gathered(group, where)
                if regions is not None:
                    regions.learn(name, group, where.numel(), expected)
        for k, regions_of_k in zip(ks, taken):
            found[k] = regions_of_k
    return found


def _gathered(group: List[Written], where: Any) -> List[Tuple[Any, Any, Any]]:
    """Each input's eager, compiled and float64 elements at ``where`` (flat indices)."""
    kinds = [_taken([item[kind] for item in group], where) for kind in (1, 2, 3)]
    return list(zip(*kinds))


def _at_count(group: List[Written], count: int) -> Tuple[List[Tuple[Any, Any, Any]], Any]:
    """``_gathered`` at the group's first ``count`` changed elements, and whether exactly
    ``count`` changed (a bool on the device): device work only, no size read back, so
    that it can be captured as a device graph and replayed."""
    import torch

    changed = _changed(group).flatten()
    where = torch.nonzero_static(changed, size=count, fill_value=0).squeeze(1)
    return _gathered(group, where), changed.sum() == count


class Regions:
    """One graph's groups of written inputs whose regions are captured (``_Captured``), by
    layout: a group at its second verdict at one count (at its first where ``expected``),
    ``CAPTURED_GROUPS`` at most. A group whose count moved is found op by op from then on;
    the first capture or replay that fails ends them all for the graph (a reason such as
    memory or a torch without ``nonzero_static`` on the device holds for every group).
    ``capture(work, device)`` is the caller's: it captures ``work`` as a device graph and
    returns (that graph, ``work``'s result)."""

    def __init__(self, capture: Callable[[Callable[[], Any], Any], Tuple[Any, Any]],
                 devices: Tuple[str, ...] = ("cuda",)) -> None:
        self.capture, self.devices = capture, devices
        self.made: Dict[Any, _Captured] = {}
        self.seen: Set[Any] = set()  # (layout, count) found once (bounded)
        self.moved: Set[Any] = set()  # layouts whose count moved: never captured again
        self.why = ""  # why captures ended, in words ("" while they go on)

    def key(self, name: Any, group: List[Written]) -> Optional[Any]:
        """The group's layout, where it may be captured (None: captures ended, a CPU)."""
        if self.why or group[0][0].device.type not in self.devices:
            return None
        return name, tuple((tuple(t.shape), t.stride(), t.dtype) for item in group
                           for t in item)

    def replayed(self, groups: Dict[Any, List[int]], items: List[Written]
                 ) -> Dict[Any, List[Tuple[Any, Any, Any]]]:
        """The regions of the groups whose capture replayed and whose count held, by name;
        the others are found op by op by the caller."""
        import torch

        found: Dict[Any, Tuple[Any, List[Tuple[Any, Any, Any]]]] = {}
        held = []
        for name, ks in groups.items():
            group = [items[k] for k in ks]
            key = self.key(name, group)
            if key not in self.made:
                continue
            try:
                taken, ok = self.made[key].replay(group)
            except Exception as exc:  # noqa: BLE001 - found op by op, as before
                self._end(exc)
                return {}
            found[name] = key, taken
            held.append(ok)
        if not held:
            return {}
        kept = {}
        for (name, (key, taken)), ok in zip(found.items(), torch.stack(held).tolist()):
            if ok:
                kept[name] = taken
            else:
                del self.made[key]
                self.moved.add(key)
        return kept

    def learn(self, name: Any, group: List[Written], count: int, expected: bool) -> None:
        """A group just found op by op at ``count`` changed elements: captured where its
        layout was found at that count before (or ``expected``), room is left and nothing
        failed. Never raises."""
        key = self.key(name, group)
        if key is None or key in self.made or key in self.moved or len(
                self.made) >= CAPTURED_GROUPS:
            return
        if (key, count) not in self.seen and not expected:
            if len(self.seen) < 8 * CAPTURED_GROUPS:
                self.seen.add((key, count))
            return
        size = sum(t.numel() * t.element_size() for item in group for t in item)
        if not _hold(size):
            return
        try:
            made = self.made[key] = _Captured(group, count, self.capture)
        except Exception as exc:  # noqa: BLE001 - found op by op, as before
            _let_go(size)
            self._end(exc)
            return
        weakref.finalize(made, _let_go, size)

    def _end(self, exc: Exception) -> None:
        self.made.clear()
        self.why = f"{type(exc).__name__}: {str(exc).strip()[:160]}"


class _Captured:
    """One group's regions at one count, captured over copies of its own."""

    def __init__(self, group: List[Written], count: int, capture: Callable[..., Any]) -> None:
        import torch

        with torch.inference_mode(False):  # buffers a later call may write in any mode
            self.buffers = [tuple(torch.empty_like(t) for t in item) for item in group]
        self._fill(group)
        # Run once before its capture (its kernels loaded, its allocations made), then
        # captured: everything the graph reads is held here for as long as it may replay.
        _at_count(self.buffers, count)
        self.graph, (self.taken, self.held) = capture(
            lambda: _at_count(self.buffers, count), group[0][0].device)

    def _fill(self, group: List[Written]) -> None:
        import torch

        torch._foreach_copy_([b for item in self.buffers for b in item],
                             [t for item in group for t in item])

    def replay(self, group: List[Written]) -> Tuple[List[Tuple[Any, Any, Any]], Any]:
        """The group's regions at the captured count (read them before the next replay,
        which overwrites them), and whether its count held (a bool on the device)."""
        self._fill(group)
        self.graph.replay()
        return self.taken, self.held


def _hold(size: int) -> bool:
    """Room for a group's copies of ``size`` bytes among the process's captures (taken)?"""
    with _HELD_LOCK:
        if _HELD["bytes"] + size > CAPTURED_BYTES_ALL:
            return False
        _HELD["bytes"] += size
        return True


def _let_go(size: int) -> None:  # a captured group's finalizer
    with _HELD_LOCK:
        _HELD["bytes"] -= size


def _step(tensor: Any) -> int:
    """How many tensors like ``tensor`` a stack of at most ``footprint.STACK_BYTES`` holds
    (1: none stacked)."""
    if tensor.device.type == "cpu" and not STACK_ON_CPU:
        return 1
    return max(1, footprint.STACK_BYTES // max(1, tensor.numel() * tensor.element_size()))


def _chunks(items: List[Any], like: Any) -> List[List[Any]]:
    """``items`` in runs of as many as a stack of tensors like ``like`` holds (``_step``)."""
    step = _step(like)
    return [items[i:i + step] for i in range(0, len(items), step)]


def _changed(items: List[Written]) -> Any:
    """Where eager or compiled differs from the state before, in any of ``items`` (alike
    in shape and dtype): a bool tensor of one item's shape, in its logical order."""
    import torch

    changed = None
    for part in _chunks(items, items[0][0]):
        if len(part) == 1:
            before, eager, compiled, _ = part[0]
            here = eager != before
            here |= compiled != before
        else:
            before = torch.stack([item[0] for item in part])
            here = torch.stack([item[1] for item in part]) != before
            here |= torch.stack([item[2] for item in part]) != before
            here = here.any(0)
        changed = here if changed is None else changed.logical_or_(here)
    return changed


def _taken(tensors: List[Any], where: Any) -> List[Any]:
    """Each tensor's elements at ``where`` (flat indices, in logical order)."""
    import torch

    if len({t.dtype for t in tensors}) > 1:
        return [torch.take(t, where) for t in tensors]
    taken: List[Any] = []
    for chunk in _chunks(tensors, tensors[0]):
        if len(chunk) == 1:
            taken.append(torch.take(chunk[0], where))
        else:
            taken.extend(torch.stack(chunk).flatten(1).index_select(1, where).unbind(0))
    return taken


def _comparable(before: Any, eager: Any, compiled: Any, fp64: Any) -> bool:
    import torch

    return (isinstance(before, torch.Tensor) and isinstance(eager, torch.Tensor)
            and isinstance(compiled, torch.Tensor) and isinstance(fp64, torch.Tensor)
            and before.shape == eager.shape == compiled.shape == fp64.shape
            and eager.dtype == compiled.dtype == before.dtype)
