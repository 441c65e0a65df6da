"""Activation: read ``ROCM_AUTOPATCH`` and build the post-import hooks on torch's modules.

Called once, by the start-up trigger (``_rocm_autopatch_start``), when the program first
imports torch, or at once where torch was imported before us or the mode needs a warning.
Still stdlib only: nothing about torch is decided here, that happens in ``hooks`` as each
torch module finishes importing.
"""

import _thread  # not threading: this can run during start-up, before threading is loaded
import os
import sys

import _rocm_autopatch_start
from _rocm_autopatch_start import AUTO_VALUES, ENV_MODE, FORCE_VALUES, OFF_VALUES

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations below are strings
if TYPE_CHECKING:
    from typing import Optional

    from rocm_autopatch.importhook import PostImportFinder

# Module imported by the program -> our callbacks, imported only when the module is.
HOOKS = {
    "torch": ("rocm_autopatch.hooks:on_torch",),
    "torch._dynamo.config": ("rocm_autopatch.hooks:on_dynamo_config",),
    "torch._inductor.config": ("rocm_autopatch.hooks:on_inductor_config",),
    "torch._dynamo.convert_frame": ("rocm_autopatch.hooks:on_convert_frame",),
}

_lock = _thread.allocate_lock()
mode: str = "unset"  # "off", "auto" or "force" once activate() has run
started = False
finder: "Optional[PostImportFinder]" = None


def parse_mode(raw: str) -> str:
    """``ROCM_AUTOPATCH`` -> "off", "auto" or "force"; anything else warns and is "auto"."""
    value = raw.strip().lower()
    if value in OFF_VALUES:
        return "off"
    if value in FORCE_VALUES:
        return "force"
    if value not in AUTO_VALUES:
        sys.stderr.write(
            f"rocm-autopatch: warning: {ENV_MODE}={raw!r} is not understood; accepted: "
            "0/off/false/no (disable), 1/on/auto (ROCm builds only, the default), "
            "force (any torch build). Using auto.\n"
        )
    return "auto"


def activate() -> "Optional[PostImportFinder]":
    """Idempotent. The finder the trigger delegates to, or None when the mode is off."""
    global mode, started, finder
    with _lock:
        if started:
            return finder
        started = True
        mode = parse_mode(os.environ.get(ENV_MODE, ""))
        if mode == "off":
            return None
        from rocm_autopatch import importhook

        finder = importhook.PostImportFinder(HOOKS)
    finder.fire_already_imported()
    return finder


def start() -> None:
    """The start-up call, for code that has the package at hand (the launcher, the doctor)."""
    _rocm_autopatch_start.start()
