"""What a check's runs hold at their peak, measured on the graph's run on fake tensors (the
analysis, ``numerics``), before anything real is allocated: the memory a check may need.

A graph's generated code lets each value go after its last use, and the fake run does the
same: the tensors the graph creates are followed by weak references to their storages, and
what is alive after each op is summed. The float64 run holds the same values in float64,
plus, for one op at a time, float64 casts of the graph's inputs, parameters and buffers it
reads (a weight is cast for the op that uses it, then dropped). The judge holds a few
float64 temporaries per output. The old account summed every tensor the graph creates: at
8B parameters and a 2,048-token prefill that was 338 GiB, and the prefill went unchecked.
What the float64 run and the judge hold beyond that is calibrated on a GPU (below).
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Set, Tuple

import torch


def storage_of(t: torch.Tensor) -> Any:
    """A weak reference to ``t``'s storage: a key that tells two views of one storage apart
    from two storages, and says when the storage is gone (``expired``)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(t.untyped_storage())


def concrete(size: Any) -> int:
    """A byte count as a plain int. The fake run's shape environment makes sizes symbolic
    (each with the real call's value as its hint); a symbolic total reached the skip
    message's format string and raised into the program (the two-GPU job, rank 1 short of
    memory). A size with no hint counts as unknown, 0."""
    try:
        return int(size)
    except Exception:  # noqa: BLE001 - an unbacked size: nothing to add
        return 0


