"""How the sentinel judges a call: the compiled values against eager's, with the float64
run as the truth. docs/rules.md explains each rule and how it was calibrated.

For each value the graph returns or writes:

- **torch's criterion is the floor**: ``torch._dynamo.utils.same(ref, res, fp64_ref, tol,
  equal_nan=True)``, as torch's minifier and benchmark suite use it. What it rejects is
  rejected, except where it is wrong by construction: an element whose exact (float64)
  value overflows the dtype, where ``inf`` is the correct rounding, is judged apart.
- **non-finite**: NaN/inf in the compiled value where float64 is finite and representable
  and eager's is finite (NaN that eager computes too is not compiled's fault).
- **localized**: the worst element's error against float64, in units of the dtype's
  rounding (``eps * max(|x|, rms)``), beyond both a floor and a multiple of eager's worst:
  a few wrong elements among millions, which an RMSE averages away.
- **systematic**: the compiled error's RMSE against float64 beyond a multiple of eager's
  (torch allows 3x in bf16/fp16, blind to a bias of a few rounding units), or a consistent
  relative bias that eager's rounding does not have (past half a unit; a whole one in
  float32 and float64, where a factor every element shares can move them all that far).
- **math allowance**: a float32 value computed through a math function (erf, tanh,
  log...) may be off by what the function's documented bound allows (``allowance``): the
  floors of the localized and systematic rules rise to it.
- **a narrower reference**: where an op whose float64 call failed ran in float32 (or
  narrower) in the reference, a value it reaches that is no finer than that precision is
  judged by torch's criterion alone, eager's error taken as at least half a unit of that
  precision (the reference cannot tell its rounding from a bug's).
- **complex** values are judged as their (real, imaginary) pairs, by the rules above.
- **integers and bools**: exact, except where they come from floats (argmax, argmin, a
  comparison): an element that differs passes when float64 says compiled's choice is
  right, or no worse than eager's by more than a near tie in the precision the compared
  values were computed in (compiled code rounds once where eager rounds several times).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch

from rocm_autopatch.sentinel.judging.errors import Captures, Errors, Value, statistics

# torch's tolerances for its criterion: the minifier's repro_tolerance and the benchmark
# suite's inference tolerance (benchmarks/dynamo/huggingface.py, timm_models.py
# get_tolerance_and_cosine_flag); gradients get the suite's training tolerance.
TOL_FORWARD = 1e-3
TOL_BACKWARD = 1e-2

# Calibrated with benchmarks/sentinel_corpus.py (BENCHMARKS.md, the sentinel's corpus).
LOCAL_ULPS = 16.0  # the worst element may be this many rounding units off float64...
LOCAL_RATIO = 4.0  # ...and this many times eager's worst element, before it fails
SYSTEMATIC_RATIO = 1.5  # compiled RMSE against float64, times eager's...
# ...in bf16/fp16 with 4096 elements or more: there compiled code, which rounds less, was
# never less accurate than eager on the corpus's 12 healthy low-precision programs (ratio
# at most 1.000 on the H100), while a 1% bias in one op gave 1.10-1.27
SYSTEMATIC_RATIO_LOW = 1.05
LOW_PRECISION_ELEMENTS = 4096
SYSTEMATIC_FLOOR = 0.5  # ...and at least this many rounding units of the value's RMS
BIAS_FLOOR = 0.5  # a mean relative error, in rounding units, consistent in sign...
# ...in float32 and float64 values, a heuristic: a factor every element shares (a norm's
# reciprocal square root, after a reduction in another order) can move them all one way by
# a unit or so, and at 0.5 a tiny fp32 Llama's healthy logits failed (compiled -0.543,
# eager -0.129; tests/sentinel/test_judge.py). A unit there is 1.2e-7 of the value, far
# below any bias a bug makes; in bf16 a unit is 0.8%, and a 1% bias must stay caught.
BIAS_FLOOR_WIDE = 1.0
BIAS_RATIO = 4.0  # ...and this many times eager's own
TIE_ULPS = 4.0  # two choices this close in float64 are a tie (argmax, comparisons)
# Below this many elements the localized and systematic rules are noise (a few sums that
# cancel): torch's criterion judges alone, with its own larger multipliers for small sizes.
MIN_ELEMENTS = 256
LOW_PRECISION = (torch.float16, torch.bfloat16)


class Mismatch(NamedTuple):
    index: int  # position among the compared values
    shape: Tuple[int, ...]
    dtype: str
    # The one figure said everywhere (the warning, the report, the repro): the largest
    # error against the float64 reference, compiled's and eager's (for an integer value:
    # the largest difference from eager, and 0)
    compiled_error: float
    eager_error: Optional[float]
    compiled_rmse: Optional[float]  # against the float64 reference
    eager_rmse: Optional[float]
    nonfinite: int  # NaN/inf in compiled where float64 and eager are finite
    detail: str  # what failed, in words
    rule: str = ""  # torch's criterion, non-finite, localized, systematic, integer
    torch_ok: bool = True  # what torch's criterion alone says of this value


class Derived(NamedTuple):
    """An integer or bool output computed from floats: how, and the float64 operands."""

    op: str  # "argmax", "argmin" or a comparison ("gt", "lt", "ge", "le", "eq", "ne")
    operands: List[Any]  # float64 tensors (or numbers) as the float64 run computed them
    dtype: torch.dtype  # the operands' dtype in the program
    dim: Optional[int] = None
    keepdim: bool = False


class Judgement(NamedTuple):
    bad: List[Mismatch]  # by our rules (torch's among them)
    torch_failed: List[int]  # indices torch's criterion alone rejects
    stats: Dict[str, Any]  # worst errors against float64, in rounding units


COMPARISONS = ("gt", "lt", "ge", "le", "eq", "ne")


def _say(said: List[str], msg: str, *args: Any) -> None:
    said.append(msg % args if args else msg)


def _rmse(a: torch.Tensor, b: torch.Tensor) -> Optional[float]:
    try:
        return float(torch.sqrt(torch.mean(torch.square(a.double() - b.double()))))
    except Exception:  # noqa: BLE001 - a metric for the message only
        return None


def torch_criterion(ref: Any, res: Any, ref64: Any, tol: float) -> Tuple[bool, str]:
    from torch._dynamo.utils import same

    said: List[str] = []
    ok = same(ref, res, ref64, tol=tol, equal_nan=True, log_error=functools.partial(_say, said))
    return bool(ok), "; ".join(said)[:300]


class Allowance(NamedTuple):
    """What a correct implementation of the graph's math functions may round (float32), and
    the coarsest precision an op of the float64 reference ran in, its float64 call having
    failed (``runs.reference``; None: every op ran in float64), with the values it reaches."""

    ulps: float = 0.0
    function: str = ""  # the function whose bound it is
    narrowest: Any = None  # a torch dtype
    narrowed: str = ""  # the ops run narrower, in words
    reached: Any = None  # the indices of the values they reach (a frozenset; None: all)

    def truth_for(self, dtype: Any, index: int = -1) -> bool:
        """Is the reference a truth for value ``index`` of ``dtype``: finer than it, or
        not reached by an op run narrower? Where an op ran no finer than the value's own
        precision, the reference carries that op's rounding as eager does: our rules,
        calibrated against float64, would read it as compiled's error."""
        return (self.narrowest is None
                or self.reached is not None and index not in self.reached
                or torch.finfo(self.narrowest).eps < torch.finfo(dtype).eps)


