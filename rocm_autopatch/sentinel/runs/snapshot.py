"""The state a checked call writes, as it was before the call: copied once per storage, so
that overlapping views still overlap in the copies the eager and float64 runs write into,
and put back into the program's own tensors where ``fallback`` gives eager's result."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Optional, Tuple

import torch

from rocm_autopatch.sentinel.runs import footprint, reference


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor over the whole storage of ``t``, in ``t``'s dtype."""
    storage = t.untyped_storage()
    return t.new_empty(0).set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))


class Snapshot:
    """The inputs a graph writes, as they were before a call, and every input that shares
    memory with one of them: one copy per storage, so that overlapping views still overlap
    in the copies the references run on (two views of one buffer, one of them written)."""

    def __init__(self, flat: List[Any], mutated: FrozenSet[int]) -> None:
        by_storage: Dict[Any, List[int]] = {}
        for i, x in enumerate(flat):
            if isinstance(x, torch.Tensor):
                by_storage.setdefault(footprint.storage_of(x), []).append(i)
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
        out: Dict[int, torch.Tensor] = {}
        for members, saved, layout in self.groups:
            copy = reference.fp64_copy(saved) if fp64 else saved.clone()
            if layout is None:
                out[members[0]] = copy
            else:
                for i, (size, stride, offset) in zip(members, layout):
                    out[i] = copy.as_strided(size, stride, offset)
        return out

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
