"""What a correct kernel may round: the documented error bounds of the math functions a graph
calls, so that the judge does not call a value wrong for what a correct implementation of its
op is allowed.

On AMD GPUs Triton's math goes through ROCm's device library; the HIP math API documents each
single-precision function's largest error in ULPs (ROCm/HIP, ``docs/reference/math_api.rst``,
"ULP Difference of Maximum Absolute Error"): ``erff`` 4, ``tanhf`` 2, ``logf`` 2, ``expf`` 1...
Vectorised CPU math libraries promise bounds of the same order. A float32 value computed
through such a function may be that many units off float64 beyond eager's error, so the
judge's floors for float32 values rise to the largest bound among the graph's ops
(``ulps``). Composite ops (GELU, sigmoid, softmax...) are given the bound of the function
they are computed through; that mapping is ours, not documented. bf16 and fp16 values are
rounded far more coarsely than these bounds: no allowance there.
"""

from __future__ import annotations

from typing import Dict, Iterable, Tuple

# Single precision, from the HIP math API's tables (ROCm/HIP docs/reference/math_api.rst).
DOCUMENTED: Dict[str, int] = {
    "erf": 4, "erfc": 2, "erfcx": 5, "lgamma": 4, "exp": 1, "exp2": 1, "expm1": 1,
    "log": 2, "log2": 1, "log10": 2, "log1p": 1, "sin": 1, "cos": 1, "tan": 1, "asin": 2,
    "acos": 1, "atan": 2, "atan2": 1, "sinh": 1, "cosh": 1, "tanh": 2, "asinh": 1,
    "acosh": 1, "atanh": 1, "pow": 1, "rsqrt": 1, "sqrt": 1,
}
# Ops computed through one of those (ours: the function each is computed through).
THROUGH: Dict[str, str] = {
    "gelu": "erf", "sigmoid": "exp", "silu": "exp", "softmax": "exp", "log_softmax": "log",
    "logsumexp": "log", "logsigmoid": "log", "softplus": "log1p", "elu": "expm1",
    "selu": "expm1", "celu": "expm1", "mish": "tanh", "special_erf": "erf",
    "special_erfc": "erfc", "special_erfcx": "erfcx", "special_expm1": "expm1",
    "special_log1p": "log1p", "special_exp2": "exp2", "arctan2": "atan2", "float_power": "pow",
    "xlogy": "log", "special_xlog1py": "log1p", "arcsin": "asin",
    "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
    "arctanh": "atanh",
}


def bound(name: str) -> Tuple[str, int]:
    """(the documented function, its ULPs) for an op name; ("", 0) where none."""
    base = name.rstrip("_")  # in-place variants (exp_) compute the same
    function = base if base in DOCUMENTED else THROUGH.get(base, "")
    return function, DOCUMENTED.get(function, 0)


def ulps(ops: Iterable[str]) -> Tuple[float, str]:
    """The largest bound among the ops a graph calls (their names,
    ``runs.graph.op_names``), and which function it is (0, "" where it calls none)."""
    worst, which = 0, ""
    for name in ops:
        function, found = bound(name)
        if found > worst:
            worst, which = found, function
    return float(worst), which
