"""Arming the compile report, once per process, and writing it whichever way the process
ends: the exit handler, a forked child's own record (``os.register_at_fork``), and a
multiprocessing child's finalizer (it leaves through ``os._exit``, where exit handlers never
run). Armed only where ``ROCM_AUTOPATCH_REPORT`` is set.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
from typing import Optional

from rocm_autopatch import log, record, settings
from rocm_autopatch.reporting import document, placement
from rocm_autopatch.reporting.collector import ENV, Collector

_lock = threading.Lock()


def _after_fork_in_child() -> None:
    collector = record.COMPILE
    if collector is None:
        return
    collector.reset()
    _write_at_multiprocessing_exit(collector)


def _write_at_multiprocessing_exit(collector: Collector) -> None:
    """A multiprocessing child leaves through ``os._exit``: exit handlers never run there,
    its finalizers do. Its bootstrap clears the finalizers it inherited, then runs the
    after-fork callbacks: registered as one, the finalizer survives, whether the report
    was armed before the fork, or while the child imported the main module (forkserver and
    spawn children do that before their bootstrap). Armed later, in the child's target,
    the finalizer is registered at once. Nothing runs twice: the file is written once."""
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is None:
        return
    mp_util.register_after_fork(collector, _finalizer)
    process = sys.modules.get("multiprocessing.process")
    if process is not None and process.parent_process() is not None:
        _finalizer(collector)


def _finalizer(collector: Collector) -> None:
    sys.modules["multiprocessing.util"].Finalize(None, functools.partial(document.write, collector),
                                                 exitpriority=0)


def arm() -> Optional[Collector]:
    """Start collecting, register the exit handler (once per process); the collector."""
    template = log.setting(ENV).strip()
    if not template:
        return None
    with _lock:
        if record.COMPILE is not None:
            return record.COMPILE
        # Resolved now: a program that changes directory (Hydra does) keeps its report here.
        collector = Collector(os.path.abspath(os.path.expanduser(template)))
        record.COMPILE = collector
    claim = f"{os.getpid()} {placement.path(collector.template)}"
    settings.export(settings.REPORT_CLAIM, claim, keep=True)
    atexit.register(document.write, collector)
    _write_at_multiprocessing_exit(collector)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    return collector
