"""The state a checked call writes, as it was before the call: copied once per storage, so
that overlapping views still overlap in the copies the eager and float64 runs write into,
and put back into the program's own tensors where ``fallback`` gives eager's result."""

from __future__ import annotations

import bisect
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

import torch

from rocm_autopatch.sentinel.runs import footprint, reference


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor over the whole storage of ``t``, in ``t``'s dtype."""
    storage = t.untyped_storage()
    return t.new_empty(0).set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))


def _sharing(flat: List[Any], mutated: FrozenSet[int]) -> List[int]:
    """The tensors among ``flat`` that may share a storage with a written one, in order:
    the written ones, and each other whose address lies within a written one's storage (a
    view of that storage always does), to be grouped by storage after. A decode step's
    inputs are mostly weights: their addresses are read, not their storages (about 1 us a
    tensor, some 100 tensors a check)."""
    spans = []
    for i in mutated:
        x = flat[i]
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    if not spans:
        return []
    starts, ends = _union(spans)
    found = []
    for i, x in enumerate(flat):
        if not isinstance(x, torch.Tensor):
            continue
        if i not in mutated:
            try:  # (an empty tensor's address reads 0 wherever its storage is)
                at = x.data_ptr() if x.numel() else None
            except RuntimeError:  # no address to read (no storage): grouped by storage
                at = None
            if at is not None:
                k = bisect.bisect_right(starts, at) - 1
                if k < 0 or at > ends[k]:
                    continue
        found.append(i)
    return found


def _union(spans: List[Tuple[int, int]]) -> Tuple[List[int], List[int]]:
    """``spans`` (closed address ranges) merged where they overlap: their starts and ends,
    in order."""
    starts: List[int] = []
    ends: List[int] = []
    for low, high in sorted(spans):
        if ends and low <= ends[-1]:
            ends[-1] = max(ends[-1], high)
        else:
            starts.append(low)
            ends.append(high)
    return starts, ends


class Snapshot:
    """The inputs a graph writes, as they were before a call, and every input that shares
    memory with one of them: one copy per storage, so that overlapping views still overlap
    in the copies the references run on (two views of one buffer, one of them written)."""

    def __init__(self, flat: List[Any], mutated: FrozenSet[int]) -> None:
        by_storage: Dict[Any, List[int]] = {}
        for i in _sharing(flat, mutated):
            by_storage.setdefault(footprint.storage_of(flat[i]), []).append(i)
        self.groups: List[Tuple[List[int], torch.Tensor, Optional[List[Any]]]] = []
        for members in by_storage.values():
            if not any(i in mutated for i in members):
                continue
            first = flat[members[0]]
            if len(members) == 1:
                self.groups.append((members, first.detach().clone(), None))
                continue
            if len({flat[i].dtype for i in members}) > 1:
                raise ValueError("inputs that share memory have different dtypes")
            layout = [(flat[i].size(), flat[i].stride(), flat[i].storage_offset())
                      for i in members]
            self.groups.append((members, _whole(first.detach()).clone(), layout))

    @staticmethod
    def bytes_needed(flat: List[Any], mutated: FrozenSet[int]) -> int:
        """What one copy of the state takes (whole storages where inputs share one)."""
        sizes: Dict[Any, int] = {}
        for i in mutated:
            x = flat[i]
            if isinstance(x, torch.Tensor):
                sizes[footprint.storage_of(x)] = x.untyped_storage().nbytes()
        return sum(sizes.values())

    @property
    def indices(self) -> FrozenSet[int]:
        return frozenset(i for members, _, _ in self.groups for i in members)

    def make(self, fp64: bool = False) -> Dict[int, torch.Tensor]:
        """Fresh copies of the state, float64 for the reference run, views re-made."""
        return self.views(self.bases(fp64))

    def bases(self, fp64: bool = False) -> List[torch.Tensor]:
        """One fresh copy per storage, in the order ``fill`` writes them: buffers a captured
        reference (``replay``) keeps and refills at every replay."""
        return [reference.fp64_copy(saved) if fp64 else saved.clone()
                for _, saved, _ in self.groups]

    def views(self, bases: List[torch.Tensor]) -> Dict[int, torch.Tensor]:
        """The inputs as views of ``bases`` (what ``make`` returns, over kept buffers)."""
        out: Dict[int, torch.Tensor] = {}
        for (members, _, layout), base in zip(self.groups, bases):
            if layout is None:
                out[members[0]] = base
            else:
                for i, (size, stride, offset) in zip(members, layout):
                    out[i] = base.as_strided(size, stride, offset)
        return out

    def fill(self, bases: List[torch.Tensor]) -> None:
        """Write the state before the call into ``bases`` (made by an earlier snapshot of
        the same inputs: ``layout_key`` equal), casting where they are float64."""
        for (_, saved, _), base in zip(self.groups, bases):
            base.copy_(saved)

    def layout_key(self) -> Tuple[Any, ...]:
        """What ``bases`` and ``views`` depend on: the groups, their copies' shapes, dtypes
        and devices, and the views' layouts."""
        return tuple((tuple(members), tuple(saved.shape), saved.stride(), saved.dtype,
                      saved.device, None if layout is None else tuple(layout))
                     for members, saved, layout in self.groups)

    def before(self, i: int) -> Optional[torch.Tensor]:
        """Input ``i`` as it was before the call (a view of the copy; None if not copied)."""
        for members, saved, layout in self.groups:
            if i in members:
                if layout is None:
                    return saved
                size, stride, offset = layout[members.index(i)]
                return saved.as_strided(size, stride, offset)
        return None

    def restore(self, flat: List[Any]) -> None:
        """Put the state back into the program's own tensors (what a call wrote, undone)."""
        with torch.no_grad():
            for members, saved, layout in self.groups:
                target = flat[members[0]]
                (target if layout is None else _whole(target)).copy_(saved)
