"""What differs between torch releases, in one place: each fact read from the running
torch (an attribute, a dataclass field, a signature), never from a version number alone,
except where torch's own notes give one (the RNG fix, 2.10).

coverage.py keeps its Python-version facts in ``env.PYBEHAVIOR``; this is the same for
torch. The modules that adapt to a release (the config applier and overrides, the capture
policy, the compile report) ask here. Stdlib only: torch's modules are passed in or looked
up in ``sys.modules`` (a fact about a module not imported is "not there").
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import logging
import re
import sys
import types
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple


def version(torch: types.ModuleType) -> Tuple[int, int]:
    """(major, minor) of ``torch.__version__``; (0, 0) when it can't be read."""
    return release(str(getattr(torch, "__version__", "")))


def release(text: Optional[str]) -> Tuple[int, int]:
    """(major, minor) of a version string (``2.13.0+cpu``, ``3.7.0+amd.rocm7.0.0``); (0, 0)
    when it can't be read."""
    # Not a regex: compiling one costs ~0.1 ms on the import path, half this hook's work.
    major, _, rest = (text or "").partition(".")
    minor = "".join(itertools.takewhile(str.isdecimal, rest))
    return (int(major), int(minor)) if major.isdecimal() and minor else (0, 0)


# ---- the config modules (torch._inductor.config, torch._dynamo.config) ------------------

def config_entries(module: ModuleType) -> Optional[Dict[str, Any]]:
    """torch's table of config keys: ``_ConfigEntry`` objects, or plain values (older torch)."""
    entries = module.__dict__.get("_config")
    return entries if isinstance(entries, dict) else None


def config_entry(module: ModuleType, key: str) -> Any:
    """torch's ``_ConfigEntry`` for ``key`` (its alias, its env levels); None on a torch
    without them."""
    entries = config_entries(module)
    return entries.get(key) if entries is not None else None


def config_has_key(module: ModuleType, key: str) -> bool:
    entries = config_entries(module)
    return key in entries if entries is not None else hasattr(module, key)


def set_config_default(module: ModuleType, key: str, value: Any) -> None:
    """Write ``value`` below user assignments and above torch's own default: the level
    torch keeps for environment defaults (``_ConfigEntry.env_value_default``, torch >= 2.3),
    read in every thread (from 2.12 an assignment is a per-thread override); an older torch
    gets a plain assignment."""
    found = config_entry(module, key)
    alias = getattr(found, "alias", None)
    if isinstance(alias, str) and "." in alias:
        # An alias (inductor's force_disable_caches is torch.compiler.config's): written
        # where it lives, so that every thread reads it (torch >= 2.12 keeps assignments
        # per thread).
        owner, _, name = alias.rpartition(".")
        target = sys.modules.get(owner) or importlib.import_module(owner)
        if target is not module:
            set_config_default(target, name, value)
            return
    if found is None or not hasattr(found, "env_value_default") or alias is not None:
        setattr(module, key, value)
        return
    found.env_value_default = value
    # Invalidate torch's cached dict/hash of the config (names vary by release).
    dirty = module.__dict__.get("_hash_dirty_var")
    if dirty is not None:
        dirty.set(True)
    if "_is_dirty" in module.__dict__:
        module.__dict__["_is_dirty"] = True
    mark = getattr(module, "_mark_get_dict_dirty", None)
    if callable(mark):
        mark(key)


# ---- Dynamo's compile frame and graph capture ----------------------------------------------

def decline_form(convert_frame: types.ModuleType) -> Tuple[str, Callable[[], Any]]:
    """(description, factory of the value ``_compile`` returns to run a frame eagerly once)."""
    result_cls = getattr(convert_frame, "ConvertFrameReturn", None)
    fields = ({f.name for f in dataclasses.fields(result_cls)}
              if dataclasses.is_dataclass(result_cls) else set())
    if "apply_to_code" in fields:
        extra = ({"skip_reason": "rocm-autopatch: a graph is being captured; runs eagerly, "
                                 "compiles outside capture"} if "skip_reason" in fields else {})
        return ("ConvertFrameReturn(apply_to_code=False): this call only",
                lambda: result_cls(apply_to_code=False, **extra))
    return ("None (skips the code), un-skipped with reset_code when the capture ends",
            lambda: None)


def rng_layout(convert_frame: types.ModuleType) -> str:
    """Where this torch's preserve_global_state sits (for the record)."""
    trace_frame = getattr(convert_frame, "trace_frame", None)
    if trace_frame is not None and hasattr(trace_frame, "__wrapped__"):
        return "trace_frame decorated at import (2.9+)"
    if hasattr(convert_frame, "preserve_global_state"):
        return "transform decorated inside _compile (2.2-2.8)"
    return "wrap_convert_context (2.1)"


