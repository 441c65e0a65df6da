"""What runs when each torch module is first imported (wired up in ``bootstrap.HOOKS``).

``on_torch`` decides, once, whether this process is patched (a ROCm build, or
``ROCM_AUTOPATCH=force``); on any other build the import hook stops watching and nothing
is changed or loaded beyond this module, ``probe`` and ``record``. The other hooks apply
the configuration and fixes to the module just imported, so Dynamo and Inductor are never
imported early. Each is idempotent.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import List, Optional, Set, Tuple

# Only what deciding needs: on a CUDA or CPU torch nothing else of ours is loaded.
from rocm_autopatch import probe, record
from rocm_autopatch.startup import bootstrap, post_import

_lock = threading.RLock()
_decided = False
_configured: Set[Tuple[str, int, int]] = set()


def decide(torch: Optional[ModuleType] = None) -> bool:
    """Is rocm-autopatch active in this process? Decided once, from torch's build strings."""
    global _decided
    report = record.REPORT
    with _lock:
        if _decided:
            return report.active
        torch = torch or sys.modules.get("torch")
        if torch is None or getattr(torch, "version", None) is None:
            return False  # too early to tell; a later hook decides
        _decided = True
        report.mode = bootstrap.mode
        report.forced = bootstrap.mode == "force"
        report.activation = bootstrap.activation()
        for field, value in probe.torch_build(torch).items():
            setattr(report, field, value)
        if report.platform != "rocm" and not report.forced:
            report.active = False
            report.reason = (f"torch {report.torch_version} is a {report.platform} build; "
                             "nothing changed (ROCM_AUTOPATCH=force applies it anyway)")
            post_import.deactivate(bootstrap.finder)
            return False
        from rocm_autopatch import log, settings

        report.active = True
        report.profile = log.setting(settings.PROFILE)
        report.reason = ("forced by ROCM_AUTOPATCH=force" if report.platform != "rocm"
                         else f"ROCm build (HIP {report.hip_version})")
        from rocm_autopatch.config import applier

        applier.record_pending(report.profile)
        if log.setting(settings.REPORT).strip():  # unset: not even loaded
            from rocm_autopatch.reporting import lifecycle

            lifecycle.arm()
        if settings.raw(settings.CACHE) is not None or settings.names(
                suffix="FORCE_DISABLE_CACHES"):
            from rocm_autopatch.config import caches  # unset: not even loaded

            caches.install(torch)
        if report.profile == "perf":
            from rocm_autopatch.config import tunableop  # safe: not even loaded

            tunableop.install(torch)
        return True


def on_torch(torch: ModuleType) -> Optional[str]:
    if getattr(torch, "version", None) is None or "compile" not in vars(torch):
        return post_import.LATER  # its body has not run yet (importlib.util.LazyLoader)
    if not decide(torch):
        return None
    from rocm_autopatch.guards import compile_options

    compile_options.install(torch)
    return None


def _configure(module: ModuleType, namespace: str) -> None:
    if not decide():
        return
    # Once per module object and config table: a reload builds a new table, and re-applies.
    token = (namespace, id(module), id(module.__dict__.get("_config")))
    with _lock:
        if token in _configured:
            return
        _configured.add(token)
    from rocm_autopatch import log, settings
    from rocm_autopatch.config import applier

    profile = record.REPORT.profile
    found = {}
    # Only when such a variable is set: no overrides module and no naming of all ~600 keys
    # (~1 ms) on every other start.
    if namespace == "inductor" and settings.names(prefix=settings.OVERRIDE_PREFIX):
        from rocm_autopatch.config import overrides

        found = overrides.read(module, warn=log.warn_once)
    changes = applier.apply(module, namespace, profile, found, log.warn_once)
    logger = log.get_logger()
    for change in changes:
        logger.debug("%s: %r -> %r (%s, %s%s)", change.key, change.before, change.after,
                     change.source, change.status,
                     f": {change.reason}" if change.reason else "")
    changed = [c.key for c in changes if c.status == record.APPLIED]
    failed = [c.key for c in changes if c.status == record.FAILED]
    log.summary(f"{namespace} config, {profile} profile: {len(changed)} changed"
                + (f" ({', '.join(changed)})" if changed else "")
                + (f"; FAILED: {', '.join(failed)}" if failed else "")
                + "; `rocm-autopatch doctor` shows all, ROCM_AUTOPATCH=0 turns it off")
    for change in changes:
        if change.status == record.FAILED:
            log.warn_once(("failed", change.key),
                          f"could not set {change.key}={change.wanted!r}: {change.reason}")
    if namespace == "inductor":  # before the compile workers start: they copy the environment
        from rocm_autopatch.config import triton_env

        triton_env.install(module)


def on_inductor_config(module: ModuleType) -> None:
    _configure(module, "inductor")


def on_dynamo_config(module: ModuleType) -> None:
    _configure(module, "dynamo")


def on_convert_frame(module: ModuleType) -> None:
    if not decide():
        return
    from rocm_autopatch.guards import compile_frame

    compile_frame.install(module, after_first=say_what_changed)


def say_what_changed() -> None:
    """The one line a process that compiles gets by default (rank 0; not with
    ``ROCM_AUTOPATCH_LOG=error``/``off``), at the end of its first compile: which settings
    the profile changed from torch's values, and where to read why or turn it off. Nothing
    where nothing changed."""
    from rocm_autopatch import log

    with record.LOCK:
        changed = [c.key for c in record.REPORT.config if c.status == record.APPLIED]
        failed = [c.key for c in record.REPORT.config if c.status == record.FAILED]
        profile = record.REPORT.profile
    if not changed and not failed:
        return
    def names(keys: List[str]) -> str:  # "inductor.triton.cudagraphs" -> triton.cudagraphs
        short = [key.split(".", 1)[1] for key in keys]
        return ", ".join(short[:3]) + (f" and {len(short) - 3} more" if len(short) > 3 else "")

    log.notice(f"{profile} profile: changed {names(changed) or 'nothing'}"
               + (f"; could not set {names(failed)}" if failed else "")
               + " (why: rocm-autopatch doctor; undo: ROCM_AUTOPATCH=0)")



def _caches() -> Optional[ModuleType]:
    """``config.caches`` where ``decide`` loaded it (ROCM_AUTOPATCH_CACHE set); else None,
    and nothing is loaded."""
    return sys.modules.get("rocm_autopatch.config.caches") if decide() else None


def on_codecache(module: ModuleType) -> None:
    """The C++ precompiled headers beside the caches."""
    caches = _caches()
    if caches is not None:
        caches.keep_headers(module)


def on_cpu_vec_isa(module: ModuleType) -> None:
    """The CPU vector-ISA checks remembered beside the caches."""
    caches = _caches()
    if caches is not None:
        caches.keep_isa_checks(module)


def on_triton_heuristics(module: ModuleType) -> None:
    """Coordinate descent's cached results reused on a warm start (Triton kernels only)."""
    if not decide():
        return
    from rocm_autopatch.config import coordesc_reuse

    coordesc_reuse.install(module)


def on_compile_fx(module: ModuleType) -> None:
    """Each graph compiled once by a job's ranks (``config.compile_once``, loaded only in a
    job of several ranks); the numerics sentinel (unset or off, not even its package is
    imported)."""
    if not decide():
        return
    from rocm_autopatch import log, settings

    world = log.setting(settings.WORLD_SIZE, warn=False)
    if isinstance(world, int) and world > 1:
        from rocm_autopatch.config import compile_once

        compile_once.install(module, world)

    if log.setting(settings.VERIFY) == "off":
        return
    from rocm_autopatch import sentinel

    sentinel.install(module)
