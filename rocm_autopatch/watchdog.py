"""The compile watchdog: one warning when a single compilation runs past a threshold.

Seed 001: runaway autotuning "hangs indefinitely with no error message and no timeout".
``convert_frame._compile`` (every Dynamo frame compile, Inductor's included, passes
through it) is wrapped so that each call arms a one-shot timer thread, cancelled when the
call returns. If it fires, it logs what is being compiled, for how long, the settings that
usually cause it and the fix. It never stops or slows the compile; no thread exists while
no compile runs. ``ROCM_AUTOPATCH_COMPILE_WATCHDOG=SECONDS`` (``0`` turns it off).
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
import types
from typing import Any, Callable, Dict, Tuple

from rocm_autopatch import log, record

ENV = "ROCM_AUTOPATCH_COMPILE_WATCHDOG"
DEFAULT_SECONDS = 300.0
NAME = "compile_watchdog"
_lock = threading.Lock()
_compiles: Dict[Tuple[str, int, str], int] = {}  # (file, line, name) -> compiles so far
_ids = itertools.count(1)


def threshold(raw: str) -> float:
    """``ROCM_AUTOPATCH_COMPILE_WATCHDOG`` -> seconds (0 = off); a bad value warns."""
    if not raw.strip():
        return DEFAULT_SECONDS
    try:
        value = float(raw)
        if value >= 0 and value == value and value != float("inf"):
            return value
    except ValueError:
        pass
    log.warn_once(("env", ENV), f"{ENV}={raw!r} is not understood; accepted: a number of "
                  f"seconds >= 0 (0 turns the watchdog off). Using {DEFAULT_SECONDS:g}.")
    return DEFAULT_SECONDS


def _where(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[str, int, str]:
    code = args[0] if args else kwargs.get("code")
    if isinstance(code, types.CodeType):
        return code.co_filename, code.co_firstlineno, code.co_name
    return "<unknown>", 0, "<unknown>"


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
    filename, line, name = where
    with _lock:
        count = _compiles.get(where, 1)
    log.warn_once(
        (NAME, call_id),
        f"torch.compile has spent {seconds:g} s compiling {name} ({filename}:{line}), "
        f"compile #{count} of it in this process; settings: {_settings()}. Usual causes: "
        "GEMM autotuning (mode='max-autotune', TORCHINDUCTOR_MAX_AUTOTUNE=1) or recompiles "
        "(changing shapes). Fix: unset TORCHINDUCTOR_MAX_AUTOTUNE, don't ask for "
        "max-autotune, keep the safe profile; for recompiles use dynamic=True. The compile "
        f"goes on; this is only a warning ({ENV}=0 turns it off).")


def make_wrapper(original: Callable[..., Any], seconds: float) -> Any:
    def _compile(*args: Any, **kwargs: Any) -> Any:
        where = _where(args, kwargs)
        with _lock:
            _compiles[where] = _compiles.get(where, 0) + 1
        timer = threading.Timer(seconds, _warn, (next(_ids), where, seconds))
        timer.daemon = True  # never keeps the interpreter alive
        timer.start()
        try:
            return original(*args, **kwargs)
        finally:
            timer.cancel()

    # Name, doc and __wrapped__ of the original; __module__ stays ours (where the code is).
    functools.update_wrapper(_compile, original, assigned=("__name__", "__qualname__",
                                                           "__doc__"), updated=())
    _compile._rocm_autopatch_watchdog = True  # type: ignore[attr-defined]
    return _compile


def _already_wrapped(func: Any) -> bool:
    while func is not None:
        if getattr(func, "_rocm_autopatch_watchdog", False):
            return True
        func = getattr(func, "__wrapped__", None) if hasattr(func, "_rocm_autopatch") else None
    return False


def install(convert_frame: types.ModuleType) -> None:
    seconds = threshold(os.environ.get(ENV, ""))
    with _lock:
        original = getattr(convert_frame, "_compile", None)
        if seconds == 0:
            record.REPORT.fixes[NAME] = {"status": record.SKIPPED,
                                         "reason": f"turned off ({ENV}=0)"}
            return
        if original is None or not callable(original):
            record.REPORT.fixes[NAME] = {
                "status": record.SKIPPED,
                "reason": "torch._dynamo.convert_frame has no _compile function"}
            return
        if _already_wrapped(original):
            return
        convert_frame._compile = make_wrapper(original, seconds)
        record.REPORT.fixes[NAME] = {
            "status": record.APPLIED,
            "reason": f"one warning when a single compile runs past {seconds:g} s ({ENV})"}
