"""Where a process's compile report goes, and writing it there: the path its template
gives (``{rank}``, ``{pid}``), a child's own name beside its parent's, and never over a file
another process of the run wrote while this one ran (``flock`` per directory, the process
start time from ``/proc``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import Optional

from rocm_autopatch import files, log, settings

ENV = settings.REPORT
# "<pid> <path>" of the first process that armed the report, inherited by its children.
_CLAIM = settings.REPORT_CLAIM


def rank() -> Optional[str]:
    """This process's rank as the report writes it (digits only: a value that is not a
    rank is warned about, naming its variable, and the report is named by pid)."""
    found = log.rank()
    return None if found is None else str(found)


def path(template: str) -> str:
    """Where this process writes: the template's path, or ``.<pid>`` before its
    extension where a parent process of this run armed the same path first."""
    pid = str(os.getpid())
    path = template.replace("{rank}", rank() or pid).replace("{pid}", pid)
    claimer, _, claimed = (settings.raw(_CLAIM) or "").partition(" ")
    if claimer and claimer != pid and claimed == path:  # a child would take its name
        path = _beside(path, pid)
    return path

def place(path: str, text: str, started: float) -> str:
    """Write ``text`` to ``path``, unless another process wrote ``path`` while this one
    ran (a parent that imported torch after forking this child, two processes that
    srun or a shell started with one path): then beside it, ``.<pid>``, and one
    warning names both writers. Serialised per directory (``flock``), so that two
    writers never both decide the path is free. The path where it went."""
    with files.directory_lock(os.path.dirname(path) or "."):
        other = _writer_during(path, _process_start() or started)
        if other is not None:
            mine = _beside(path, str(os.getpid()))
            files.write_atomically(mine, text)
            log.warn_once(("compile_report", "shared"),
                          f"{ENV}: {path} was written by {other} while this process "
                          f"(pid {os.getpid()}, {' '.join(sys.argv)[:80]}) ran: both "
                          f"are kept, this one as {mine}. Put {{rank}} or {{pid}} in "
                          f"{ENV} to give each process its own file.")
            return mine
        files.write_atomically(path, text)
        return path


def parent_in_run() -> Optional[int]:
    """The pid of the process of this run that armed the report first, where that is not
    this one (this one is its child: a fork, a multiprocessing worker); else None."""
    claimer = (settings.raw(_CLAIM) or "").partition(" ")[0]
    return int(claimer) if claimer.isdigit() and int(claimer) != os.getpid() else None


def _beside(path: str, pid: str) -> str:
    stem, ext = os.path.splitext(path)
    return f"{stem}.{pid}{ext}"


def _process_start() -> Optional[float]:
    """When this process started (Linux: /proc/self/stat's start time after boot); None
    where it cannot be read."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as fh:
            boot = next(int(ln.split()[1]) for ln in fh if ln.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _writer_during(path: str, since: float) -> Optional[str]:
    """"pid N (argv)" of another process that wrote the report at ``path`` at ``since`` or
    later; None where there is none (no file, ours, or one left by an earlier run)."""
    try:
        found = os.lstat(path)
        # Only a regular file is read: opening a FIFO would wait for a writer for ever.
        if not stat.S_ISREG(found.st_mode) or found.st_mtime < since - 0.02:  # a clock tick
            return None
        with open(path) as fh:
            process = json.load(fh).get("process", {})
        if process.get("pid") == os.getpid():
            return None
        argv = " ".join(str(a) for a in process.get("argv") or [])[:80]
        return f"pid {process.get('pid', '?')} ({argv})"
    except (OSError, ValueError, AttributeError, TypeError):
        return None
