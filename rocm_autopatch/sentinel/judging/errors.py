"""What the judge reads of each floating value: compiled's and eager's errors against
float64 (in rounding units of the value's dtype), torch's ``allclose`` and RMSEs, computed
on the device for many values at once and read in one transfer.

A value's statistics are reductions over its elements; values are laid end to end (one
segment each) and every reduction is one ``index_add_`` or ``scatter_reduce_`` over the
segments, so the number of ops does not grow with the number of values or of their dtypes
and sizes. On a GPU each op is a Python dispatch and a launch: a decode step's logits and
16 written cache regions took two batches of some 85 ops each; laid end to end they take one
of about 60 (the judge 2.8 ms before, 2.0 after, of a 21 ms check on an H100,
BENCHMARKS.md).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, NamedTuple, Tuple

import torch

# Values up to this size are laid end to end with others (a decode step's logits, 128,256
# elements for Llama 3's vocabulary, judged in one batch with its 64 cache regions: one
# reduction batch and one transfer, not two)...
BATCH_NUMEL = 1 << 18
BATCH_ELEMENTS = 1 << 20  # ...up to this many elements a batch (its temporaries' bound)


class Value(NamedTuple):
    """A floating value to judge: eager's, compiled's and the float64 reference's."""

    index: int
    r: torch.Tensor
    c: torch.Tensor
    f: Any  # float64 reference (a tensor, or eager's value where there is none)

    def truth(self) -> torch.Tensor:
        return self.f if isinstance(self.f, torch.Tensor) else self.r


class Errors(NamedTuple):
    """What the rules read of one value, in rounding units of its dtype."""

    nonfinite: int  # NaN/inf in compiled where float64 is finite and representable, eager not
    overflow: bool  # an exact value beyond the dtype's largest
    count: int  # elements where all three are finite (the rules' elements)
    worst_c: float  # the worst element's error, compiled and eager
    worst_e: float
    rms_c: float  # RMSE against float64 over eps * the value's RMS
    rms_e: float
    bias_c: float  # mean error times the value's sign
    bias_e: float
    err_c: Any = None  # compiled's error per element (a tensor, 0 outside those elements)
    close: bool = False  # torch.allclose(eager, compiled) at the criterion's tolerance
    torch_rmse: Tuple[float, float] = (math.nan, math.nan)  # torch's RMSEs: compiled, eager


def statistics(values: List[Value], tol: float) -> Dict[int, Errors]:
    """Each value's statistics, by its index. Values of up to ``BATCH_NUMEL`` elements on
    one device go end to end in batches of up to ``BATCH_ELEMENTS``; larger ones alone
    (a view where it can be, never a copy of a large output)."""
    batches: List[List[Value]] = []
    filling: Dict[Any, List[Value]] = {}  # by device: the batch being filled
    sizes: Dict[Any, int] = {}  # its elements
    for v in values:
        numel, device = v.c.numel(), v.c.device
        if numel > BATCH_NUMEL:
            batches.append([v])
            continue
        if device not in filling or sizes[device] + numel > BATCH_ELEMENTS:
            filling[device], sizes[device] = [], 0
            batches.append(filling[device])
        filling[device].append(v)
        sizes[device] += numel
    found: Dict[int, Errors] = {}
    for batch in batches:
        found.update(_batch(batch, tol))
    return found


def _end_to_end(parts: List[torch.Tensor]) -> torch.Tensor:
    return parts[0].reshape(-1) if len(parts) == 1 else torch.cat([p.reshape(-1)
                                                                   for p in parts])


