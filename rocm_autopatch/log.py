"""Our messages: the ``rocm_autopatch`` logger, say-it-once warnings, and settings read
with their one warning.

Messages go to stderr (never stdout) through ``logging``; by default only warnings show
(``ROCM_AUTOPATCH_LOG``). In multi-process runs the once-per-process lines come from rank 0
only; warnings come from every rank that has them. Every warning is also kept in the
record (``report().warnings``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Hashable, Optional, Set

from _rocm_autopatch_start import say
from rocm_autopatch import record, settings

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "off": logging.CRITICAL + 10}

logger = logging.getLogger("rocm_autopatch")


class _Stderr(logging.Handler):
    """Our lines on stderr through ``say``: a closed or full stderr changes nothing (no
    "--- Logging error ---", no text left in a buffer to fail the exit status)."""

    def emit(self, rec: logging.LogRecord) -> None:
        try:
            say(self.format(rec) + "\n")
        except Exception:  # noqa: BLE001 - formatting our own message: never raise
            pass


_said: Set[Hashable] = set()
_lock = threading.Lock()
_configured = False


def _configure() -> None:
    global _configured
    if _configured:
        return
    _configured = True
    level = settings.read(settings.LOG)
    if logger.level == logging.NOTSET:
        logger.setLevel(LEVELS[level.value])
    if not any(getattr(h, "_rocm_autopatch", False) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("rocm-autopatch: %(levelname)s: %(message)s"))
        handler._rocm_autopatch = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        # Our handler already prints; don't print twice via a root handler.
        logger.propagate = False
    if level.problem:
        warn_once(("env", settings.LOG), level.problem)


def get_logger() -> logging.Logger:
    _configure()
    return logger


def warn_once(key: Hashable, message: str) -> bool:
    """Log ``message`` at warning level the first time ``key`` is seen in this process."""
    with _lock:
        if key in _said:
            return False
        _said.add(key)
    get_logger().warning(message)
    with record.LOCK:
        record.REPORT.warnings.append(message)
    return True


def setting(name: str, warn: bool = True) -> Any:
    """The value of the variable ``name`` (``settings``); a bad one is warned about once,
    naming the variable and what it accepts (``warn=False``: another reader warns)."""
    found = settings.read(name)
    if found.problem and warn:
        warn_once(("env", name), found.problem)
    return found.value


def path_setting(name: str) -> Optional[str]:
    """A path variable's value: None for ``off`` (and the other no-words), its absolute path
    when set, "" when unset (the caller's default)."""
    given = str(setting(name)).strip()
    if given.lower() in settings.FALSE_WORDS:
        return None
    return os.path.abspath(os.path.expanduser(given)) if given else ""


def rank() -> Optional[int]:
    """This process's rank (``RANK``, else ``LOCAL_RANK``); None where neither is a rank."""
    for name in (settings.RANK, settings.LOCAL_RANK):
        value = setting(name)
        if value is not None:
            return value
    return None


def is_rank_zero() -> bool:
    return rank() in (None, 0)


def summary(message: str) -> None:
    """The once-per-process info line; rank 0 only."""
    if is_rank_zero():
        get_logger().info(message)


def notice(message: str) -> None:
    """A line said by default, not as a warning (what the profile changed, at the end of
    the first compile; the sentinel's verdict at exit): shown at the default level and
    above it, not with ``ROCM_AUTOPATCH_LOG=error``/``off``; rank 0 only."""
    if get_logger().isEnabledFor(logging.WARNING) and is_rank_zero():
        say(f"rocm-autopatch: {message}\n")


def hook_failed(module_name: str, target: str, exc: BaseException) -> None:
    """A hook of ours raised: recorded, said once; the rest of rocm-autopatch still runs."""
    message = f"{target} (on import of {module_name}) failed: {exc!r}"
    with record.LOCK:
        record.REPORT.errors.append(message)
    warn_once(("hook", target), f"{message}; the rest of rocm-autopatch still applies.")
