"""The compile guard: ``torch.compile`` with the modes and options that are unsafe on ROCm
rewritten to safe ones, and nothing else changed.

Per-call ``mode``/``options`` beat the global config (torch's ``list_mode_options``), so
Inductor CUDA graphs and autotuning asked for in code would survive the profile. What is
rewritten (``rewrite``):

- CUDA graphs, both profiles: ``reduce-overhead`` -> ``default``, ``max-autotune`` drops its
  graphs, truthy ``triton.cudagraphs``/``triton.cudagraph_trees`` options are dropped.
  Kept with ``ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS=1``.
- Autotuning, ``safe`` only: ``max-autotune`` and ``max-autotune-no-cudagraphs`` ->
  ``default``; truthy ``max_autotune``, ``max_autotune_gemm``, ``max_autotune_pointwise``,
  ``coordinate_descent_tuning`` options dropped. ``perf`` keeps tuning asked for in code
  (without graphs); ``INDUCTOR_MAX_AUTOTUNE=1`` keeps it under ``safe`` too.
- Combo kernels, ``safe`` only and on torch < 2.14 (``COMBO_FIXED_IN``): a truthy
  ``combo_kernels`` option is dropped (the profile's ``inductor.combo_kernels`` rule says
  why); ``perf`` and ``INDUCTOR_COMBO_KERNELS=1`` keep it.

Backends other than Inductor, unknown modes and options we don't know pass unchanged.
The wrapper sees every call form: ``torch.compile(...)``, ``@torch.compile``,
``nn.Module.compile`` and ``torch.compiler.compile`` all call through the ``torch.compile``
attribute. It is a plain function made with ``functools.wraps``, not a wrapt proxy: a
real function like the original (name, module, doc, signature through ``__wrapped__``,
pickled by reference); wrapt's import alone cost ~5 ms (BENCHMARKS.md, hook time).
"""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from rocm_autopatch import frames, log, patching, record, settings
from rocm_autopatch.config import profiles

ENV_ALLOW_GRAPHS = settings.ALLOW_GRAPHS
ENV_KEEP_TUNING = settings.KEEP_TUNING


class Policy(NamedTuple):
    """What this process lets through: decided per call from the environment."""

    graphs: bool  # Inductor CUDA graphs allowed
    tuning: bool  # autotuning asked for in code allowed
    combo: bool = True  # combo kernels asked for in code allowed


# torch's modes as (CUDA graphs, autotuning) (torch/_inductor/__init__.py list_mode_options).
MODES: Dict[str, Tuple[bool, bool]] = {
    "default": (False, False),
    "reduce-overhead": (True, False),
    "max-autotune-no-cudagraphs": (False, True),
    "max-autotune": (True, True),
}
MODE_OF = {flags: mode for mode, flags in MODES.items()}
# options that turn Inductor CUDA graphs / autotuning on per call: dropped when truthy.
GRAPH_OPTIONS = ("triton.cudagraphs", "triton.cudagraph_trees")
TUNING_OPTIONS = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise",
                  "coordinate_descent_tuning")
COMBO_OPTIONS = ("combo_kernels",)
# The release with the last known combo-kernel fix (PR 187275: the crash with dynamic
# reduction sizes; the wrong values of pytorch#168937 were fixed in 2.11).
COMBO_FIXED_IN = (2, 14)
INDUCTOR_BACKENDS = (None, "inductor")

WHY_GRAPHS = ("Inductor CUDA graphs can record work silently and give wrong results on "
              "ROCm (pytorch#185074, pytorch#187715)")
WHY_TUNING = ("autotuning on ROCm crashes with memory access faults (ROCm/pytorch#3548), "
              "invalidates graph capture (pytorch#193735) and can take minutes per compile")
WHY_COMBO = ("combo kernels computed wrong values on ROCm before torch 2.11 (pytorch#168937) "
             "and crash compiles with dynamic reduction sizes before 2.14 (pytorch#187269)")
ENV_KEEP_COMBO = settings.override_var("combo_kernels")  # INDUCTOR_COMBO_KERNELS

_lock = threading.Lock()
_HERE = os.path.dirname(os.path.abspath(__file__))