def _runs(values: List[Value], tol: float) -> Tuple[List[Value], Tuple[torch.Tensor, ...]]:
    """The batch's values in the order they are laid out, and their float64, compiled and
    eager elements end to end (as float64) with whether eager and compiled are close there
    (torch's ``allclose``, in their own dtype: torch computes it there). Values of one set
    of dtypes are laid out together so that each run is concatenated once in its dtype."""
    runs: Dict[Any, List[Value]] = {}
    for v in values:
        runs.setdefault((v.c.dtype, v.r.dtype, v.truth().dtype), []).append(v)
    f_parts, c_parts, r_parts, close_parts = [], [], [], []
    for (c_dtype, r_dtype, _), run in runs.items():
        f, c, r = (_end_to_end(xs) for xs in ([v.truth() for v in run], [v.c for v in run],
                                              [v.r for v in run]))
        close_parts.append(torch.isclose(r, c, rtol=tol, atol=tol, equal_nan=True)
                           if c_dtype == r_dtype else torch.zeros_like(c, dtype=torch.bool))
        f_parts.append(f.double())
        c_parts.append(c.double())
        r_parts.append(r.double())
    return ([v for run in runs.values() for v in run],
            tuple(_end_to_end(parts) for parts in (f_parts, c_parts, r_parts, close_parts)))


def _batch(values: List[Value], tol: float) -> Dict[int, Errors]:
    """The statistics of one batch: values end to end, each a segment, over the elements
    where all three are finite and the exact value is representable; read in one
    transfer."""
    values, (f64, c64, r64, close_el) = _runs(values, tol)
    device = f64.device
    counts = [v.c.numel() for v in values]
    segments = len(values)
    infos = [torch.finfo(v.c.dtype) for v in values]
    # per value: its dtype's rounding unit, smallest normal and largest, and its size (one
    # transfer to the device)
    per_value = torch.tensor([[i.eps for i in infos], [i.tiny for i in infos],
                              [i.max for i in infos], counts], dtype=torch.float64,
                             device=device)
    seg = torch.repeat_interleave(torch.arange(segments, device=device),
                                  per_value[3].long(), output_size=len(f64))
    eps_el, big_el = per_value[0::2][:, seg]  # (eps, max) per element

    def sums(*rows: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(rows), segments, dtype=torch.float64,
                           device=device).index_add_(1, seg, torch.stack(rows))

    overflow = f64.abs() > big_el  # inf is the right rounding there
    good = torch.isfinite(f64) & ~overflow
    finite_r, finite_c = torch.isfinite(r64), torch.isfinite(c64)
    both = good & finite_r & finite_c
    fv, cv, rv = (torch.where(both, x, 0.0) for x in (f64, c64, r64))
    dc, dr = cv - fv, rv - fv
    (n, squares, nonfinite, sq_c, sq_e, torch_c, torch_e, not_close) = sums(
        both.double(), fv * fv, (~finite_c & good & finite_r).double(), dc * dc, dr * dr,
        # torch's own RMSEs (its ``rmse``: every element, NaN and inf included)
        (c64 - f64) ** 2, (r64 - f64) ** 2, (~close_el).double())
    count = n.clamp(min=1)
    floor = torch.maximum(torch.sqrt(squares / count), per_value[1])  # the value's RMS
    unit = eps_el * torch.maximum(fv.abs(), floor[seg])
    err_c, err_e = dc / unit, dr / unit
    sign = torch.sign(fv)
    bias_c, bias_e = sums(err_c * sign, err_e * sign)
    largest = torch.stack([err_c.abs(), err_e.abs(), overflow.double()])
    worst_c, worst_e, overflowed = torch.zeros(3, segments, dtype=torch.float64,
                                               device=device).scatter_reduce_(
        1, seg.expand(3, -1), largest, "amax")
    scale = per_value[0] * floor
    rows = torch.stack([
        nonfinite, overflowed, n, worst_c, worst_e, torch.sqrt(sq_c / count) / scale,
        torch.sqrt(sq_e / count) / scale, bias_c / count, bias_e / count, (not_close == 0).double(),
        torch.sqrt(torch_c / per_value[3]), torch.sqrt(torch_e / per_value[3])],
        dim=1).tolist()
    found: Dict[int, Errors] = {}
    start = 0
    for v, size, row in zip(values, counts, rows):
        found[v.index] = Errors(int(row[0]), bool(row[1]), int(row[2]), *row[3:9],
                                err_c=err_c[start:start + size], close=bool(row[9]),
                                torch_rmse=(row[10], row[11]))
        start += size
    return found
