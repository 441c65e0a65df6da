"""The bisection a program starts at exit, under ``ROCM_AUTOPATCH_VERIFY=fallback``, for a
graph that fell back: ``rocm-autopatch bisect DIR`` in a process of its own.

It never delays the program nor changes its exit status: the process is started and not
waited for, in a session of its own, with nothing of the program's (no stdin; its
progress and answer go to ``DIR/bisect-run.log``, so a caller reading the program's output
sees its end at once), at low priority, for at most ``ROCM_AUTOPATCH_VERIFY_BISECT``
seconds. One per repro directory: the ranks of a job that found the same graph wrong
start one between them (an
exclusively created ``DIR/bisect.lock`` decides), and a directory already bisected is not
bisected again. Its result is ``DIR/bisect.json``, which ``doctor --report`` shows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any, Dict

from rocm_autopatch import settings
from rocm_autopatch.sentinel.healing import bisect


def start(folder: str, limit: float) -> Dict[str, Any]:
    """Start the bisection of ``folder``; what the report says about it."""
    lock = os.path.join(folder, bisect.LOCK)
    if os.path.exists(os.path.join(folder, bisect.RESULT)):
        return {"status": "already bisected", "result": os.path.join(folder, bisect.RESULT)}
    try:
        handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return {"status": "started by another process", "log": os.path.join(folder, bisect.LOG)}
    except OSError as exc:
        return {"status": f"not started: {exc}"}
    env = settings.environment()
    # The bisection compiles nothing itself, and must not be watched or patched again.
    env.update({settings.MODE: "0", settings.VERIFY: "0", settings.REPORT: ""})
    nice = shutil.which("nice")
    argv = ([nice, "-n", "10"] if nice else []) + [
        sys.executable, "-m", "rocm_autopatch", "bisect", folder, "--time-limit", f"{limit:g}"]
    try:
        with open(os.path.join(folder, "bisect-run.log"), "w") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=env, close_fds=True,
                                    start_new_session=True, cwd=folder)
        os.write(handle, str(proc.pid).encode())
    except OSError as exc:
        return {"status": f"not started: {exc}"}
    finally:
        os.close(handle)
    return {"status": "started in the background", "pid": proc.pid, "limit": limit,
            "result": os.path.join(folder, bisect.RESULT)}