NONE = Allowance()


def _floating(v: Value, e: Errors, tol: float, stats: Dict[str, Any], strict: bool,
              allowed: Allowance) -> Tuple[Optional[Mismatch], bool]:
    r, c, f = v.r, v.c, v.f
    dtype = c.dtype
    info = torch.finfo(dtype)
    narrow = not allowed.truth_for(dtype, v.index)
    strict = strict and not narrow
    floored = _floored(v, e, tol, allowed.narrowest) if narrow else None
    if floored is not None:
        torch_ok, detail = floored
    else:
        torch_ok, detail = (True, "") if _torch_passes(v, e, tol) else torch_criterion(
            r, c, f, tol)
    if e.overflow:  # torch's floor, without what it cannot judge
        f64, r64, c64 = v.truth().double(), r.double(), c.double()
        overflow = f64.abs() > info.max
        keep = ~overflow
        floor_ok, detail = torch_criterion(r[keep], c[keep], f64[keep].to(f.dtype), tol)
        # NaN where the exact value overflows, and eager has it too, is not compiled's
        # fault (matrix_exp in fp16 on an H200: NaN in both where float64 passes 65504)
        shared_nan = torch.isnan(c64) & torch.isnan(r64)
        wrong_sign = int((overflow & (torch.sign(c64) != torch.sign(f64))
                          & ~shared_nan).sum())
        floor_ok = floor_ok and wrong_sign == 0
    else:
        floor_ok = torch_ok
    rule, errors = "", (0.0, 0.0, 0.0, 0.0)
    if e.count:
        errors, rule, said = _in_rounding_units(
            e, dtype, strict, allowed if dtype == torch.float32 else NONE, c.device.type)
        detail = said if rule else detail
    worst_c, worst_e, rms_c, rms_e = errors
    stats["compiled_worst_ulps"] = max(stats.get("compiled_worst_ulps", 0.0), worst_c)
    stats["eager_worst_ulps"] = max(stats.get("eager_worst_ulps", 0.0), worst_e)
    stats["compiled_rmse_ulps"] = max(stats.get("compiled_rmse_ulps", 0.0), rms_c)
    stats["eager_rmse_ulps"] = max(stats.get("eager_rmse_ulps", 0.0), rms_e)
    if e.nonfinite:
        rule, detail = "non-finite", (f"{e.nonfinite} NaN/inf where float64 and eager are "
                                      "finite")
    elif not floor_ok:
        rule = "torch's criterion"
    if not rule:
        return None, torch_ok
    truth = f if isinstance(f, torch.Tensor) else r
    return Mismatch(v.index, tuple(r.shape), str(dtype).replace("torch.", ""),
                    largest_error(c, truth),
                    largest_error(r, truth) if isinstance(f, torch.Tensor) else None,
                    _rmse(c, f) if isinstance(f, torch.Tensor) else None,
                    _rmse(r, f) if isinstance(f, torch.Tensor) else None,
                    e.nonfinite, detail or "differs", rule, torch_ok), torch_ok


# The smallest multiplier torch's criterion allows compiled's RMSE against float64 over
# eager's (torch/_dynamo/utils.py ``same``: 2 in float32, 3 in bf16/fp16 and for small
# tensors, 5-10 for tiny ones with a large tolerance, in torch 2.13 and in the earlier
# revisions read), and its absolute term, ``tol / 10`` (``1e-4`` in early revisions: the
# smaller of the two is taken).
TORCH_MIN_MULTIPLIER = 2.0
TORCH_SMALL_MULTIPLIER, TORCH_SMALL = 3.0, 1000  # below 1,000 elements: 3 at least


def _torch_passes(v: Value, e: Errors, tol: float) -> bool:
    """Does torch's criterion pass this value, from what the batch already read? Its first
    test (``allclose``), or its second: compiled's RMSE against float64 within the smallest
    multiple of eager's that ``same`` allows (above) plus the smaller absolute term. Where
    neither holds (or a NaN makes it undecidable here) torch's own ``same`` decides, and
    words it."""
    if e.close:
        return True
    if not (isinstance(v.f, torch.Tensor) and v.f.dtype == torch.float64
            and v.r.dtype == v.c.dtype and v.r.layout == torch.strided):
        return False
    res_error, ref_error = e.torch_rmse
    # a relative margin: torch sums in another order
    multiplier = TORCH_SMALL_MULTIPLIER if v.f.numel() < TORCH_SMALL else TORCH_MIN_MULTIPLIER
    return res_error <= (1 - 1e-6) * (multiplier * ref_error + min(tol / 10.0, 1e-4))


