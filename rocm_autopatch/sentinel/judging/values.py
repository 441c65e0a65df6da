"""A call's values sorted for the judge (``sort``): floating values, judged by their
statistics (``errors``); integers and bools, exact, their equality found in one batch per
dtype and shape (``equal``); the rest, by torch's criterion. And a verdict's device work
queued with nothing read back (``Queued``): the statistics and the equalities of a verdict
read later, copied to the host in one transfer behind an event, read at a later call
without waiting. Read at once, each read back waited for the judge's device work queued
before it: four a verdict, 0.85 ms of about 2.9 in an 8-layer decode loop on an H100
(BENCHMARKS.md).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from rocm_autopatch.sentinel.judging import errors
from rocm_autopatch.sentinel.judging.errors import Errors, Value


def sort(ref: List[Any], res: List[Any], ref64: List[Any], skip: Optional[Dict[int, str]]
         ) -> Tuple[List[Value], List[Value], List[int]]:
    """The compared values (eager's ``ref``, compiled's ``res``, float64's ``ref64``, by
    index; those in ``skip`` left out): (floating, integral, the indices of the rest).
    Complex tensors become their (real, imaginary) pairs, judged as floats."""
    floating: List[Value] = []
    integral: List[Value] = []
    others: List[int] = []
    for index, (r, c, f) in enumerate(zip(ref, res, ref64)):
        if skip and index in skip:
            continue
        if not (isinstance(r, torch.Tensor) and isinstance(c, torch.Tensor)):
            others.append(index)
            continue
        r, c = r.detach(), c.detach()
        f = f.detach() if isinstance(f, torch.Tensor) else f
        if r.is_complex() and c.is_complex():
            r, c, f = _real_pairs(r, c, f)
        if r.is_floating_point() and c.is_floating_point() and c.shape == r.shape:
            floating.append(Value(index, r, c, f))
        else:
            integral.append(Value(index, r, c, f))
    return floating, integral, others


def _real_pairs(r: Any, c: Any, f: Any) -> Tuple[Any, Any, Any]:
    def pairs(x: Any) -> Any:
        return torch.view_as_real(x.resolve_conj()) if isinstance(x, torch.Tensor) \
            and x.is_complex() else x
    return pairs(r), pairs(c), pairs(f)


def equal(values: List[Value]) -> Dict[int, bool]:
    """Which integer (or bool) values are equal in eager and compiled, values of one dtype
    and shape compared in one batch and read in one transfer (a decode step returns tens of
    0-d positions and lengths: one synchronisation, not two each). Values that differ in
    dtype, shape or layout are not equal here: the judge looks at them one by one."""
    found, groups = _groups(values)
    for group, flags in zip(groups, _flags(groups)):
        for v, same in zip(group, flags.tolist()):
            found[v.index] = bool(same)
    return found


def _groups(values: List[Value]) -> Tuple[Dict[int, bool], List[List[Value]]]:
    """What is known without the device (unequal layouts, empty values), and the groups of
    one dtype, shape and device to compare there."""
    groups: Dict[Any, List[Value]] = {}
    found: Dict[int, bool] = {}
    for v in values:
        if not (v.r.dtype == v.c.dtype and v.r.shape == v.c.shape and v.r.device == v.c.device
                and v.r.layout == v.c.layout == torch.strided):
            found[v.index] = False
        elif not v.r.numel():
            found[v.index] = True
        else:
            groups.setdefault((v.r.dtype, v.r.shape, v.r.device), []).append(v)
    return found, list(groups.values())


def _flags(groups: List[List[Value]]) -> List[torch.Tensor]:
    """Each group's equalities, a bool per value, on the device."""
    flags = []
    for group in groups:
        r = torch.stack([v.r for v in group]).reshape(len(group), -1)
        c = torch.stack([v.c for v in group]).reshape(len(group), -1)
        flags.append((r == c).all(dim=1))
    return flags


class Queued:
    """One verdict's device work queued on the current stream with nothing read back: the
    integers' equalities, the floating values' statistics (``errors.launched``, replayed
    where ``captures`` holds their layout) and the caller's own flags (``extra``), copied
    into pinned host memory in one transfer behind ``done``. Once ``done`` has passed,
    ``read`` takes them without waiting. ``carried``: what the caller keeps with it."""

    def __init__(self, floating: List[Value], integral: List[Value], tol: float,
                 captures: Any, extra: List[torch.Tensor], carried: Any = None) -> None:
        self.carried = carried
        self.equal, self.groups = _groups(integral)
        flags = _flags(self.groups)
        self.launched = errors.launched(floating, tol, captures)
        self.extra: List[bool] = []
        self.found: Dict[int, Errors] = {}
        parts = [f.double() for f in flags] + [x.double().reshape(1) for x in extra]
        parts += [rows.reshape(-1) for _, rows, _ in self.launched]
        self.sizes = len(extra), [rows.shape for _, rows, _ in self.launched]
        packed = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
        on_gpu = packed.device.type == "cuda"
        self.host = torch.empty(packed.numel(), dtype=torch.float64, pin_memory=on_gpu)
        self.host.copy_(packed, non_blocking=on_gpu)
        self.done: Any = torch.cuda.Event() if on_gpu else Passed()
        self.done.record()

    @staticmethod
    def possible(floating: List[Value], integral: List[Value],
                 extra: List[torch.Tensor]) -> bool:
        """Can these values' verdict be queued: all on one device (on a CPU the copy back
        is done at once)?"""
        devices = {t.device for v in floating + integral for t in (v.r, v.c)}
        return len(devices | {x.device for x in extra}) == 1

    def read(self) -> None:
        """Take the values copied back (``done`` passed: nothing waits) into ``equal``,
        ``extra`` and ``found``."""
        values = self.host.tolist()
        start = 0
        for group in self.groups:
            for v in group:
                self.equal[v.index] = bool(values[start])
                start += 1
        self.extra = [bool(x) for x in values[start:start + self.sizes[0]]]
        start += self.sizes[0]
        rows = []
        for shape in self.sizes[1]:
            flat = values[start:start + shape[0] * shape[1]]
            rows += [flat[k * shape[1]:(k + 1) * shape[1]] for k in range(shape[0])]
            start += shape[0] * shape[1]
        self.found = errors.errors_of(self.launched, rows)


class Passed:
    """Where there is no device stream (a CPU): the work is done when queued."""

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass
