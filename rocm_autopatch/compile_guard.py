"""The compile guard: ``torch.compile`` with the modes and options that are unsafe on ROCm
rewritten to safe ones, and nothing else changed.

Per-call ``mode``/``options`` beat the global config (FINDINGS), so Inductor CUDA graphs
asked for by ``mode="reduce-overhead"``, ``mode="max-autotune"`` or
``options={"triton.cudagraphs": True}`` would survive the profile. The wrapper sees every
call form: ``torch.compile(...)``, ``@torch.compile``, ``nn.Module.compile`` and
``torch.compiler.compile`` all call through the ``torch.compile`` attribute.

The wrapper is a plain function made with ``functools.wraps``, not a wrapt proxy: it is
a real function like the original (same name, module, doc, signature through
``__wrapped__``, pickled by reference), and wrapt's import alone cost ~5 ms, more than the
whole hook budget (BENCHMARKS.md, hook time).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from types import ModuleType
from typing import Any, Dict, Optional

from rocm_autopatch import log, record

ENV_ALLOW_GRAPHS = "ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS"

# mode asked for -> mode passed on. Same for both profiles: graphs are a safety matter.
MODE_REWRITES: Dict[str, str] = {
    "reduce-overhead": "default",
    "max-autotune": "max-autotune-no-cudagraphs",
}
# options that turn Inductor CUDA graphs on per call: dropped when truthy.
GRAPH_OPTIONS = ("triton.cudagraphs", "triton.cudagraph_trees")
INDUCTOR_BACKENDS = (None, "inductor")

_lock = threading.Lock()
_HERE = os.path.dirname(os.path.abspath(__file__))


def graphs_allowed() -> bool:
    raw = os.environ.get(ENV_ALLOW_GRAPHS, "")
    value = raw.strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return False
    if value in ("1", "true", "on", "yes"):
        return True
    log.warn_once(("env", ENV_ALLOW_GRAPHS), f"{ENV_ALLOW_GRAPHS}={raw!r} is not understood; "
                  "accepted: 1/true/on/yes or 0/false/off/no. CUDA graphs stay off.")
    return False


def rewrite(kwargs: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The kwargs to pass on instead of ``kwargs``, or None when nothing is unsafe."""
    if kwargs.get("backend") not in INDUCTOR_BACKENDS:
        return None  # eager, aot_eager, cudagraphs, a user callable: not ours to touch
    mode = kwargs.get("mode")
    options = kwargs.get("options")
    new = dict(kwargs)
    changed = False
    if isinstance(mode, str) and mode in MODE_REWRITES:
        new["mode"] = MODE_REWRITES[mode]
        changed = True
    if isinstance(options, dict) and any(options.get(k) for k in GRAPH_OPTIONS):
        new["options"] = {k: v for k, v in options.items()
                          if not (k in GRAPH_OPTIONS and v)}
        changed = True
    return new if changed else None


def _call_site() -> str:
    """file:line of the first caller outside torch, functools and this package."""
    frame = sys._getframe(2)
    skip = (_HERE, os.sep + "torch" + os.sep, os.sep + "functools.py")
    while frame is not None:
        filename = frame.f_code.co_filename
        if not any(part in filename for part in skip):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def _describe(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    return {k: kwargs[k] for k in ("mode", "options") if kwargs.get(k) is not None}


def _note(before: Dict[str, Any], after: Dict[str, Any], site: str) -> None:
    b, a = _describe(before), _describe(after)
    with record.LOCK:
        for item in record.REPORT.compile_rewrites:
            if item.before == b and item.after == a and item.call_site == site:
                item.count += 1
                return
        record.REPORT.compile_rewrites.append(record.CompileRewrite(b, a, site))
    log.warn_once(("rewrite", repr(b), site),
                  f"torch.compile({_fmt(b)}) at {site} runs as torch.compile({_fmt(a)}): "
                  "Inductor CUDA graphs hang or give wrong results on ROCm. To keep the "
                  f"original, set {ENV_ALLOW_GRAPHS}=1 (or ROCM_AUTOPATCH=0).")


def _fmt(kwargs: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "defaults"


_MARK = "__rocm_autopatch_guard__"


def guard(original: Any) -> Any:
    """``original`` (torch.compile) behind the guard."""

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        new = None if graphs_allowed() else rewrite(kwargs)
        if new is None:
            return original(*args, **kwargs)
        _note(kwargs, new, _call_site())
        return original(*args, **new)

    setattr(compile, _MARK, True)
    return compile


def is_guarded(fn: Any) -> bool:
    return getattr(fn, _MARK, False) is True


def install(torch: ModuleType) -> None:
    """Wrap ``torch.compile``; idempotent (a second call, a reload of torch)."""
    with _lock:
        current = getattr(torch, "compile", None)
        if current is None:
            record.REPORT.fixes["compile_guard"] = {
                "status": record.SKIPPED, "reason": "this torch has no torch.compile"}
            return
        if is_guarded(current):
            return
        torch.compile = guard(current)
        record.REPORT.fixes["compile_guard"] = {
            "status": record.APPLIED,
            "reason": "torch.compile rewrites: " + ", ".join(
                f"mode={k!r} -> {v!r}" for k, v in MODE_REWRITES.items())
            + "; options " + "/".join(GRAPH_OPTIONS) + "=True dropped",
        }
