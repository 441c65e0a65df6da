"""What a repro directory's ``repro.py`` runs after torch's repro of the graph: compiled,
eager and float64 on the saved inputs, the verdict printed, exit status 1 while the
failure reproduces.

The source below the marker is copied whole into each ``repro.py``, which needs torch
only (``repro.write``), so it imports nothing of rocm-autopatch: the judge's thresholds
come in as ``limits`` (a dict the repro's last line writes out), and the graph
(``Repro``, ``mod``) and its inputs (``load_args``) are what torch's repro string defines.
It is a module so that linters and tests read it as code.
"""

# ---- copied into repro.py from here ----------------------------------------------------
import ast
import json
import math
import os
import sys
from typing import Any, Dict, List, Tuple


def set_inductor(torch: Any, items: List[str]) -> None:
    """Inductor settings to try, ``key=value`` each: ``python repro.py max_autotune=False``
    (a bisection step passes the setting it tries so)."""
    for item in items:
        key, _, value = item.partition("=")
        *parents, last = key.split(".")
        owner = torch._inductor.config
        for name in parents:
            owner = getattr(owner, name)
        setattr(owner, last, ast.literal_eval(value))


def load_inputs(torch: Any, load_args: Any, here: str) -> List[Any]:
    """The call's inputs: saved ones read back; the others drawn from ``manual_seed(0)`` at
    the scale the program's inputs had (``inputs.json``; randn weights would overflow)."""
    from torch._dynamo.debug_utils import InputReader

    saved = os.path.join(here, "inputs")
    torch.manual_seed(0)
    reader = InputReader(saved if os.path.isdir(saved) else None)
    load_args(reader)
    args = reader.args
    stats = os.path.join(here, "inputs.json")
    if not os.path.isdir(saved) and os.path.isfile(stats):
        with open(stats) as fh, torch.no_grad():
            for x, s in zip(args, json.load(fh)):
                if s and s["kind"] == "float":
                    x.normal_(s["mean"], s["std"])
                elif s and s["kind"] == "int":
                    x.random_(s["low"], s["high"] + 1)
    return args


def _systematic(torch: Any, c: Any, e: Any, r: Any, limits: Dict[str, Any]) -> bool:
    """The sentinel's systematic rule (docs/rules.md): compiled's RMSE against float64,
    in rounding units, above the floor and well above eager's."""
    keep = torch.isfinite(r) & torch.isfinite(c.double()) & torch.isfinite(e.double())
    if int(keep.sum()) < limits["min_elements"]:
        return False
    info = torch.finfo(c.dtype)
    f = r[keep]
    unit = info.eps * max(float(f.pow(2).mean().sqrt()), info.tiny)  # one rounding unit
    rc = float((c.double()[keep] - f).pow(2).mean().sqrt()) / unit
    re_ = float((e.double()[keep] - f).pow(2).mean().sqrt()) / unit
    low = c.dtype in (torch.float16, torch.bfloat16) and f.numel() >= limits["low_elements"]
    return rc > max(limits["floor"], re_ * (limits["ratio_low"] if low else limits["ratio"]))


def verdict(torch: Any, mod: Any, repro_class: Any, args: List[Any],
            limits: Dict[str, Any]) -> Tuple[bool, str]:
    """(whether the failure reproduces, the line that says so)."""
    from torch._dynamo.utils import same
    from torch.utils._pytree import tree_flatten

    def run(m: Any, xs: List[Any]) -> List[Any]:
        with torch.no_grad():
            return tree_flatten(m(*[x.clone() if isinstance(x, torch.Tensor) else x
                                    for x in xs]))[0]

    def up(x: Any) -> Any:
        return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    eager = run(mod, args)
    compiled = run(torch.compile(mod, fullgraph=True), args)
    ref = run(repro_class().double(), [up(x) for x in args])
    torch_ok = same(eager, compiled, ref, tol=1e-3, equal_nan=True)
    # The sentinel's one figure: the largest error against float64, compiled's and eager's,
    # of the output its warning named (``value``), else the worst over the outputs.
    figures, systematic = {}, False
    for i, (e, c, r) in enumerate(zip(eager, compiled, ref)):
        if not (isinstance(c, torch.Tensor) and c.is_floating_point() and c.numel()):
            continue
        figures[i] = (float((c.double() - r).abs().nan_to_num(math.inf).max()),
                      float((e.double() - r).abs().nan_to_num(math.inf).max()))
        systematic |= _systematic(torch, c, e, r, limits)
    named = limits.get("value")
    if named in figures:
        which, (worst_c, worst_e) = f"output {named}: ", figures[named]
    else:
        which = ""
        worst_c = max((f[0] for f in figures.values()), default=0.0)
        worst_e = max((f[1] for f in figures.values()), default=0.0)
    wrong = not torch_ok or systematic
    return wrong, (("REPRODUCED: the compiled graph differs from eager" if wrong else
                    "not reproduced: compiled matches eager") +
                   f" ({which}largest error against float64 {worst_c:.3g}, eager's "
                   f"{worst_e:.3g}; torch's criterion {'failed' if not torch_ok else 'passed'}"
                   f"{'; compiled error against float64 above eager' if systematic else ''})")


def main(torch: Any, mod: Any, repro_class: Any, load_args: Any, file: str,
         argv: List[str], limits: Dict[str, Any]) -> None:
    set_inductor(torch, argv)
    args = load_inputs(torch, load_args, os.path.dirname(os.path.abspath(file)))
    wrong, line = verdict(torch, mod, repro_class, args, limits)
    print(line)
    sys.exit(1 if wrong else 0)
