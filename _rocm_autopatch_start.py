"""Interpreter start-up for rocm-autopatch: the trigger that every Python runs.

``TRIGGER`` is the whole start-up: a few lines that put one tiny finder at the front of
``sys.meta_path`` and wait for the program's first ``import torch``; only then is the
``rocm_autopatch`` package loaded (``rocm_autopatch.bootstrap.take_over``). It reaches a
process by one of four paths, all ending in the same idempotent ``install``:

- ``rocm_autopatch.pth``: the trigger's source is written into the .pth line itself, so
  no module is loaded at start-up. site compiles a .pth line from source at every start
  anyway; a module would be compiled too wherever no bytecode cache exists (a uv install,
  ``PYTHONDONTWRITEBYTECODE=1``): +2.5 ms per process (BENCHMARKS.md, start-up).
  Regenerate the file with ``python _rocm_autopatch_start.py > rocm_autopatch.pth``.
- ``rocm_autopatch.start`` (Python 3.15+, PEP 829): names ``start`` below; it replaces the
  .pth line on those Pythons.
- torch's backend autoload (the ``torch.backends`` entry point, torch >= 2.5, run at the
  end of ``import torch``): ``autoload`` below, for layouts where no .pth is processed.
- ``rocm-autopatch run`` (the launcher) and the doctor call ``start``.

Stdlib only, nothing on stdout, never raises: this runs in every Python process, pip's too.
"""

import sys

# The one definition of ROCM_AUTOPATCH's values; rocm_autopatch.bootstrap reads them here.
ENV_MODE = "ROCM_AUTOPATCH"
OFF_VALUES = ("0", "off", "false", "no")
AUTO_VALUES = ("", "1", "on", "auto", "true", "yes")
FORCE_VALUES = ("force",)

# The trigger, run with a fresh globals dict by the .pth line at every interpreter start
# (compiled from source each time: every line here costs; BENCHMARKS.md, start-up) and by
# start() below. ``take_over`` loads the package and answers every later import through
# the post-import finder; the bookkeeping of non-.pth paths is in start(), not here.
TRIGGER = f"""\
import os, sys
class TorchImportTrigger:
    rocm_autopatch = True
    via = globals().get("VIA", ".pth")
    reached = (via,)
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            try:
                from rocm_autopatch.bootstrap import take_over
            except Exception:
                self.find_spec = lambda *args: None
            else:
                return take_over(self, name, path, target)
if os.environ.get({ENV_MODE!r}, "").strip().lower() not in {OFF_VALUES!r} and not any(
        getattr(f, "rocm_autopatch", False) for f in sys.meta_path):
    sys.meta_path.insert(0, TorchImportTrigger())
    "torch" in sys.modules and sys.meta_path[0].find_spec("torch")
"""


def say(text: str) -> None:
    """Write to stderr and never raise: a closed pipe or descriptor must neither change the
    program's exit status nor switch rocm-autopatch off (every message of ours goes here)."""
    try:
        stream = sys.stderr
        if stream is not None:
            stream.write(text)
            stream.flush()
    except (OSError, ValueError):
        pass


def pth_line() -> str:
    """The content of ``rocm_autopatch.pth``: one line, which site runs as it starts."""
    return f"import os; exec({TRIGGER!r}, {{}})\n"


def installed():
    """The trigger in ``sys.meta_path``, if any path has installed it in this process."""
    for finder in sys.meta_path:
        if getattr(finder, "rocm_autopatch", False):
            return finder
    return None


def start(via: str = ".start"):
    """The single, idempotent start-up call (.start, the launcher, the doctor, torch's
    autoload): installs the trigger if no other path has, and records ``via``."""
    try:
        exec(TRIGGER, {"VIA": via})  # installs it, unless off or already installed
        trigger = installed()
        if trigger is None:  # ROCM_AUTOPATCH=0
            return None
        if via not in trigger.reached:
            trigger.reached = (*trigger.reached, via)
        if "torch" in sys.modules:  # torch came first (torch's autoload, another .pth)
            from rocm_autopatch.bootstrap import take_over

            take_over(trigger, "torch")  # idempotent
        return trigger
    except Exception:  # noqa: BLE001 - start-up must never break an interpreter
        return None


def autoload() -> None:
    """torch's ``torch.backends`` entry point: an exception here would fail ``import torch``."""
    start("torch.backends entry point")


if __name__ == "__main__":
    sys.stdout.write(pth_line())