def graphs_allowed() -> bool:
    return log.setting(ENV_ALLOW_GRAPHS)


def _kept_by_override(var: str, key: str) -> bool:
    """``var`` (an ``INDUCTOR_<KEY>`` override) as the override applier read it (typed by
    torch's config, warned about there): true where it set ``key`` to a true value."""
    if settings.raw(var) is None:
        return False
    if "torch._inductor.config" not in sys.modules:
        import torch._inductor.config  # noqa: F401 - its import hook applies the overrides
    entry = record.config_entry(key)
    return bool(entry is not None and entry.source == "override" and entry.wanted)


def tuning_kept() -> bool:
    """``INDUCTOR_MAX_AUTOTUNE=1`` keeps autotuning asked for in code."""
    return _kept_by_override(ENV_KEEP_TUNING, "inductor.max_autotune")


def _combo_allowed(torch: Optional[ModuleType]) -> bool:
    """Combo kernels asked for in code, without the override: ``perf``, or a torch with
    the known fixes."""
    from rocm_autopatch import torch_releases

    return (record.REPORT.profile == "perf"
            or torch_releases.version(torch) >= COMBO_FIXED_IN)


def combo_kept() -> bool:
    """Combo kernels asked for in code go through: ``_combo_allowed``, or
    ``INDUCTOR_COMBO_KERNELS`` set true (typed and applied by the override applier)."""
    return (_combo_allowed(sys.modules.get("torch"))
            or _kept_by_override(ENV_KEEP_COMBO, "inductor.combo_kernels"))


def policy() -> Policy:
    """The escape hatches and the profile, read from the environment on each call."""
    tuning = record.REPORT.profile == "perf" or tuning_kept()
    return Policy(graphs=graphs_allowed(), tuning=tuning, combo=combo_kept())


def _truthy(options: Dict[str, Any], keys: Tuple[str, ...]) -> List[str]:
    return [k for k in keys if options.get(k)]


SAFE_POLICY = Policy(graphs=False, tuning=False, combo=False)


def rewrite(kwargs: Dict[str, Any], allowed: Policy = SAFE_POLICY
            ) -> Optional[Tuple[Dict[str, Any], Tuple[str, ...]]]:
    """(the kwargs to pass on instead of ``kwargs``, what was removed: "graphs", "tuning",
    "combo"), or None when nothing is unsafe."""
    if kwargs.get("backend") not in INDUCTOR_BACKENDS:
        return None  # eager, aot_eager, cudagraphs, a user callable: not ours to touch
    mode = kwargs.get("mode")
    options = kwargs.get("options")
    new = dict(kwargs)
    removed: Dict[str, None] = {}
    if isinstance(mode, str) and mode in MODES:
        graphs, tuning = MODES[mode]
        if graphs and not allowed.graphs:
            removed["graphs"] = None
        if tuning and not allowed.tuning:
            removed["tuning"] = None
        new["mode"] = MODE_OF[(graphs and allowed.graphs, tuning and allowed.tuning)]
    if isinstance(options, dict):
        drop = [] if allowed.graphs else _truthy(options, GRAPH_OPTIONS)
        removed.update(dict.fromkeys(["graphs"] if drop else []))
        tuning = [] if allowed.tuning else _truthy(options, TUNING_OPTIONS)
        removed.update(dict.fromkeys(["tuning"] if tuning else []))
        combo = [] if allowed.combo else _truthy(options, COMBO_OPTIONS)
        removed.update(dict.fromkeys(["combo"] if combo else []))
        if drop or tuning or combo:
            gone = set(drop) | set(tuning) | set(combo)
            kept = {k: v for k, v in options.items() if k not in gone}
            new["options"] = kept or None
    if new == kwargs:
        return None
    return new, tuple(removed)


