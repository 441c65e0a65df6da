"""Interpreter start-up for rocm-autopatch: the trigger that every Python runs.

``TRIGGER`` is the whole start-up: a few lines that put one tiny finder (a function) at
the front of ``sys.meta_path`` and wait for the program's first ``import torch``; only then
is this module imported and the ``rocm_autopatch`` package loaded (``fire``, then
``rocm_autopatch.startup.bootstrap.take_over``). It reaches a
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

# The one definition of ROCM_AUTOPATCH's values; rocm_autopatch.startup.bootstrap reads them here.
ENV_MODE = "ROCM_AUTOPATCH"
OFF_VALUES = ("0", "off", "false", "no")
AUTO_VALUES = ("", "1", "on", "auto", "true", "yes")
FORCE_VALUES = ("force",)

# The trigger, run with a fresh globals dict by the .pth line at every interpreter start
# (compiled from source each time: every token here costs; BENCHMARKS.md, start-up). It
# creates no class and runs no generator: the finder is a function whose ``find_spec`` is
# itself, and ``sys._rocm_autopatch`` both marks it installed (the .pth line can run twice,
# a venv's site-packages is processed twice on some Pythons) and finds it again. At
# ``import torch`` it calls ``fire`` below, which loads the package. ``start`` runs it with
# ``VIA`` set, and fires it itself once it has recorded which path that was.
TRIGGER = f"""\
import os, sys
if os.environ.get({ENV_MODE!r}, '').strip().lower() not in {OFF_VALUES!r} \\
        and not hasattr(sys, '_rocm_autopatch'):
    def rocm_autopatch_trigger(n, p=None, g=None):
        if n == 'torch':
            return __import__('_rocm_autopatch_start').fire(rocm_autopatch_trigger, n, p, g)
    rocm_autopatch_trigger.find_spec = sys._rocm_autopatch = rocm_autopatch_trigger
    sys.meta_path.insert(0, rocm_autopatch_trigger)
    'torch' in sys.modules and 'VIA' not in globals() and rocm_autopatch_trigger('torch')
"""


def fire(trigger, name, path=None, target=None):
    """The trigger saw ``import torch``: load the package and let it take over (where it
    cannot load, the trigger stands down for good)."""
    try:
        from rocm_autopatch.startup.bootstrap import take_over
    except Exception:  # noqa: BLE001 - never break an import
        trigger.find_spec = _inert
        return None
    return take_over(trigger, name, path, target)


def _inert(*args):
    return None


def say(text: str) -> None:
    """Write to stderr and never raise: a closed pipe, a full device or a closed descriptor
    must neither change the program's exit status nor switch rocm-autopatch off (every
    message of ours goes here). Written to the descriptor itself, after flushing what the
    stream holds: text left in the stream's buffer would fail the final flush at exit and
    turn the exit status into 120 (``2>/dev/full``)."""
    try:
        stream = sys.stderr
        if stream is None:
            return
        try:
            fd = stream.fileno()
        except Exception:  # noqa: BLE001 - no descriptor (a StringIO, pytest's capture)
            fd = None
        if fd is None:
            stream.write(text)
            stream.flush()
            return
        stream.flush()
        import os

        data = text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace")
        while data:
            data = data[os.write(fd, data):]
    except (OSError, ValueError):
        pass


def pth_line() -> str:
    """The content of ``rocm_autopatch.pth``: one line, which site runs as it starts. Its
    guard comes before the ``exec``: site processes a venv's site-packages twice on some
    Pythons (3.11 here, pip and uv venvs alike), and a second pass, or ``ROCM_AUTOPATCH=0``,
    then costs no compile of the trigger (123 -> 55 us a pass; BENCHMARKS.md, start-up)."""
    return (f"import os, sys; os.environ.get({ENV_MODE!r}, '').strip().lower() in "
            f"{OFF_VALUES!r} or hasattr(sys, '_rocm_autopatch') or exec({TRIGGER!r}, {{}})\n")


def mode_text() -> str:
    """``ROCM_AUTOPATCH`` as set ("" when unset): read here, where the trigger reads it."""
    import os

    return os.environ.get(ENV_MODE, "")


def torch_autoload(environ=None):
    """Will torch (>= 2.5) run its backend autoload? Its own rule, to the letter
    (``torch/__init__.py`` ``_is_device_backend_autoload_enabled``: unset or exactly "1")."""
    import os

    return (os.environ if environ is None else environ).get(
        "TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"


def installed():
    """The trigger, if any path has installed it in this process."""
    return getattr(sys, "_rocm_autopatch", None)


def paths(trigger):
    """(the path that installed ``trigger``, every path that reached it, in order). The .pth
    line records nothing on the trigger (each token there costs): no ``via`` means .pth."""
    via = getattr(trigger, "via", ".pth")
    return via, getattr(trigger, "reached", (via,))


def start(via: str = ".start"):
    """The single, idempotent start-up call (.start, the launcher, the doctor, torch's
    autoload): installs the trigger if no other path has, and records ``via``."""
    try:
        before = installed()
        exec(TRIGGER, {"VIA": via})  # installs it (unless off or installed); fires below
        trigger = installed()
        if trigger is None:  # ROCM_AUTOPATCH=0
            return None
        if before is None:
            trigger.via = via  # installed here; the .pth line sets nothing (it costs)
        reached = paths(trigger)[1]
        if via not in reached:
            reached = (*reached, via)
        trigger.reached = reached
        if "torch" in sys.modules:  # torch came first (torch's autoload, another .pth)
            from rocm_autopatch.startup.bootstrap import take_over

            take_over(trigger, "torch")  # idempotent
        return trigger
    except Exception:  # noqa: BLE001 - start-up must never break an interpreter
        return None


def autoload() -> None:
    """torch's ``torch.backends`` entry point: an exception here would fail ``import torch``."""
    start("torch.backends entry point")


if __name__ == "__main__":
    sys.stdout.write(pth_line())
