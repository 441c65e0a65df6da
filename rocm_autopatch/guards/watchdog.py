"""The compile watchdog: a warning when a single compilation runs past a threshold, then
what it is doing until it ends.

Runaway autotuning shows as a compile that never ends, with no message (the
max-autotune benchmarks in BENCHMARKS.md did not finish in 200 s), and a normal first
compile of minutes on AMD GPUs looks the same (sglang#6830, vllm#34399): users kill jobs
they believe hung. The compile-frame hook (``compile_frame``) arms a timer for each Dynamo
frame compile (Inductor's included) and cancels it when the compile returns. If it fires,
it warns: what is being compiled, for how long, the settings that usually cause it and the
fix. From then on, at most one line every ``min(threshold, 60 s)`` says what the compile has
done since it started, from torch's own counters (kernels compiled and reused, GEMMs
autotuned, FX graph cache hits), and one line gives its total when it ends: rank 0 only, on
stderr. It never stops or slows the compile; no thread exists while no compile runs.
``ROCM_AUTOPATCH_COMPILE_WATCHDOG=SECONDS`` (``0`` turns it off).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from typing import Any, Dict, Optional, Tuple

from rocm_autopatch import frames, log, record, settings

ENV = settings.WATCHDOG
NAME = "compile_watchdog"
_lock = threading.Lock()
_compiles: Dict[Tuple[str, int, str], int] = {}  # (file, line, name) -> compiles so far
_ids = itertools.count(1)


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
    if record.COMPILE is not None:  # the compile report lists each warning given
        record.COMPILE.slow_compile({"where": label, "seconds": seconds, "compile": count})
    log.warn_once(
        (NAME, call_id),
        f"torch.compile has spent {seconds:g} s compiling {label}, "
        f"compile #{count} of it in this process; settings: {_settings()}. Usual causes: "
        "GEMM autotuning (mode='max-autotune', TORCHINDUCTOR_MAX_AUTOTUNE=1) or recompiles "
        "(changing shapes). Fix: unset TORCHINDUCTOR_MAX_AUTOTUNE, don't ask for "
        "max-autotune, keep the safe profile; for recompiles use dynamic=True. The compile "
        f"goes on; this is only a warning ({ENV}=0 turns it off).")


# torch's counters (torch._dynamo.utils.counters["inductor"]) that say what a compile is
# doing, and how a progress line names them (torch/_inductor/async_compile.py,
# select_algorithm.py, codecache.py, torch 2.13).
PROGRESS = (("async_compile_cache_miss", "kernels compiled"),
            ("async_compile_cache_hit", "kernels reused"),
            ("select_algorithm_autotune", "GEMMs autotuned"),
            ("select_algorithm_num_precompiles", "autotuning candidates built"),
            ("fxgraph_cache_hit", "FX graph cache hits"),
            ("fxgraph_cache_miss", "FX graph cache misses"))
EVERY_MAX = 60.0  # seconds: the most between two progress lines


def _counters() -> Dict[str, int]:
    utils = sys.modules.get("torch._dynamo.utils")
    found = getattr(utils, "counters", {}).get("inductor", {}) if utils else {}
    return {key: int(found.get(key, 0)) for key, _ in PROGRESS}


class Watch:
    """One compile's timer: the warning at the threshold, progress lines, the total."""

    def __init__(self, call_id: int, where: Tuple[str, int, str], seconds: float) -> None:
        self.call_id, self.where, self.seconds = call_id, where, seconds
        self.every = min(seconds, EVERY_MAX)
        self.start = time.monotonic()
        self.before = _counters()
        self.fired = False
        self.done = threading.Event()
        self.timer = self._after(seconds, self._fire)

    def _after(self, seconds: float, then: Any) -> threading.Timer:
        timer = threading.Timer(seconds, then)
        timer.daemon = True  # never keeps the interpreter alive
        timer.start()
        return timer

    def doing(self) -> str:
        now = _counters()
        parts = [f"{now[key] - self.before[key]} {name}" for key, name in PROGRESS
                 if now[key] - self.before[key]]
        return ", ".join(parts) or "no kernel compiled yet (tracing, or lowering)"

    def _fire(self) -> None:
        if self.done.is_set():
            return
        self.fired = True
        _warn(self.call_id, self.where, self.seconds)
        self.timer = self._after(self.every, self._progress)

    def _progress(self) -> None:
        if self.done.is_set():
            return
        log.notice(f"still compiling {frames.label(*self.where)}: "
                   f"{time.monotonic() - self.start:.0f} s so far; {self.doing()}")
        self.timer = self._after(self.every, self._progress)

    def cancel(self) -> None:
        """The compile returned (or raised): stop; after a warning, say its total."""
        self.done.set()
        self.timer.cancel()
        if self.fired:
            log.notice(f"compile of {frames.label(*self.where)} finished after "
                       f"{time.monotonic() - self.start:.1f} s; {self.doing()}")


def arm(where: Tuple[str, int, str], seconds: float) -> Optional[Watch]:
    """Count a compile of ``where`` and start its timer (cancel it when done); None where
    no timer can start (the compile goes on unwatched: recorded as failed, said once)."""
    with _lock:
        _compiles[where] = _compiles.get(where, 0) + 1
    try:
        return Watch(next(_ids), where, seconds)
    except Exception as exc:  # noqa: BLE001 - a timer must never cost the program its compile
        _cannot_start(exc)
        return None


def _cannot_start(exc: BaseException) -> None:
    reason = (f"cannot start its timer thread here ({type(exc).__name__}: {exc}): a compile "
              "that runs long gets no warning (a process limit on threads?)")
    record.fix(NAME, record.FAILED, reason)
    log.warn_once((NAME, "thread"), f"the compile watchdog {reason}")


def install() -> float:
    """The threshold in seconds (0 = off), recorded; the compile-frame hook arms the timer.
    A timer is started and stopped once here, so that one that cannot start is known (and
    a red flag in the doctor) before the first compile needs it."""
    seconds = log.setting(ENV)
    if seconds == 0:
        record.fix(NAME, record.SKIPPED, f"turned off ({ENV}=0)")
        return seconds
    try:
        probe = threading.Timer(0, lambda: None)
        probe.daemon = True
        probe.start()
        probe.join()
    except Exception as exc:  # noqa: BLE001 - said, recorded; compiles go on unwatched
        _cannot_start(exc)
        return 0.0
    record.fix(NAME, record.APPLIED,
               f"one warning when a single compile runs past {seconds:g} s, then what it "
               f"is doing every {min(seconds, EVERY_MAX):g} s until it ends ({ENV})")
    return seconds