def compile_arguments(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``_compile``'s arguments by name (their positions differ per release)."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    original = getattr(getattr(convert_frame, "_compile", None), "__wrapped__", None)
    if original is None:
        return dict(kwargs)
    key = id(original)
    if key not in _SIGNATURES:
        try:
            _SIGNATURES[key] = inspect.signature(original)
        except (TypeError, ValueError):
            _SIGNATURES[key] = None
    sig = _SIGNATURES[key]
    if sig is None:
        return dict(kwargs)
    try:
        return dict(sig.bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return dict(kwargs)


_SIGNATURES: Dict[int, Any] = {}


def is_recompilation(bound: Dict[str, Any]) -> bool:
    """Does torch call this frame compile a recompilation (``is_recompilation(cache_size)
    and frame``, torch/_dynamo/convert_frame.py ``_compile``)? False where it cannot tell."""
    cache_size = bound.get("cache_size")
    check = getattr(sys.modules.get("torch._dynamo.cache_size"), "is_recompilation", None)
    if cache_size is None or not callable(check):
        return False
    try:
        return bool(check(cache_size)) and bound.get("frame") is not None
    except Exception:  # noqa: BLE001
        return False


# The error leaving ``_compile`` when a frame passes the recompile limit: by type, or by
# torch's message (both differ per release).
RECOMPILE_LIMIT_ERRORS = ("RecompileLimitExceeded", "CacheLimitExceeded")
RECOMPILE_LIMIT_MESSAGE = r"(cache|recompile)[\w ]*limit (reached|exceeded)"  # searched as
# text: compiling it at import would cost every ``import torch`` ~0.1 ms
# torch's function that finds a recompile's guard failures (its name per release).
RECOMPILE_REASONS = ("get_and_maybe_log_recompilation_reasons",
                     "get_and_maybe_log_recompilation_reason")


def hit_recompile_limit(error: BaseException) -> bool:
    return (type(error).__name__ in RECOMPILE_LIMIT_ERRORS
            or re.search(RECOMPILE_LIMIT_MESSAGE, str(error), re.IGNORECASE) is not None)


# ---- what torch records of its compiles (torch._dynamo.utils) ----------------------------

def dynamo_utils() -> Any:
    return sys.modules.get("torch._dynamo.utils")


def counters() -> Any:
    """``torch._dynamo.utils.counters``; None before Dynamo is imported."""
    return getattr(dynamo_utils(), "counters", None)


def compilation_metrics() -> Any:
    """torch's list of ``CompilationMetrics``, one per compile; None where it has none."""
    found = getattr(dynamo_utils(), "_compilation_metrics", None)
    return found if hasattr(found, "__iter__") and hasattr(found, "__len__") else None


def metrics_record(field: str) -> bool:
    """Does this torch's ``CompilationMetrics`` have ``field``? (``recompile_reason`` 2.9+,
    ``is_forward``, ``distributed_ephemeral_timeout_us`` 2.6+)"""
    return hasattr(getattr(dynamo_utils(), "CompilationMetrics", None), field)


def artifact_loggers(suffix: str) -> List[logging.Logger]:
    """torch's loggers of one artifact (``graph_breaks``: several modules log it)."""
    internal = sys.modules.get("torch._logging._internal")
    registry = getattr(internal, "log_registry", None)
    names = getattr(registry, "get_artifact_log_qnames", lambda: ())()
    return [logging.getLogger(n) for n in sorted(names) if n.endswith(f".__{suffix}")]


def compile_id() -> str:
    """torch's id of the compile under way ("0/1", as TORCH_LOGS shows it); "" outside one."""
    try:
        from torch._guards import CompileContext

        found = CompileContext.current_compile_id()
        return str(found) if found is not None else ""
    except Exception:  # noqa: BLE001 - older layouts: no id
        return ""


# ---- Dynamo's disable() wrapper ----------------------------------------------------------

def inside_disable(fn: Any) -> Optional[Tuple[Callable[..., Any], Callable[[], Any]]]:
    """``(inner, get_callback)`` where ``fn`` is a ``torch._dynamo.disable`` wrapper
    (``_torchdynamo_disable``, the function it wraps in ``_torchdynamo_orig_callable``:
    ``DisableContext`` in torch/_dynamo/eval_frame.py) and this torch has
    ``torch._C._dynamo.eval_frame.get_eval_frame_callback``; else None. While
    ``get_callback()`` is None the wrapper only sets and restores a None callback (in
    ordinary use: under ``set_stance("eager_on_recompile")`` it sets False, run-only, which
    matters to no frame of an Inductor call; export annotations apply only to export), so
    ``inner`` may be called directly."""
    inner = getattr(fn, "_torchdynamo_orig_callable", None)
    if getattr(fn, "_torchdynamo_disable", False) is not True or not callable(inner):
        return None
    frames = sys.modules.get("torch._C._dynamo.eval_frame")
    reader = getattr(frames, "get_eval_frame_callback", None)
    return (inner, reader) if callable(reader) else None
