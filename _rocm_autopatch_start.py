"""Interpreter start-up for rocm-autopatch: the only code of ours that every Python runs.

Loaded by ``rocm_autopatch.pth`` (and named by ``rocm_autopatch.start`` on Python 3.15+).
It reads ``ROCM_AUTOPATCH`` and puts one tiny finder at the front of ``sys.meta_path``
that waits for the program's first ``import torch``; only then is the ``rocm_autopatch``
package loaded (``rocm_autopatch.bootstrap.activate``). It is one top-level module, not
part of the package, because each module loaded at start-up costs ~0.2 ms (BENCHMARKS.md).
Stdlib only (``os`` and ``sys``, which site has already loaded), nothing on stdout, never
raises.
"""

import os
import sys

# The one definition of ROCM_AUTOPATCH's values (the .pth line repeats OFF_VALUES so that
# "off" loads nothing at all); rocm_autopatch.bootstrap reads them from here.
ENV_MODE = "ROCM_AUTOPATCH"
OFF_VALUES = ("0", "off", "false", "no")
AUTO_VALUES = ("", "1", "on", "auto", "true", "yes")
FORCE_VALUES = ("force",)
# Values that need nothing more until torch is imported; anything else (an unknown value to
# warn about) activates at once.
WAIT_VALUES = AUTO_VALUES + FORCE_VALUES


class _Inert:
    def find_spec(self, name, path=None, target=None):
        return None


class TorchImportTrigger:
    """Costs one comparison per import until torch is imported, then delegates.

    It stays in ``sys.meta_path`` for good: another thread may be walking that list, and
    removing an entry under it can make that thread skip a finder. After the first
    ``import torch`` it forwards to the package's post-import finder (inert where the
    package turned out to have nothing to do).
    """

    rocm_autopatch = True  # how start() recognises an installed trigger, across reloads
    finder = None

    def find_spec(self, name, path=None, target=None):
        finder = self.finder
        if finder is None:
            if name != "torch":
                return None
            finder = self.activate()
        return finder.find_spec(name, path, target)

    def activate(self):
        try:
            from rocm_autopatch import bootstrap

            self.finder = bootstrap.activate() or _Inert()
        except Exception as exc:  # noqa: BLE001 - never break the user's import
            self.finder = _Inert()
            try:
                sys.stderr.write(f"rocm-autopatch: warning: start-up failed, inactive: {exc!r}\n")
            except Exception:  # noqa: BLE001
                pass
        return self.finder


def installed():
    """The trigger in ``sys.meta_path``, if start() has run in this process."""
    for finder in sys.meta_path:
        if getattr(finder, "rocm_autopatch", False):
            return finder
    return None


def start():
    """The single, idempotent start-up call (.pth, .start, the launcher, the doctor)."""
    try:
        raw = os.environ.get(ENV_MODE, "").strip().lower()
        if raw in OFF_VALUES or installed() is not None:
            return
        trigger = TorchImportTrigger()
        sys.meta_path.insert(0, trigger)
        if raw not in WAIT_VALUES or "torch" in sys.modules:
            trigger.activate()  # warn about the value now / torch came first (another .pth)
    except Exception:  # noqa: BLE001 - start-up must never break an interpreter
        pass
