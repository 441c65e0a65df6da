"""One step of a bisection, inside its own interpreter: take the bisector's state and the
change to try from the environment the bisecting process set, apply them, run the repro.

``python -m rocm_autopatch.sentinel.healing.step_child repro.py [key=value ...]`` (a fresh
interpreter) or ``main`` in a fork of the warm interpreter (``step_server``). The state is
read from the environment, not from torch's own file: torch reads that from its Inductor
cache directory, which a repro sets to the program's. A change that is an Inductor setting
goes on repro.py's command line (the repro applies it after its own settings); any other
change is applied here, before the repro runs.
"""

from __future__ import annotations

import json
import runpy
import sys
from typing import Any, List

from rocm_autopatch import settings

# The change applied for the life of this process: collected, it would undo itself.
_held: List[Any] = []


def main(argv: List[str]) -> None:
    """Run the repro ``argv[0]`` with ``argv`` as its ``sys.argv``."""
    state = settings.take(settings.BISECT_STATE)
    if state:
        from torch._inductor import compiler_bisector as cb

        cb.CompilerBisector.in_process_cache = state
        cb.CompilerBisector.bisection_enabled = cb.get_is_bisection_enabled()
    name = json.loads(settings.take(settings.BISECT_NAME) or "null")
    if name:
        from rocm_autopatch.sentinel.healing import naming

        naming.install(**name)
    change = json.loads(settings.take(settings.BISECT_CHANGE) or "null")
    if change:
        from rocm_autopatch.sentinel.healing import fixes

        applied = fixes.applied({"change": change})
        applied.__enter__()
        _held.append(applied)
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