def _bytes(t: torch.Tensor) -> Tuple[int, int]:
    """(its storage's bytes, the same elements in float64 where floating)."""
    size = concrete(t.untyped_storage().nbytes())
    return size, (size // t.element_size() * 8 if t.is_floating_point() else size)


class Footprint(NamedTuple):
    peak_bytes: int = 0  # the eager run: the most the graph's own values hold at once
    peak_fp64_bytes: int = 0  # the float64 run: the same values in float64, at once
    cast_fp64_bytes: int = 0  # the largest float64 casts of inputs one op reads
    out_bytes: int = 0  # the graph's outputs in their own dtypes
    out_fp64_bytes: int = 0  # and in float64


class Counter:
    """Fed each op of the fake run (``before`` its call, ``after`` with what it returned)."""

    def __init__(self, given: Set[Any]) -> None:
        self.given = given  # the storages the graph is handed (inputs, parameters, buffers)
        self.made: Set[Any] = set()
        self.live: List[Tuple[Any, int, int]] = []  # (storage's weak ref, bytes, fp64 bytes)
        self.peak = [0, 0, 0]  # eager, float64, the largest cast of one op's inputs

    def before(self, args: List[Any]) -> None:
        cast = 0
        for t in args:
            if isinstance(t, torch.Tensor) and t.is_floating_point() \
                    and t.dtype != torch.float64 and storage_of(t) not in self.made:
                cast += _bytes(t)[1]
        self.peak[2] = max(self.peak[2], cast)

    def after(self, out: List[Any], cast: bool = False) -> None:
        """``cast``: the op is autocast's cast of a weight (``kept_cast``), which the
        float64 run does not make (autocast leaves float64 alone): its outputs take no room
        there. Autocast keeps those casts for the whole region, so the fake run of a
        bf16-autocast training forward (8 layers of TinyLlama's widths, 512 tokens) held
        every weight at once in float64: 18 GiB estimated, against the 0.75 GiB a capture
        of its references held on an H200."""
        for t in out:
            if isinstance(t, torch.Tensor):
                ref = storage_of(t)
                if ref not in self.made and ref not in self.given:
                    self.made.add(ref)
                    size, size64 = _bytes(t)
                    self.live.append((ref, size, 0 if cast else size64))
        self.live = [entry for entry in self.live if not entry[0].expired()]
        self.peak[0] = max(self.peak[0], sum(entry[1] for entry in self.live))
        self.peak[1] = max(self.peak[1], sum(entry[2] for entry in self.live))

    def result(self, outputs: List[Any]) -> Footprint:
        sizes = [_bytes(t) for t in outputs if isinstance(t, torch.Tensor)]
        return Footprint(self.peak[0], self.peak[1], self.peak[2],
                         sum(s[0] for s in sizes), sum(s[1] for s in sizes))


def kept_cast(func: Any, args: Any, out: Any) -> bool:
    """Is it autocast's cast of a weight (a leaf that requires grad, to another floating
    dtype: the casts autocast keeps for its whole region), which the float64 run does not
    make? Asked only where autocast is on (``autocasting``). Other casts count: the float64
    run makes a float64 copy of an input for one, and of a value made keeps that value."""
    x = args[0] if args else None
    return (func.overloadpacket is torch.ops.aten._to_copy and isinstance(out, torch.Tensor)
            and isinstance(x, torch.Tensor) and x.is_leaf and x.requires_grad
            and x.is_floating_point() and out.is_floating_point() and out.dtype != x.dtype)


def autocasting(gm: Any) -> bool:
    """Autocast on at the call (read here: inside a dispatch mode it reads off), or entered
    by the graph itself (Dynamo keeps ``torch.autocast`` regions as nodes)."""
    try:
        on = any(torch.is_autocast_enabled(d) for d in ("cuda", "cpu"))
    except TypeError:  # torch before 2.4: one flag per device
        on = torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()
    nodes = getattr(getattr(gm, "graph", None), "nodes", ())
    return on or any("_enter_autocast" in str(n.target) for n in nodes)


# Measured against torch's own peak counter (an H200, torch 2.11, a 4-layer Llama of
# TinyLlama's widths, a 2,048-token bf16 prefill; BENCHMARKS.md): the float64 run held 2.5
# GB where the fake run's values and casts came to 1.1 (attention runs its math kernel in
# float64, which the fake run of the bf16 graph does not see: its score matrices), and the
# judge 14.1 GB, 25 times its outputs in float64 (torch's criterion and the statistics
# make float64 copies of the 65M-element logits). The factors keep the estimate above both.
FP64_RUN_FACTOR = 3  # the float64 run's peak, over the values the fake run holds at once
JUDGE_FACTOR = 26  # the judge's temporaries, in float64 copies of the outputs
# On a GPU the judge compares and gathers the written inputs of one shape stacked, this
# many bytes of one kind at a time (``sentinel/regions.py`` ``written_regions``): at most
# four such stacks at once (before, eager, compiled and their comparison), and never more
# than four times the state itself.
STACK_BYTES = 1 << 26


def reference_parts(found: Footprint, state: int) -> Dict[str, int]:
    """Memory a forward check may need at its peak, before anything is copied, by what holds
    it (the need is their sum): the state the graph writes (``state`` bytes: kept, a copy
    for eager, one in float64, and the judge's stacks of it); then the eager run at its
    peak, or, after it, its outputs with the compiled ones beside the float64 run at its
    peak and one op's casts; and the judge's float64 temporaries. By part, so that a check
    skipped for memory says which is large, and so which factor above a larger graph meets
    (an 8B prefill on an 80 GB card: 39 GiB, BENCHMARKS.md)."""
    parts = {"copies of the state it writes": 6 * state + 4 * min(state, STACK_BYTES)}
    after_eager = (2 * found.out_bytes + FP64_RUN_FACTOR * found.peak_fp64_bytes
                   + found.cast_fp64_bytes)
    if found.peak_bytes > after_eager:
        parts["the eager run"] = found.peak_bytes
    else:
        parts["the float64 run"] = FP64_RUN_FACTOR * found.peak_fp64_bytes
        parts["one op's float64 casts"] = found.cast_fp64_bytes
        parts["eager's and compiled's outputs"] = 2 * found.out_bytes
    parts["the judge"] = JUDGE_FACTOR * found.out_fp64_bytes
    return parts


def said(parts: Dict[str, int]) -> str:
    """``reference_parts`` in words: about the whole (the parts, largest first, those of no
    bytes left out)."""
    each = ", ".join(f"{name} {size_said(size)}"
                     for name, size in sorted(parts.items(), key=lambda kv: -kv[1]) if size)
    return f"about {size_said(sum(parts.values()))} ({each})"


def size_said(size: int) -> str:
    """Bytes in GiB from 1 GiB up, else in MiB."""
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
