"""Activation: read ``ROCM_AUTOPATCH`` and build the post-import hooks on torch's modules.

Called by the start-up trigger (``_rocm_autopatch_start``) when the program first imports
torch, or at once where torch was imported before the trigger was installed (another .pth,
torch's backend autoload). Still stdlib only: nothing about torch is decided here, that
happens in ``hooks`` as each torch module finishes importing.
"""

import _thread  # not threading: this can run during start-up, before threading is loaded
import sys

import _rocm_autopatch_start
from _rocm_autopatch_start import AUTO_VALUES, ENV_MODE, FORCE_VALUES, OFF_VALUES

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations below are strings
if TYPE_CHECKING:
    from typing import Any, Optional

    from rocm_autopatch.startup.post_import import PostImportFinder

# Module imported by the program -> our callbacks, imported only when the module is.
HOOKS = {
    "torch": ("rocm_autopatch.startup.wiring:on_torch",),
    "torch._dynamo.config": ("rocm_autopatch.startup.wiring:on_dynamo_config",),
    "torch._inductor.config": ("rocm_autopatch.startup.wiring:on_inductor_config",),
    "torch._dynamo.convert_frame": ("rocm_autopatch.startup.wiring:on_convert_frame",),
    "torch._inductor.compile_fx": ("rocm_autopatch.startup.wiring:on_compile_fx",),
    "torch._inductor.codecache": ("rocm_autopatch.startup.wiring:on_codecache",),
    "torch._inductor.cpu_vec_isa": ("rocm_autopatch.startup.wiring:on_cpu_vec_isa",),
    "torch._inductor.runtime.triton_heuristics": (
        "rocm_autopatch.startup.wiring:on_triton_heuristics",),
}

_lock = _thread.allocate_lock()
mode: str = "unset"  # "off", "auto" or "force" once activate() has run
started = False
finder: "Optional[PostImportFinder]" = None


def parse_mode(raw: str) -> str:
    """``ROCM_AUTOPATCH`` -> "off", "auto" or "force"; anything else warns and is "auto".
    Its words are read here (this runs at every ``import torch``, any build); ``settings``,
    which declares the variable from the same words, is loaded only to word a warning."""
    value = raw.strip().lower()
    for mode, words in (("off", OFF_VALUES), ("force", FORCE_VALUES), ("auto", AUTO_VALUES)):
        if value in words:
            return mode
    from rocm_autopatch import settings

    found = settings.read(ENV_MODE, {ENV_MODE: raw})
    if found.problem:
        _rocm_autopatch_start.say(f"rocm-autopatch: WARNING: {found.problem}\n")
    return found.value


def activate() -> "Optional[PostImportFinder]":
    """Idempotent. The finder the trigger delegates to, or None when the mode is off."""
    global mode, started, finder
    with _lock:
        if started:
            return finder
        started = True
        mode = parse_mode(_rocm_autopatch_start.mode_text())
        if mode == "off":
            return None
        from rocm_autopatch.startup import post_import

        finder = post_import.PostImportFinder(HOOKS)
    finder.fire_already_imported()
    return finder


def take_over(trigger: "Any", name: str, path: "Any" = None, target: "Any" = None) -> "Any":
    """The trigger saw ``import torch`` (or torch was already imported): activate, then let
    the trigger answer every later import with the post-import finder directly.

    Returns the spec for the import that woke it: torch's own, untouched, where torch will
    call us back at the end of its import (its backend autoload); otherwise one whose loader
    runs our hooks after torch's code. None where the module is already imported: its
    hooks fire now (torch's autoload calls us from inside ``import torch``).
    """
    try:
        found = activate()
        trigger.find_spec = (found.find_spec if found is not None
                             else _rocm_autopatch_start._inert)
        if found is None:
            return None
        if name in sys.modules:
            found.fire_deferred(force=True)
            return None
        spec = found.real_spec(name, path, target)
        if name == "torch" and calls_back(spec):
            found.defer(name)
            return spec
        return found.watch(name, spec) if name in found.hooks else spec
    except Exception as exc:  # noqa: BLE001 - never break the user's import
        trigger.find_spec = _rocm_autopatch_start._inert
        _rocm_autopatch_start.say(f"rocm-autopatch: WARNING: start-up failed, inactive: "
                                  f"{exc!r}\n")
        return None


def calls_back(spec: "Any") -> bool:
    """Will this torch call our ``torch.backends`` entry point at the end of its import?
    Torch 2.5+ does unless ``TORCH_DEVICE_BACKEND_AUTOLOAD`` is not "1"; read from its
    ``__init__.py`` (which defines ``_is_device_backend_autoload_enabled``) without
    importing it, so that a build or a stand-in without the autoload keeps the loader hook."""
    if not _rocm_autopatch_start.torch_autoload():
        return False
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith("__init__.py"):
        return False
    try:
        with open(origin, encoding="utf-8", errors="replace") as fh:
            return "def _is_device_backend_autoload_enabled(" in fh.read()
    except OSError:
        return False


def activation() -> "dict":
    """Which start-up path installed the trigger, and every path that reached it."""
    trigger = _rocm_autopatch_start.installed()
    if trigger is None:
        return {"via": None, "reached": []}
    via, reached = _rocm_autopatch_start.paths(trigger)
    return {"via": via, "reached": list(reached)}


def start(via: str) -> None:
    """The start-up call, for code that has the package at hand (the launcher, the doctor)."""
    _rocm_autopatch_start.start(via)