def _floored(v: Value, e: Errors, tol: float, narrowest: Any) -> Optional[Tuple[bool, str]]:
    """torch's criterion for a value the reference is no truth for (an op of it ran no
    finer than the value): eager's error taken as at least half a unit of that precision
    over the value's RMS. Where the narrowed op read the graph's inputs as eager's did, the
    reference is eager to the bit, and no compiled code that rounds otherwise would pass
    the criterion unfloored. None where it cannot tell (NaN): torch's own ``same``."""
    if e.close:
        return True, ""
    res_error, ref_error = e.torch_rmse
    if not (isinstance(v.f, torch.Tensor) and math.isfinite(res_error)
            and math.isfinite(ref_error)):
        return None
    floor = 0.5 * torch.finfo(narrowest).eps * float(v.f.double().pow(2).mean().sqrt())
    # torch's own multipliers (``same``): 3 in bf16/fp16 and below 1,000 elements, else 2
    multiplier = TORCH_SMALL_MULTIPLIER if v.f.numel() < TORCH_SMALL or \
        v.c.dtype in LOW_PRECISION else TORCH_MIN_MULTIPLIER
    limit = multiplier * max(ref_error, floor) + min(tol / 10.0, 1e-4)
    if res_error <= limit:
        return True, ""
    return False, (f"RMSE against the reference {res_error:.3g}, beyond {multiplier:g}x "
                   f"eager's {ref_error:.3g} (taken as at least {floor:.3g}, half a unit of "
                   f"{str(narrowest).replace('torch.', '')}, which an op of the reference "
                   "ran in)")


def _in_rounding_units(e: Errors, dtype: Any, strict: bool, allowed: Allowance = NONE,
                       device: str = "cuda") -> Tuple[Tuple[float, ...], str, str]:
    """Compiled's and eager's errors against float64 in rounding units: (worst compiled,
    worst eager, RMSE compiled, RMSE eager), and the rule they break with its detail (""
    where none: a loose judge, or too few elements to tell). ``allowed``: the floors rise
    to what the graph's math functions may round (half the bound for an RMSE or a bias,
    four times it for the worst element, as the fixed floors stand to 1 unit)."""
    errors = (e.worst_c, e.worst_e, e.rms_c, e.rms_e)
    if not strict or e.count < MIN_ELEMENTS:
        return errors, "", ""
    # The bounds are the HIP math API's; on a CPU they stand for its vector math library's,
    # documented as of the same order, not by these numbers (allowance.py).
    source = "HIP math API" if device != "cpu" else "the HIP math API's bound, used on the CPU"
    allowing = (f"; {allowed.function} may round {allowed.ulps:g} "
                f"unit{'s' if allowed.ulps != 1 else ''} ({source})" if allowed.ulps else "")
    local = max(LOCAL_ULPS, 4 * allowed.ulps, LOCAL_RATIO * e.worst_e)
    if e.worst_c > local:
        count = int((e.err_c.abs() > local).sum())
        return errors, "localized", (f"{count} of {e.count} elements off float64 by up to "
                                     f"{e.worst_c:.3g} rounding units (eager's worst: "
                                     f"{e.worst_e:.3g}{allowing})")
    if e.rms_c > max(SYSTEMATIC_FLOOR, allowed.ulps / 2, e.rms_e * (
            SYSTEMATIC_RATIO_LOW if dtype in LOW_PRECISION
            and e.count >= LOW_PRECISION_ELEMENTS else SYSTEMATIC_RATIO)):
        return errors, "systematic", (f"RMSE against float64 {e.rms_c:.3g} rounding units, "
                                      f"eager's {e.rms_e:.3g}{allowing}")
    floor = BIAS_FLOOR_WIDE if dtype in (torch.float32, torch.float64) else BIAS_FLOOR
    if abs(e.bias_c) > max(floor, allowed.ulps / 2, BIAS_RATIO * abs(e.bias_e)):
        return errors, "systematic", (f"a consistent relative bias of {e.bias_c:+.3g} "
                                      f"rounding units against float64 (eager's "
                                      f"{e.bias_e:+.3g}{allowing})")
    return errors, "", ""


