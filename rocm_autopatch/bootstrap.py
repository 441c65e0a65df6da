"""Interpreter start-up: read ``ROCM_AUTOPATCH`` and register the post-import hooks.

Run from ``rocm_autopatch.pth`` (or ``rocm_autopatch.start`` on Python 3.15+) in every
Python process, pip included. Stdlib only, no output on stdout, never raises. Nothing
about torch is decided here: that happens when the program first imports torch.
"""

import _thread  # not threading: start-up imports only what site already has
import os
import sys

ENV_MODE = "ROCM_AUTOPATCH"
OFF_VALUES = ("0", "off", "false", "no")
AUTO_VALUES = ("", "1", "on", "auto", "true", "yes")
FORCE_VALUES = ("force",)

# Module imported by the program -> our callbacks, imported only when the module is.
HOOKS = {
    "torch": ("rocm_autopatch.hooks:on_torch",),
    "torch._dynamo.config": ("rocm_autopatch.hooks:on_dynamo_config",),
    "torch._inductor.config": ("rocm_autopatch.hooks:on_inductor_config",),
    "torch._dynamo.convert_frame": ("rocm_autopatch.hooks:on_convert_frame",),
}

_lock = _thread.allocate_lock()
mode: str = "unset"  # "off", "auto" or "force" once start() has run
started = False


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


def start() -> None:
    """Idempotent; safe to call from the .pth, the .start file and the launcher alike."""
    global mode, started
    try:
        with _lock:
            if started:
                return
            started = True
            mode = parse_mode(os.environ.get(ENV_MODE, ""))
            if mode == "off":
                return
            from rocm_autopatch import importhook

            finder = importhook.PostImportFinder(HOOKS)
            sys.meta_path.insert(0, finder)
        finder.fire_already_imported()
    except Exception as exc:  # noqa: BLE001 - start-up must never break an interpreter
        try:
            sys.stderr.write(f"rocm-autopatch: warning: start-up failed, inactive: {exc!r}\n")
        except Exception:  # noqa: BLE001
            pass
