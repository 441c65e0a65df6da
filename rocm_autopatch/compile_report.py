"""The compile report: what torch.compile did in this process, written as JSON at exit.

``ROCM_AUTOPATCH_REPORT=PATH`` arms it (``{rank}`` and ``{pid}`` in PATH are replaced).
Only then is this module loaded, an exit handler registered and anything counted: the
compile-frame hook (``compile_frame``) passes each Dynamo frame compile to ``Collector``,
which times it and reads torch's own counters around it. What torch states is read where
the running release has it, never guessed:

- graph breaks: ``torch._dynamo.utils.counters["graph_break"]`` (reason -> count), the
  change across one frame compile attributed to that frame (function, file:line);
- recompiles: a frame compiled again; the failed guard from the newest entry of
  ``torch._dynamo.utils._compilation_metrics`` (``CompilationMetrics.recompile_reason``,
  torch 2.9+; earlier releases: reported as unknown);
- the recompile limit: the error leaving ``_compile`` when a frame passes it, by type
  (``RecompileLimitExceeded``, torch 2.6-2.9 with some settings) or by torch's message
  ("cache_size_limit reached" in 2.4-2.6, "Dynamo cache limit exceeded" in 2.9,
  "Dynamo recompile limit exceeded" from 2.13; ``torch/_dynamo/convert_frame.py``);
- graphs: ``counters["stats"]["unique_graphs"]``; Inductor's FX graph cache and AOT
  autograd's cache: ``counters["inductor"]``/``counters["aot_autograd"]``.

The file holds everything ``rocm_autopatch.report()`` has plus a ``compile`` section and
the process's identity. It is written atomically (a temporary file, then a rename), never
raises, never changes the exit status; an unwritable path gives one warning. A child
process (fork, spawn, a subprocess) writes its own file: where PATH would give it the same
name as the process that armed the report first, ``.<pid>`` goes before the extension.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import threading
import time
from typing import Any, Dict, Optional, Tuple

from rocm_autopatch import log, record

ENV = record.ENV_REPORT
SCHEMA = 1
TOP = 10  # entries kept per list (graph breaks, recompiles, slowest frames)
# "<pid> <path>" of the first process that armed the report, inherited by its children.
_CLAIM = "_ROCM_AUTOPATCH_REPORT_CLAIM"
LIMIT_ERRORS = ("RecompileLimitExceeded", "CacheLimitExceeded")
LIMIT_MESSAGE = re.compile(r"(cache|recompile)[\w ]*limit (reached|exceeded)", re.IGNORECASE)

_lock = threading.Lock()


def _first_line(text: str, limit: int = 300) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line[:limit]


def _torch_utils() -> Any:
    return sys.modules.get("torch._dynamo.utils")


def _counters() -> Any:
    return getattr(_torch_utils(), "counters", None)


def _metrics() -> Any:
    found = getattr(_torch_utils(), "_compilation_metrics", None)
    return found if hasattr(found, "__getitem__") and hasattr(found, "__len__") else None


def rank() -> Optional[str]:
    for var in log.RANK_VARIABLES:
        value = os.environ.get(var, "").strip()
        if value:
            return value
    return None


class Collector:
    """Per-process compile statistics, fed by the compile-frame hook."""

    def __init__(self, template: str) -> None:
        self.template = template
        # Frames compiled in this process or before a fork: a forked child's compile of one
        # of them is a recompile (it starts a fresh record, not a fresh cache).
        self.seen: set = set()
        self.reset()

    def reset(self) -> None:
        """A fresh record: at arming, and in a forked child (it reports its own compiles)."""
        self.pid = os.getpid()
        self.started = time.time()
        self.written = False
        self.frames: Dict[str, Dict[str, Any]] = {}
        self.breaks: Dict[Tuple[str, str], int] = {}
        self.recompiles: Dict[Tuple[str, str], int] = {}
        self.limit_hits: Dict[str, int] = {}
        self.failures: Dict[Tuple[str, str], int] = {}
        self.compiles = 0
        self.seconds = 0.0

    # ---- fed by compile_frame, around each frame compile -------------------------------

    def begin(self) -> Tuple[Optional[Dict[str, int]], Any]:
        counters = _counters()
        metrics = _metrics()
        breaks = dict(counters["graph_break"]) if counters is not None else None
        return breaks, (metrics[-1] if metrics else None)

    def end(self, where: Tuple[str, int, str], token: Tuple[Optional[Dict[str, int]], Any],
            seconds: float, error: Optional[BaseException]) -> None:
        try:
            self._end(record.frame_label(*where), token, seconds, error)
        except Exception as exc:  # noqa: BLE001 - counting must never break a compile
            log.warn_once(("compile_report", "count"), f"compile report: counting failed: "
                          f"{exc!r}; the report will be incomplete")

    def _end(self, where: str, token: Tuple[Optional[Dict[str, int]], Any], seconds: float,
             error: Optional[BaseException]) -> None:
        breaks_before, newest_before = token
        counters = _counters()
        metrics = _metrics()
        newest = metrics[-1] if metrics else None
        entry = newest if newest is not None and newest is not newest_before else None
        with _lock:
            self.compiles += 1
            self.seconds += seconds
            frame = self.frames.setdefault(where, {"where": where, "compiles": 0,
                                                   "seconds": 0.0, "max_seconds": 0.0})
            again = where in self.seen or bool(getattr(entry, "recompile_reason", None))
            self.seen.add(where)
            frame["compiles"] += 1
            frame["seconds"] += seconds
            frame["max_seconds"] = max(frame["max_seconds"], seconds)
            if breaks_before is not None and counters is not None:
                for reason, count in counters["graph_break"].items():
                    new = count - breaks_before.get(reason, 0)
                    if new > 0:
                        key = (_first_line(reason), where)
                        self.breaks[key] = self.breaks.get(key, 0) + new
            if again:
                reason = getattr(entry, "recompile_reason", None)
                # A dataclass field with a default is a class attribute: 2.9+ has it.
                known = hasattr(getattr(_torch_utils(), "CompilationMetrics", None),
                                "recompile_reason")
                text = (_first_line(reason) if reason else "not stated by torch" if known else
                        "unknown: this torch does not record recompile reasons")
                key = (where, text)
                self.recompiles[key] = self.recompiles.get(key, 0) + 1
            if error is not None:
                name = type(error).__name__
                if name in LIMIT_ERRORS or LIMIT_MESSAGE.search(_first_line(error)):
                    self.limit_hits[where] = self.limit_hits.get(where, 0) + 1
                else:
                    key = (where, f"{name}: {_first_line(error)}")
                    self.failures[key] = self.failures.get(key, 0) + 1

    # ---- at exit --------------------------------------------------------------------

    def compile_section(self) -> Dict[str, Any]:
        counters = _counters()
        unknown: Dict[str, str] = {}

        def counted(group: str, key: str, needs: str) -> Optional[int]:
            if counters is None:
                unknown[f"{group}.{key}"] = "torch._dynamo was not imported"
                return None
            if needs and needs not in sys.modules:
                unknown[f"{group}.{key}"] = f"{needs} not loaded: not in this torch, or not used"
                return None
            return int(counters[group][key]) if group in counters else 0

        with _lock:
            frames = sorted(self.frames.values(), key=lambda f: -f["seconds"])
            breaks = sorted(self.breaks.items(), key=lambda kv: -kv[1])
            recompiles = sorted(self.recompiles.items(), key=lambda kv: -kv[1])
            section = {
                "frames": self.compiles,
                "graphs": counted("stats", "unique_graphs", ""),
                "seconds": round(self.seconds, 3),
                "graph_breaks": {
                    "total": (sum(int(v) for v in counters["graph_break"].values())
                              if counters is not None else None),
                    "top": [{"reason": r, "where": w, "count": c} for (r, w), c in breaks[:TOP]],
                },
                "recompiles": {
                    "total": sum(self.recompiles.values()),
                    "top": [{"where": w, "reason": r, "count": c}
                            for (w, r), c in recompiles[:TOP]],
                },
                "recompile_limit_hit": [{"where": w, "count": c}
                                        for w, c in sorted(self.limit_hits.items())],
                "failed": [{"where": w, "error": e, "count": c}
                           for (w, e), c in sorted(self.failures.items())],
                "slowest_frames": [{**f, "seconds": round(f["seconds"], 3),
                                    "max_seconds": round(f["max_seconds"], 3)}
                                   for f in frames[:TOP]],
            }
        with record.LOCK:
            eager = dict(record.REPORT.eager_in_capture)
        section["eager_in_capture"] = {"total": sum(eager.values()), "frames": eager}
        from rocm_autopatch import watchdog

        section["watchdog_warnings"] = list(watchdog.fired)
        section["cache"] = {
            "fxgraph_hit": counted("inductor", "fxgraph_cache_hit", "torch._inductor.codecache"),
            "fxgraph_miss": counted("inductor", "fxgraph_cache_miss",
                                    "torch._inductor.codecache"),
            "aot_autograd_hit": counted("aot_autograd", "autograd_cache_hit",
                                        "torch._functorch._aot_autograd.autograd_cache"),
            "aot_autograd_miss": counted("aot_autograd", "autograd_cache_miss",
                                         "torch._functorch._aot_autograd.autograd_cache"),
        }
        section["unknown"] = unknown
        return section

    def path(self) -> str:
        pid = str(os.getpid())
        path = os.path.expanduser(self.template.replace("{rank}", rank() or pid)
                                  .replace("{pid}", pid))
        claimer, _, claimed = os.environ.get(_CLAIM, "").partition(" ")
        if claimer and claimer != pid and claimed == path:  # a child would take its name
            stem, ext = os.path.splitext(path)
            path = f"{stem}.{pid}{ext}"
        return path

    def document(self) -> Dict[str, Any]:
        with record.LOCK:
            data = record.REPORT.to_dict()
        return {
            "schema": SCHEMA,
            "process": {"pid": os.getpid(), "rank": rank(),
                        "local_rank": os.environ.get("LOCAL_RANK"),
                        "world_size": os.environ.get("WORLD_SIZE"),
                        "host": os.uname().nodename, "argv": list(sys.argv),
                        "python": sys.version.split()[0],
                        "started": round(self.started, 3), "written": round(time.time(), 3)},
            **data,
            "compile": self.compile_section(),
        }

    def write(self) -> None:
        """The exit handler: write the file once per process; never raises."""
        if self.written and self.pid == os.getpid():
            return
        self.written = True
        path = "?"
        try:
            path = self.path()
            document = self.document()
            directory = os.path.dirname(path) or "."
            os.makedirs(directory, exist_ok=True)
            temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
            with open(temporary, "w") as fh:
                json.dump(document, fh, indent=1, default=repr)
            os.replace(temporary, path)
        except Exception as exc:  # noqa: BLE001 - never at exit
            try:
                log.warn_once(("compile_report", "write"),
                              f"{ENV}={self.template!r}: cannot write the compile report to "
                              f"{path}: {getattr(exc, 'strerror', None) or exc!r}; nothing "
                              "written (give a writable path, e.g. /tmp/report-{rank}.json)")
            except Exception:  # noqa: BLE001
                pass
            return
        try:
            c = document["compile"]
            log.summary(f"compile: {c['graphs'] if c['graphs'] is not None else '?'} graphs, "
                        f"{c['graph_breaks']['total']} graph breaks, "
                        f"{c['recompiles']['total']} recompiles, {c['seconds']:.1f} s compiling; "
                        f"report: {path} (`rocm-autopatch doctor --report` renders it)")
        except Exception:  # noqa: BLE001
            pass


def _after_fork_in_child() -> None:
    collector = record.COMPILE
    if collector is None:
        return
    collector.reset()
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        # A multiprocessing child leaves through os._exit: exit handlers never run there,
        # its own finalizers do. Registered after the child clears the parent's (Process.
        # _bootstrap runs the after-fork callbacks after that).
        mp_util.register_after_fork(collector, lambda c: mp_util.Finalize(
            None, c.write, exitpriority=0))


def arm() -> Optional[Collector]:
    """Start collecting, register the exit handler (once per process); the collector."""
    template = os.environ.get(ENV, "").strip()
    if not template:
        return None
    with _lock:
        if record.COMPILE is not None:
            return record.COMPILE
        collector = Collector(template)
        record.COMPILE = collector
    os.environ.setdefault(_CLAIM, f"{os.getpid()} {collector.path()}")
    atexit.register(collector.write)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    return collector
