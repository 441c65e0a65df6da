"""Files that several processes share: a write a reader sees whole or not at all
(``write_atomically``), a lock on a directory for the time of a read-and-write
(``directory_lock``; ``try_lock`` for one that is not waited for), and a JSON object read
back, or nothing (``read_json``). The compile report, the sentinel's remembered fixes and
bisection results, the remembered CPU ISA checks and the ranks' compile locks go through
them."""

from __future__ import annotations

import os
import stat
import threading
import time
from typing import Any, Dict, Optional


class directory_lock:
    """An exclusive ``flock`` on a directory for the time of one read-and-write (a compile
    report's, the fixes store's); nothing where it cannot be had (no fcntl, a file system
    without locks) or within ``WAIT`` seconds: a holder that hangs or was stopped (a lock
    inherited by a forked child that lives on) must not hang this process at its exit."""

    WAIT = 10.0

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.fd: Optional[int] = None

    def __enter__(self) -> None:
        try:
            self.fd = open_directory(self.directory)
            deadline = time.monotonic() + self.WAIT
            while not try_lock(self.fd):
                if time.monotonic() > deadline:
                    raise TimeoutError(self.directory)
                time.sleep(0.02)
        except Exception:  # noqa: BLE001 - a lock we cannot have: write unserialised
            self.__exit__()

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock
            self.fd = None


def open_directory(directory: str) -> int:
    """A descriptor of ``directory`` (made where missing) to ``flock``; closing it releases
    a lock held through it."""
    os.makedirs(directory, exist_ok=True)
    return os.open(directory, os.O_RDONLY)


def try_lock(fd: int) -> bool:
    """An exclusive ``flock`` on ``fd`` if no one holds one; never waits (raises where this
    system has no ``flock``)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a
    rename, but only where ``path`` is a regular file or does not exist: a device, a FIFO, a
    directory or a symlink is never replaced. The temporary file never outlives a failure."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    if found is not None and not stat.S_ISREG(found.st_mode):
        kind = ("a symlink" if stat.S_ISLNK(found.st_mode) else "a directory"
                if stat.S_ISDIR(found.st_mode) else "a FIFO" if stat.S_ISFIFO(found.st_mode)
                else "a device" if stat.S_ISCHR(found.st_mode) or stat.S_ISBLK(found.st_mode)
                else "not a regular file")
        raise OSError(f"it is {kind}; only a regular file or a new path is written")
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    # Short: a legal 250-character name must not make the temporary name too long.
    temporary = os.path.join(directory, f".rap-{os.getpid()}-{threading.get_ident() % 10**6}"
                                        ".tmp")
    try:
        with open(temporary, "w") as fh:
            fh.write(text)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def read_json(path: str) -> Optional[Dict[str, Any]]:
    """The JSON object in ``path``; None where it is missing, unreadable or not an object."""
    import json  # not at start-up: the other helpers here are used there

    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
