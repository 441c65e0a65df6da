"""The compile watchdog: one warning when a single compilation runs past a threshold.

Runaway autotuning shows as a compile that never ends, with no message (the
max-autotune benchmarks in BENCHMARKS.md did not finish in 200 s). The compile-frame hook
(``compile_frame``) arms a one-shot timer for each Dynamo frame compile (Inductor's
included) and cancels it when the compile returns. If it fires, it logs what is being
compiled, for how long, the settings that usually cause it and the fix. It never stops or
slows the compile; no thread exists while no compile runs.
``ROCM_AUTOPATCH_COMPILE_WATCHDOG=SECONDS`` (``0`` turns it off).
"""

from __future__ import annotations

import itertools
import sys
import threading
from typing import Any, Dict, List, Tuple

from rocm_autopatch import frames, log, record, settings

ENV = settings.WATCHDOG
NAME = "compile_watchdog"
_lock = threading.Lock()
_compiles: Dict[Tuple[str, int, str], int] = {}  # (file, line, name) -> compiles so far
_ids = itertools.count(1)
# Each warning given: {"where", "seconds", "compile"} (the compile report lists them).
fired: List[Dict[str, Any]] = []


def _settings() -> str:
    found = []
    inductor = sys.modules.get("torch._inductor.config")
    for key in ("max_autotune", "max_autotune_gemm", "max_autotune_gemm_backends",
                "coordinate_descent_tuning"):
        if inductor is not None and hasattr(inductor, key):
            found.append(f"{key}={getattr(inductor, key)!r}")
    dynamo = sys.modules.get("torch._dynamo.config")
    for key in ("recompile_limit", "cache_size_limit"):
        if dynamo is not None and hasattr(dynamo, key):
            found.append(f"{key}={getattr(dynamo, key)!r}")
            break
    return ", ".join(found) or "torch config not loaded"


def _warn(call_id: int, where: Tuple[str, int, str], seconds: float) -> None:
    label = frames.label(*where)
    with _lock:
        count = _compiles.get(where, 1)
        fired.append({"where": label, "seconds": seconds, "compile": count})
    log.warn_once(
        (NAME, call_id),
        f"torch.compile has spent {seconds:g} s compiling {label}, "
        f"compile #{count} of it in this process; settings: {_settings()}. Usual causes: "
        "GEMM autotuning (mode='max-autotune', TORCHINDUCTOR_MAX_AUTOTUNE=1) or recompiles "
        "(changing shapes). Fix: unset TORCHINDUCTOR_MAX_AUTOTUNE, don't ask for "
        "max-autotune, keep the safe profile; for recompiles use dynamic=True. The compile "
        f"goes on; this is only a warning ({ENV}=0 turns it off).")


def arm(where: Tuple[str, int, str], seconds: float) -> threading.Timer:
    """Count a compile of ``where`` and start its one-shot timer (cancel it when done)."""
    with _lock:
        _compiles[where] = _compiles.get(where, 0) + 1
    timer = threading.Timer(seconds, _warn, (next(_ids), where, seconds))
    timer.daemon = True  # never keeps the interpreter alive
    timer.start()
    return timer


def install() -> float:
    """The threshold in seconds (0 = off), recorded; the compile-frame hook arms the timer."""
    seconds = log.setting(ENV)
    if seconds == 0:
        record.fix(NAME, record.SKIPPED, f"turned off ({ENV}=0)")
    else:
        record.fix(NAME, record.APPLIED,
                   f"one warning when a single compile runs past {seconds:g} s ({ENV})")
    return seconds