def _ties(r: torch.Tensor, c: torch.Tensor, how: Derived) -> bool:
    """Is compiled's choice, where it differs from eager's, no worse than eager's under
    float64 by more than a tie window? The window is measured in the precision the compared
    values were computed in (``how.dtype``, followed back through casts): a bf16 logit cast
    to float32 before argmax is a bf16 value. A compiled choice that float64 prefers passes
    whatever the gap (compiled code rounds once where eager rounds several times)."""
    eps = torch.finfo(how.dtype).eps
    differ = c != r
    if how.op in ("argmax", "argmin"):
        x = how.operands[0]
        if not isinstance(x, torch.Tensor):
            return False
        if how.dim is None:
            flat = x.flatten()
            vc, vr = flat[c.long()], flat[r.long()]
            scale = flat.abs().max()
        else:
            ic = c.long() if how.keepdim else c.long().unsqueeze(how.dim)
            ir = r.long() if how.keepdim else r.long().unsqueeze(how.dim)
            vc, vr = x.gather(how.dim, ic), x.gather(how.dim, ir)
            scale = x.abs().amax(dim=how.dim, keepdim=True)
            if not how.keepdim:
                vc, vr, scale = vc.squeeze(how.dim), vr.squeeze(how.dim), scale.squeeze(how.dim)
        worse = (vr - vc) if how.op == "argmax" else (vc - vr)  # > 0: compiled chose worse
        near = worse <= TIE_ULPS * eps * torch.clamp(scale, min=1e-30)
        return bool(near[differ].all()) if differ.dim() else bool(near)
    if how.op in COMPARISONS and len(how.operands) == 2:
        a, b = (torch.as_tensor(o, dtype=torch.float64) for o in how.operands)
        gap = (a - b).abs()
        scale = torch.maximum(a.abs(), b.abs())
        truth = torch.broadcast_to(getattr(torch, how.op)(a, b), c.shape)
        near = torch.broadcast_to(gap <= TIE_ULPS * eps * torch.clamp(scale, min=1e-30),
                                  c.shape)
        return bool((near | (c == truth))[differ].all())
    return False


def error_figure(m: Mismatch) -> str:
    """The figure a user reads for a rejected value, the same in the warning, the report
    and the repro: its largest error against float64, compiled's and eager's."""
    if m.eager_error is None:  # no float64 value to hold it to (a Python number)
        return m.detail
    if m.rule == "integer":
        return f"differs from eager by up to {m.compiled_error:.3g}"
    return (f"largest error against float64 {m.compiled_error:.3g}, eager's "
            f"{m.eager_error:.3g}")


def largest_error(x: torch.Tensor, truth: torch.Tensor) -> float:
    """The largest absolute difference of ``x`` from ``truth`` (inf where one is NaN or
    inf and the other is not); 0 for an empty value."""
    if not x.numel():
        return 0.0
    return float((x.double() - truth.double()).abs().nan_to_num(float("inf")).max())


def _integral(r: torch.Tensor, c: torch.Tensor, f: Any, index: int, tol: float,
              how: Optional[Derived]) -> Tuple[Optional[Mismatch], bool]:
    torch_ok, _ = torch_criterion(r, c, f, tol)
    if c.shape == r.shape and bool(torch.equal(c, r)):
        return None, torch_ok
    if how is not None and c.shape == r.shape:
        try:
            if _ties(r, c, how):
                return None, torch_ok
        except Exception:  # noqa: BLE001 - cannot tell: judged exactly
            pass
    differ = int((c != r).sum()) if c.shape == r.shape else -1
    detail = (f"{differ} of {r.numel()} elements differ from eager" if differ >= 0 else
              f"shape {list(c.shape)} where eager has {list(r.shape)}")
    if how is not None:
        detail += f" (from {how.op} over floats, and not a tie in float64)"
    diff = float((c.double() - r.double()).abs().max()) if differ > 0 else 0.0
    return Mismatch(index, tuple(r.shape), str(r.dtype).replace("torch.", ""), diff, 0.0,
                    None, None, 0, detail, "integer", torch_ok), torch_ok


