"""The compile-frame hook: the one owner of ``torch._dynamo.convert_frame._compile``.

Every Dynamo frame compile (Inductor's included) passes through ``_compile`` on torch
2.1-2.15, looked up as a module global. One wrapper, installed once, runs the small parts
that need to see each compile:

- the capture policy (``capture``): while the current stream is capturing a graph, the
  frame runs eagerly this once instead of compiling, or, with
  ``ROCM_AUTOPATCH_COMPILE_IN_CAPTURE=1``, torch compiles it with the RNG fix and the
  clear error;
- the watchdog (``watchdog``): one warning when a compile runs past its threshold;
- the compile report (``compile_report``, only when ``ROCM_AUTOPATCH_REPORT`` is set):
  times the compile and reads torch's counters around it.

Outside capture with the watchdog off, a compile costs one extra call and a capture check.
"""

from __future__ import annotations

import threading
import types
from time import perf_counter
from typing import Any, Callable, Optional, Tuple

from rocm_autopatch import frames, patching, record, torch_releases
from rocm_autopatch.guards import capture, watchdog

_lock = threading.Lock()
_current = threading.local()


def current() -> Optional[Tuple[str, int, str]]:
    """(file, first line, name) of the frame this thread is compiling, if any (the numerics
    sentinel names its graphs with it)."""
    return getattr(_current, "where", None)


def make_wrapper(torch: types.ModuleType, original: Callable[..., Any], *, eager: bool,
                 decline: Callable[[], Any], skip_rng: bool, seconds: float,
                 observe: Optional[Any] = None,
                 after_first: Optional[Callable[[], None]] = None) -> Any:
    # Called once, when the process's first frame compile ends (list.pop is atomic: one
    # thread takes it): by then the configuration that compile used has been applied.
    once = [after_first] if after_first is not None else []

    def _compile(*args: Any, **kwargs: Any) -> Any:
        capturing = capture.capturing(torch)
        if capturing and eager:
            return capture.decline(decline, args, kwargs)
        where = frames.compiled_frame(args, kwargs)
        timer = watchdog.arm(where, seconds) if seconds else None
        token = observe.begin(args, kwargs) if observe is not None else None
        start = perf_counter()
        error = None
        outer, _current.where = current(), where
        try:
            if capturing:
                return capture.compile_inside(torch, original, skip_rng, args, kwargs)
            return original(*args, **kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            _current.where = outer
            if timer is not None:
                timer.cancel()
            if observe is not None:
                observe.end(where, token, perf_counter() - start, error)
            if once:
                _first_end(once)

    return _compile


def _first_end(once: list) -> None:
    try:
        said = once.pop()
    except IndexError:  # another thread took it
        return
    try:
        said()
    except Exception:  # noqa: BLE001 - a message must never break a compile
        pass


def installed(convert_frame: types.ModuleType) -> Optional[Any]:
    """Our wrapper, if ``convert_frame._compile`` is one."""
    found = getattr(convert_frame, "_compile", None)
    return found if patching.ours(found) else None


def install(convert_frame: types.ModuleType,
            after_first: Optional[Callable[[], None]] = None) -> None:
    """Wrap ``convert_frame._compile`` once; idempotent (a second call, a reload).
    ``after_first`` runs once, when the process's first frame compile ends."""
    import torch

    with _lock:
        original = getattr(convert_frame, "_compile", None)
        if original is None or not callable(original):
            reason = ("layout not recognised: torch._dynamo.convert_frame has no _compile "
                      "function; nothing patched")
            for name in (capture.POLICY, capture.FIX, capture.CLEAR_ERROR, watchdog.NAME):
                record.fix(name, record.SKIPPED, reason)
            return
        if installed(convert_frame) is not None:
            return
        eager = not capture.compile_in_capture()
        form, decline = torch_releases.decline_form(convert_frame)
        if eager and decline() is None:
            capture.install_capture_end_hook(torch)
        skip_rng = torch_releases.version(torch) < capture.FIXED_IN
        seconds = watchdog.install()
        if record.COMPILE is not None:
            record.COMPILE.watch(convert_frame)
        patching.wrap(convert_frame, "_compile", lambda found: make_wrapper(
            torch, found, eager=eager, decline=decline, skip_rng=skip_rng, seconds=seconds,
            observe=record.COMPILE, after_first=after_first))
        capture.record_fixes(torch, convert_frame, eager, form, skip_rng)