def _describe(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    return {k: kwargs[k] for k in ("mode", "options") if kwargs.get(k) is not None}


def _why(removed: Tuple[str, ...]) -> str:
    why = []
    if "graphs" in removed:
        why.append(WHY_GRAPHS)
    if "tuning" in removed:
        why.append(WHY_TUNING)
    if "combo" in removed:
        why.append(WHY_COMBO)
    return "; ".join(why)


def _how_to_keep(removed: Tuple[str, ...]) -> str:
    keep = []
    if "tuning" in removed:
        keep.append(f"to keep autotuning set {ENV_KEEP_TUNING}=1 or "
                    f"{settings.PROFILE}=perf")
    if "graphs" in removed:
        keep.append(f"to keep CUDA graphs set {ENV_ALLOW_GRAPHS}=1")
    if "combo" in removed:
        keep.append(f"to keep combo kernels set {ENV_KEEP_COMBO}=1 or "
                    f"{settings.PROFILE}=perf")
    return "; ".join(keep) + " (ROCM_AUTOPATCH=0 turns rocm-autopatch off)"


def _note(before: Dict[str, Any], after: Dict[str, Any], site: str,
          removed: Tuple[str, ...]) -> None:
    b, a = _describe(before), _describe(after)
    with record.LOCK:
        for item in record.REPORT.compile_rewrites:
            if item.before == b and item.after == a and item.call_site == site:
                item.count += 1
                return
        record.REPORT.compile_rewrites.append(
            record.CompileRewrite(b, a, site, reason=_why(removed)))
    log.warn_once(("rewrite", repr(b), site),
                  f"torch.compile({_fmt(b)}) at {site} runs as torch.compile({_fmt(a)}): "
                  f"{_why(removed)}. {_how_to_keep(removed)[0].upper()}"
                  f"{_how_to_keep(removed)[1:]}.")


def _fmt(kwargs: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "defaults"


def guard(original: Any) -> Any:
    """``original`` (torch.compile) behind the guard."""

    def compile(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") not in INDUCTOR_BACKENDS:
            return original(*args, **kwargs)  # not ours to touch: no policy read
        found = rewrite(kwargs, policy())
        if found is None:
            return original(*args, **kwargs)
        new, removed = found
        _note(kwargs, new, frames.site_text(), removed)
        return original(*args, **new)

    return compile


def is_guarded(fn: Any) -> bool:
    return patching.ours(fn)


def install(torch: ModuleType) -> None:
    """Wrap ``torch.compile``; idempotent (a second call, a reload of torch)."""
    with _lock:
        if patching.ours(getattr(torch, "compile", None)):
            return
        if patching.wrap(torch, "compile", guard, like_original=True) is None:
            record.fix("compile_guard", record.SKIPPED, "this torch has no torch.compile")
            return
        # The overrides are applied at Inductor's config import, not yet here.
        allowed = Policy(graphs=graphs_allowed(), tuning=record.REPORT.profile == "perf",
                         combo=_combo_allowed(torch))
        rewrites = {mode: rewrite({"mode": mode}, allowed) for mode in MODES}
        dropped = (() if allowed.graphs else GRAPH_OPTIONS) + (
            () if allowed.tuning else TUNING_OPTIONS) + (
            () if allowed.combo else COMBO_OPTIONS)
        kept = ([f"CUDA graphs ({ENV_ALLOW_GRAPHS}=1)"] if allowed.graphs else []) + (
            [f"autotuning asked for in code (perf or {ENV_KEEP_TUNING}=1)"]
            if allowed.tuning else [])
        record.fix(
            "compile_guard", record.APPLIED,
            "torch.compile rewrites: " + (", ".join(
                f"mode={k!r} -> {v[0]['mode']!r}" for k, v in rewrites.items() if v) or "none")
            + "; truthy options dropped: " + (", ".join(dropped) or "none")
            + ("; kept: " + ", ".join(kept) if kept else
               f" (autotuning kept with {ENV_KEEP_TUNING}=1 or perf; CUDA graphs with "
               f"{ENV_ALLOW_GRAPHS}=1)")
            + ("" if allowed.tuning else f"; {ENV_KEEP_TUNING}=1, once Inductor's config "
               "applies it, keeps autotuning asked for in code"),
            f"{profiles.REF_CUDAGRAPHS}; {profiles.REF_AUTOTUNE}"
            + ("" if allowed.combo else "; pytorch#168937, pytorch#187269"))
