"""Coordinate descent's results reused on a warm start, as Inductor means them to be.

Under ``coordinate_descent_tuning`` (the ``perf`` profile) Inductor tunes each Triton kernel
at its first run and saves the config it found, marked ``found_by_coordesc``, in its
autotune cache (a ``.best_config`` file beside the kernel); a later process that finds it is
meant to run that config without tuning again (``torch/_inductor/runtime/autotune_cache.py``
``_load_cached_autotuning``). The mark is lost on the way to the kernel that runs:

- a ``triton.Config`` does not keep it through pickling, and compile workers return their
  kernels pickled (pytorch PR 181292; checked on torch 2.11 with Triton 3.6: the attribute
  is gone after ``pickle.loads(pickle.dumps(config))``);
- ``recheck_autotune_cache`` (kernels loaded from the FX graph cache) ignores a cache hit
  where a kernel has one config, and does not carry the mark (pytorch#172819; printed from
  torch 2.11; torch 2.13's source has the fix PR 173391 describes).

Measured on an H200 with torch 2.11 (BENCHMARKS.md): a warm start of the 32-GEMM model under
``perf`` found all 64 kernels in the autotune cache, and still ran 70 coordinate-descent
benchmarks, 5.5 s of its 9.6 s.

``CachingAutotuner.coordinate_descent_tuning`` is wrapped: where this kernel's autotune cache
holds a config found by coordinate descent for the configs it was compiled from (the same
``configs_hash``), that config runs, marked, and no benchmark does; where it holds none, or
anything does not match, torch tunes as it would. What it decides from is torch's own cache
entry, read through torch's own ``AutotuneCache``: the config is the one torch saved.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Dict, Optional

from rocm_autopatch import log, patching, record

NAME = "coordesc_reuse"  # its entry in report().fixes
REF = ("pytorch#172819, pytorch PR 173391, PR 181292; torch/_inductor/runtime/"
       "autotune_cache.py _load_cached_autotuning")


def install(triton_heuristics: ModuleType) -> None:
    """At ``torch._inductor.runtime.triton_heuristics``' import (only where Triton is).
    Never raises."""
    try:
        tuner = getattr(triton_heuristics, "CachingAutotuner", None)
        if tuner is None or not hasattr(tuner, "coordinate_descent_tuning") \
                or not hasattr(tuner, "_precompile_config"):
            record.fix(NAME, record.SKIPPED, "this torch's CachingAutotuner has no "
                       "coordinate_descent_tuning to reuse results for", REF)
            return
        if patching.wrap(tuner, "coordinate_descent_tuning", _reusing) is not None:
            record.fix(NAME, record.APPLIED, "a warm start reuses the Triton configs "
                       "coordinate descent found in an earlier process (kept in Inductor's "
                       "autotune cache), instead of tuning each kernel again", REF)
    except Exception as exc:  # noqa: BLE001 - torch tunes as without us
        log.hook_failed("torch._inductor.runtime.triton_heuristics",
                        "rocm_autopatch.config.coordesc_reuse.install", exc)


def _reusing(original: Any) -> Any:
    def coordinate_descent_tuning(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            found = cached(self, launcher)
        except Exception:  # noqa: BLE001 - anything unexpected: torch tunes
            found = None
        return original(self, launcher, *args, **kwargs) if found is None else found

    return coordinate_descent_tuning


def cached(tuner: Any, launcher: Any) -> Optional[Any]:
    """The launcher to run without tuning, where ``tuner``'s autotune cache holds a config
    coordinate descent found for the configs this kernel was compiled from: ``launcher``
    itself where it runs that config, else a launcher compiled for it (as torch's own
    tuning ends). None where there is no such entry."""
    cache = getattr(getattr(tuner, "save_cache_hook", None), "__self__", None)
    read = getattr(cache, "_read", None)
    if read is None or not tuner.inductor_meta.get("coordinate_descent_tuning"):
        return None
    best = read()
    if not isinstance(best, dict) or best.get("found_by_coordesc") is not True \
            or best.get("configs_hash") != getattr(cache, "configs_hash", None):
        return None
    if matches(best, launcher.config):
        launcher.config.found_by_coordesc = True
        return launcher
    from torch._inductor.runtime import autotune_cache

    config = autotune_cache._load_cached_autotuning(dict(best), cache.configs_hash,
                                                    [launcher.config], tuner.inductor_meta)
    if config is None or not getattr(config, "found_by_coordesc", False):
        return None
    return tuner._precompile_config(config).make_launcher()


def matches(best: Dict[str, Any], config: Any) -> bool:
    """Is ``config`` the cache entry ``best`` (its block sizes, warps and stages), as torch's
    ``_load_cached_autotuning`` matches one?"""
    return (all(best.get(key) == value for key, value in config.kwargs.items())
            and best.get("num_warps") == config.num_warps
            and best.get("num_stages") == config.num_stages)