def _equal(values: List[Value]) -> Dict[int, bool]:
    """Which integer (or bool) values are equal in eager and compiled, values of one dtype
    and shape compared in one batch and read in one transfer (a decode step returns tens of
    0-d positions and lengths: one synchronisation, not two each). Values that differ in
    dtype, shape or layout are not equal here: the judge looks at them one by one."""
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
    for group in groups.values():
        r = torch.stack([v.r for v in group]).reshape(len(group), -1)
        c = torch.stack([v.c for v in group]).reshape(len(group), -1)
        for v, same_values in zip(group, (r == c).all(dim=1).tolist()):
            found[v.index] = bool(same_values)
    return found


def _real_pairs(r: Any, c: Any, f: Any) -> Tuple[Any, Any, Any]:
    """Complex tensors as their (real, imaginary) pairs, judged as floats."""
    def pairs(x: Any) -> Any:
        return torch.view_as_real(x.resolve_conj()) if isinstance(x, torch.Tensor) \
            and x.is_complex() else x
    return pairs(r), pairs(c), pairs(f)


def compare(ref: List[Any], res: List[Any], ref64: List[Any], tol: float,
            derived: Optional[Dict[int, Derived]] = None, strict: bool = True,
            skip: Optional[Dict[int, str]] = None, allowed: Allowance = NONE,
            captures: Optional[Captures] = None) -> Judgement:
    """Judge each compiled value of ``res`` against eager's ``ref`` with ``ref64`` (float64)
    as the truth. ``strict=False`` (gradients): torch's criterion, non-finite values and
    integers only; the localized and systematic rules are calibrated on forward values.
    ``skip``: values not compared ({index: why}, uninitialised memory), in the stats.
    ``allowed``: what the graph's math functions may round (float32 values).
    ``captures``: the graph's batches whose statistics are replayed (``errors.Captures``)."""
    judged: Dict[int, Tuple[Optional[Mismatch], bool]] = {}
    floating: List[Value] = []
    integral: List[Value] = []
    stats: Dict[str, Any] = {}
    if skip:
        stats["not_compared"] = {str(i): why for i, why in skip.items()}
    for index, (r, c, f) in enumerate(zip(ref, res, ref64)):
        if skip and index in skip:
            continue
        if isinstance(r, torch.Tensor) and isinstance(c, torch.Tensor):
            r, c = r.detach(), c.detach()
            f = f.detach() if isinstance(f, torch.Tensor) else f
            if r.is_complex() and c.is_complex():
                r, c, f = _real_pairs(r, c, f)
            if r.is_floating_point() and c.is_floating_point() and c.shape == r.shape:
                floating.append(Value(index, r, c, f))
            else:
                integral.append(Value(index, r, c, f))
        else:
            ok, said = torch_criterion(r, c, f, tol)
            judged[index] = (None if ok else Mismatch(
                index, (), type(r).__name__, 0.0, None, None, None, 0, said or "differs",
                "torch's criterion", False), ok)
    equal = _equal(integral)
    for v in integral:
        # equal integers pass torch's criterion (its allclose of equal tensors) and ours
        judged[v.index] = (None, True) if equal[v.index] else _integral(
            v.r, v.c, v.f, v.index, tol, (derived or {}).get(v.index))
    found = statistics(floating, tol, captures)
    for v in floating:
        judged[v.index] = _floating(v, found[v.index], tol, stats, strict, allowed)
    bad = [judged[i][0] for i in sorted(judged) if judged[i][0] is not None]
    torch_failed = [i for i in sorted(judged) if not judged[i][1]]
    return Judgement(bad, torch_failed, stats)
