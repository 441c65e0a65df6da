"""The regions of a call's written inputs that the judge sees (``written_regions``): the
elements eager or compiled changed, flattened, the inputs alike in shape and dtype taken
as a group at the elements any of them changed, found with one synchronisation a group.

Found op by op on purpose: the same work at the count found before (``nonzero_static``,
no size read back) captured as a device graph and replayed after one copy of the group
into its buffers took more host time, not less: 0.45 ms against 0.27 for a decode step's
16 caches, and a deferred verdict's median 2.50 ms against 2.34 in an 8-layer decode loop,
on an H100 (BENCHMARKS.md, "Written regions captured, tried and not kept")."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from rocm_autopatch.sentinel.runs import footprint

Written = Tuple[Any, Any, Any, Any]  # a written input: before, eager, compiled, float64

# On a GPU, inputs of one shape are compared and gathered stacked, ``footprint.STACK_BYTES``
# of one kind at a time: one launch per chunk, not per input (an 8B Llama's decode step
# writes 64 caches: 5.7 ms one by one, 2.6 stacked, on an H200; BENCHMARKS.md), its
# temporaries bounded and in the memory estimate. On the CPU a launch costs little and the
# stack's copy is all cost (64 small caches: 10 ms one by one, 32 stacked, on the 2-core
# CI machine): one by one there.
STACK_ON_CPU = False


def written_regions(items: List[Written]) -> List[Tuple[Any, Any, Any]]:
    """Written inputs as the judge sees them: the elements that eager or compiled changed,
    flattened (the rest is the state before the call in both, and judging it would dilute
    the statistics: a static KV cache is written one position per decode step, and judging
    all of it was most of a decode check's time). Inputs of one shape and dtype are judged
    at the elements any of them changed (a decode step's 16 caches, written at the same
    position: one synchronisation, not 16). Where everything or nothing changed, the whole
    inputs."""
    found: List[Any] = [None] * len(items)
    groups: Dict[Any, List[int]] = {}
    for k, item in enumerate(items):
        if _comparable(*item):
            groups.setdefault((item[0].shape, item[0].dtype, item[0].device), []).append(k)
        else:
            found[k] = item[1:]
    for ks in groups.values():
        changed = _changed([items[k] for k in ks])
        where = changed.flatten().nonzero().squeeze(1)
        if where.numel() in (0, changed.numel()):
            for k in ks:
                found[k] = items[k][1:]
            continue
        kinds = [_taken([items[k][kind] for k in ks], where) for kind in (1, 2, 3)]
        for k, taken in zip(ks, zip(*kinds)):
            found[k] = taken
    return found


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
