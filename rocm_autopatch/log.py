"""Logging: the ``rocm_autopatch`` logger, ``ROCM_AUTOPATCH_LOG``, and say-it-once helpers.

Messages go to stderr (never stdout) through ``logging``. By default only warnings show.
In multi-process runs (``RANK``/``LOCAL_RANK`` set) the once-per-process summary comes
from rank 0 only; warnings come from every rank that has them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Hashable, Set

ENV_LOG = "ROCM_AUTOPATCH_LOG"
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 10,
}

logger = logging.getLogger("rocm_autopatch")


class _Stderr(logging.StreamHandler):
    """Our messages on stderr. Where stderr is gone (a closed pipe), logging would print
    "--- Logging error ---" and a traceback there: we say nothing more instead."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        return
_said: Set[Hashable] = set()
_lock = threading.Lock()
_configured = False


def _configure() -> None:
    global _configured
    if _configured:
        return
    _configured = True
    raw = os.environ.get(ENV_LOG, "")
    level = LEVELS.get(raw.strip().lower() or "warning")
    if logger.level == logging.NOTSET:
        logger.setLevel(level if level is not None else logging.WARNING)
    if not any(getattr(h, "_rocm_autopatch", False) for h in logger.handlers):
        handler = _Stderr(sys.stderr)
        handler.setFormatter(logging.Formatter("rocm-autopatch: %(levelname)s: %(message)s"))
        handler._rocm_autopatch = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        # Our handler already prints; don't print twice via a root handler.
        logger.propagate = False
    if level is None:
        warn_once(
            ("env", ENV_LOG),
            f"{ENV_LOG}={raw!r} is not understood; accepted: "
            f"{', '.join(LEVELS)}. Using warning.",
        )


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
    from rocm_autopatch import record

    with record.LOCK:
        record.REPORT.warnings.append(message)
    return True


TRUE_WORDS = ("1", "true", "on", "yes")
FALSE_WORDS = ("", "0", "false", "off", "no")  # unset is off


def env_flag(var: str, what_if_bad: str, warn: bool = True) -> bool:
    """A yes/no environment variable; anything else is off, with one warning (``warn``)
    that names the variable, what is accepted and ``what_if_bad`` (what happens instead)."""
    raw = os.environ.get(var, "")
    value = raw.strip().lower()
    if value in TRUE_WORDS:
        return True
    if value not in FALSE_WORDS and warn:
        warn_once(("env", var), f"{var}={raw!r} is not understood; accepted: 1/true/on/yes "
                  f"or 0/false/off/no. {what_if_bad}")
    return False


# Where torchrun, Slurm wrappers and accelerate put a process's rank, in that order.
RANK_VARIABLES = ("RANK", "LOCAL_RANK")


def is_rank_zero() -> bool:
    for var in RANK_VARIABLES:
        value = os.environ.get(var)
        if value is not None and value.strip() not in ("", "0"):
            return False
    return True


def summary(message: str) -> None:
    """The once-per-process info line; rank 0 only."""
    if is_rank_zero():
        get_logger().info(message)
