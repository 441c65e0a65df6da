"""The compile report: what torch.compile did in this process, written as JSON at exit.

``ROCM_AUTOPATCH_REPORT=PATH`` arms it (``{rank}`` and ``{pid}`` in PATH are replaced; a
relative PATH is resolved when rocm-autopatch activates, so a program that changes
directory does not move it). Only then is this module loaded, an exit handler registered
and anything counted. Every number comes from the events torch itself logs, read where the
running release has them:

- graph breaks: the records torch writes to its ``graph_breaks`` log (what
  ``TORCH_LOGS=graph_breaks`` prints: one per break, "Graph break in user code at
  FILE:LINE", the reason, its explanation and hints). A handler of ours listens on those
  loggers; where torch does not print them (``TORCH_LOGS`` unset) their propagation stays
  off, so nothing more is printed;
- recompiles: a frame compile that torch itself calls a recompilation
  (``is_recompilation(cache_size) and frame`` in ``torch/_dynamo/convert_frame.py``
  ``_compile``: what ``TORCH_LOGS=recompiles`` logs as "Recompiling function ..."), with
  every guard failure torch states (``CompilationMetrics.recompile_reason``, 2.9+);
- the recompile limit: the error leaving ``_compile`` when a frame passes it, by type or by
  torch's message (it differs per release);
- backward compiles: the ``CompilationMetrics`` entries torch records with
  ``is_forward=False`` (AOT autograd compiles the backward lazily, at the first
  ``backward()``), counted with their compile time;
- graphs and caches: ``torch._dynamo.utils.counters`` (``stats.unique_graphs``, Inductor's FX
  graph cache, AOT autograd's cache), counted from when the report was armed or the process
  forked: a forked child reports its own work, not its parent's.

The file holds everything ``rocm_autopatch.report()`` has plus a ``compile`` section and the
process's identity. A process that compiled nothing writes none. A child process (fork,
forkserver, spawn, a subprocess) writes its own: where PATH would give it the same name as
the process that armed the report first, ``.<pid>`` goes before the extension. The file is
written atomically over a regular file or a new path only (never over a device, a FIFO or a
symlink), never raises and never changes the exit status; a failure gives one warning and
leaves no temporary file behind.
"""

from __future__ import annotations

import atexit
import inspect
import json
import logging
import os
import re
import stat
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from rocm_autopatch import files, frames, log, patching
from rocm_autopatch.config import settings
from rocm_autopatch.guards import compile_frame
from rocm_autopatch.reporting import record, schema

ENV = settings.REPORT
SCHEMA = schema.SCHEMA
TOP = 10  # entries kept per list (graph breaks, recompiles, slowest frames)
# "<pid> <path>" of the first process that armed the report, inherited by its children.
_CLAIM = settings.REPORT_CLAIM
LIMIT_ERRORS = ("RecompileLimitExceeded", "CacheLimitExceeded")
LIMIT_MESSAGE = re.compile(r"(cache|recompile)[\w ]*limit (reached|exceeded)", re.IGNORECASE)
TEXT_LIMIT = 2000  # characters kept of a reason torch states
# torch's graph-break record: "Graph break in user code at FILE:LINE" (also "Graph break
# (user stack suppressed due to duplicate graph break) in user code at FILE:LINE").
_BREAK_AT = re.compile(r"[Gg]raph break.*? in user code at (.+?):(\d+)\s*$", re.MULTILINE)
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')

_lock = threading.Lock()
# torch's function that finds a recompile's guard failures (its name per release).
RECOMPILE_REASONS = ("get_and_maybe_log_recompilation_reasons",
                     "get_and_maybe_log_recompilation_reason")
_reasons = threading.local()  # what it returned in this thread's compile


def _all_reasons() -> str:
    found = getattr(_reasons, "found", None)
    _reasons.found = None
    if isinstance(found, str):
        return found
    if isinstance(found, (list, tuple)):
        return "\n".join(str(r) for r in found if r)
    return ""


def _lines(text: Any, limit: int = TEXT_LIMIT) -> str:
    return str(text).strip()[:limit]


def _torch_utils() -> Any:
    return sys.modules.get("torch._dynamo.utils")


def _counters() -> Any:
    return getattr(_torch_utils(), "counters", None)


def _metrics() -> Any:
    found = getattr(_torch_utils(), "_compilation_metrics", None)
    return found if hasattr(found, "__iter__") and hasattr(found, "__len__") else None


def rank() -> Optional[str]:
    """This process's rank as the report writes it (digits only: a value that is not a
    rank is warned about, naming its variable, and the report is named by pid)."""
    found = log.rank()
    return None if found is None else str(found)


def _number(name: str) -> Optional[str]:
    found = log.setting(name)
    return None if found is None else str(found)


# ---- graph breaks, as torch logs them ----------------------------------------------------

def parse_break(message: str, error: Optional[BaseException] = None) -> Dict[str, Any]:
    """One record of torch's ``graph_breaks`` log -> where, reason, explanation, hints.
    ``error``: the exception the record carries (torch < 2.5 logs "Graph break: from user
    code at:" and the user stack, with the reason only in the record's ``exc_info``)."""
    where = _BREAK_AT.search(message)
    if where:
        file, line = where.group(1), int(where.group(2))
    else:  # older wording: the innermost user frame of the stack it prints
        frames = _FILE_LINE.findall(message)
        file, line = (frames[-1][0], int(frames[-1][1])) if frames else ("<unknown>", 0)
    body = message.split("Graph Break Reason:", 1)[1] if "Graph Break Reason:" in message \
        else message
    body = body.split("User code traceback:", 1)[0]
    lines = [raw.strip() for raw in body.splitlines() if raw.strip()]
    titles = [ln for ln in lines if not ln.startswith(("Explanation:", "Hint:", "Developer",
                                                       "For more details", "Graph break"))]
    if len(titles) > 1 and titles[0].startswith("Encountered graph break when attempting"):
        titles = titles[1:]  # torch's generic prefix; the next line names the break
    if error is not None and "Reason:" not in message:
        said = (str(error).strip().splitlines() or [""])[0]
        titles = [f"{type(error).__name__}: {said}".rstrip(": ")]
    return {
        "file": file, "line": line,
        "reason": _lines(titles[0] if titles else "not stated by torch", 300),
        "explanation": _lines(next((ln[len("Explanation:"):].strip() for ln in lines
                                    if ln.startswith("Explanation:")), ""), 600),
        "hints": [_lines(ln[len("Hint:"):].strip(), 400) for ln in lines
                  if ln.startswith("Hint:")][:4],
    }


class _BreakListener(logging.Handler):
    """Receives torch's graph-break records (a handler on its artifact loggers)."""

    def __init__(self, collector: Collector) -> None:
        super().__init__(logging.DEBUG)
        self.collector = collector

    def emit(self, record_: logging.LogRecord) -> None:
        try:
            error = record_.exc_info[1] if record_.exc_info else None
            self.collector.graph_break(record_.getMessage(), error)
        except Exception:  # noqa: BLE001 - counting must never break tracing
            pass


def _artifact_loggers(suffix: str) -> List[logging.Logger]:
    """torch's loggers of one artifact (``graph_breaks``: several modules log it)."""
    internal = sys.modules.get("torch._logging._internal")
    registry = getattr(internal, "log_registry", None)
    names = getattr(registry, "get_artifact_log_qnames", lambda: ())()
    return [logging.getLogger(n) for n in sorted(names) if n.endswith(f".__{suffix}")]


# ---- the collector -----------------------------------------------------------------------

class Collector:
    """Per-process compile statistics, fed by torch's logs and the compile-frame hook."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.listener = _BreakListener(self)
        self.listening: set = set()
        self.reset()

    def reset(self) -> None:
        """A fresh record: at arming, and in a forked child (it reports its own compiles)."""
        self.pid = os.getpid()
        self.started = time.time()
        self.written = False
        self.frames: Dict[str, Dict[str, Any]] = {}
        self.compile_ids: Dict[str, str] = {}  # torch's compile id "0/1" -> frame label
        self.breaks: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self.recompiles: Dict[Tuple[str, str], int] = {}
        self.limit_hits: Dict[str, int] = {}
        self.failures: Dict[Tuple[str, str], int] = {}
        self.backward: Dict[str, Dict[str, Any]] = {}
        self.compiles = 0
        self.seconds = 0.0
        self.baseline = self._counter_values()
        self._skip_existing_metrics()

    def _counter_values(self) -> Dict[str, int]:
        counters = _counters()
        if counters is None:
            return {}
        return {f"{group}.{key}": int(counters[group][key])
                for group in ("stats", "inductor", "aot_autograd") if group in counters
                for key in list(counters[group])}

    def _skip_existing_metrics(self) -> None:
        metrics = _metrics()
        self.metrics_kept = list(metrics) if metrics is not None else []
        self.metrics_seen = {id(m) for m in self.metrics_kept}
        self.metrics_before = len(self.metrics_kept)  # entries of compiles before arming

    def seconds_saved(self) -> Optional[float]:
        """What the caches saved this process, as torch counts it: for each entry it loaded,
        the time its original compile took (CompilationMetrics.distributed_ephemeral_timeout_us,
        which torch/_inductor/codecache.py adds up from each FX-graph cache hit's
        _time_taken_ns, torch >= 2.6); None where this torch does not record it."""
        if not hasattr(getattr(_torch_utils(), "CompilationMetrics", None),
                       "distributed_ephemeral_timeout_us"):
            return None
        return round(sum(getattr(m, "distributed_ephemeral_timeout_us", None) or 0
                         for m in self.metrics_kept[self.metrics_before:]) / 1e6, 3)

    def listen(self) -> None:
        """Attach to torch's graph-break loggers that exist now (idempotent)."""
        for logger in _artifact_loggers("graph_breaks"):
            if logger.name in self.listening:
                continue
            self.listening.add(logger.name)
            if not logger.isEnabledFor(logging.DEBUG):  # TORCH_LOGS does not print them
                logger.setLevel(logging.DEBUG)
                logger.propagate = False  # so torch's handlers print nothing new
            logger.addHandler(self.listener)

    # ---- fed by torch's log and the compile-frame hook ---------------------------------

    def graph_break(self, message: str, error: Optional[BaseException] = None) -> None:
        found = parse_break(message, error)
        compile_id = compile_frame.compile_id()
        key = (f"{found['file']}:{found['line']}", found["reason"])
        with _lock:
            slot = self.breaks.setdefault(key, {**found, "count": 0, "compile_ids": []})
            slot["count"] += 1
            if compile_id and compile_id not in slot["compile_ids"]:
                slot["compile_ids"].append(compile_id)

    def watch(self, convert_frame: Any) -> None:
        """Every guard failure of a recompile, as ``TORCH_LOGS=recompiles`` prints them:
        the list torch's ``get_and_maybe_log_recompilation_reasons`` returns, one reason per
        cache entry. torch's CompilationMetrics keep only the first (``reasons[0]`` in
        ``torch/_dynamo/convert_frame.py``), which loses a guard such as ``input_ids``'s."""
        for name in RECOMPILE_REASONS:
            def make(original: Any) -> Any:
                def reasons(*args: Any, **kwargs: Any) -> Any:
                    found = original(*args, **kwargs)
                    _reasons.found = found
                    return found
                return reasons
            if patching.wrap(convert_frame, name, make) is not None:
                return

    def begin(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[bool, str]:
        """(torch calls this compile a recompilation, its compile id)."""
        self.listen()
        _reasons.found = None
        bound = _bind(args, kwargs)
        compile_id = str(bound.get("compile_id") or "")
        again = False
        cache_size = bound.get("cache_size")
        check = getattr(sys.modules.get("torch._dynamo.cache_size"), "is_recompilation", None)
        if cache_size is not None and callable(check):
            try:
                again = bool(check(cache_size)) and bound.get("frame") is not None
            except Exception:  # noqa: BLE001
                again = False
        return again, compile_id

    def end(self, where: Tuple[str, int, str], token: Tuple[bool, str], seconds: float,
            error: Optional[BaseException]) -> None:
        try:
            self._end(frames.label(*where), token, seconds, error)
        except Exception as exc:  # noqa: BLE001 - counting must never break a compile
            log.warn_once(("compile_report", "count"), f"compile report: counting failed: "
                          f"{exc!r}; the report will be incomplete")

    def _end(self, where: str, token: Tuple[bool, str], seconds: float,
             error: Optional[BaseException]) -> None:
        again, compile_id = token
        newest = self._newest_forward_metrics()
        with _lock:
            self.compiles += 1
            self.seconds += seconds
            if compile_id:
                self.compile_ids[compile_id] = where
            frame = self.frames.setdefault(where, {"where": where, "compiles": 0,
                                                   "seconds": 0.0, "max_seconds": 0.0})
            frame["compiles"] += 1
            frame["seconds"] += seconds
            frame["max_seconds"] = max(frame["max_seconds"], seconds)
            if again:
                reason = _all_reasons() or getattr(newest, "recompile_reason", None)
                known = hasattr(getattr(_torch_utils(), "CompilationMetrics", None),
                                "recompile_reason")
                text = (_lines(reason) if reason else "not stated by torch" if known else
                        "unknown: this torch does not record recompile reasons")
                key = (where, text)
                self.recompiles[key] = self.recompiles.get(key, 0) + 1
            if error is not None:
                if type(error).__name__ in LIMIT_ERRORS or LIMIT_MESSAGE.search(str(error)):
                    self.limit_hits[where] = self.limit_hits.get(where, 0) + 1
                else:
                    key = (where, _failure(error))
                    self.failures[key] = self.failures.get(key, 0) + 1

    def _newest_forward_metrics(self) -> Any:
        """The metrics entry torch recorded for the compile that just ended (if new), after
        taking in the backward compiles recorded since the last look."""
        metrics = _metrics()
        if metrics is None:
            return None
        newest = None
        for entry in list(metrics):
            if id(entry) in self.metrics_seen:
                continue
            self.metrics_seen.add(id(entry))
            self.metrics_kept.append(entry)  # kept alive: its id is never reused
            if getattr(entry, "is_forward", True) is False:
                self._backward(entry)
            else:
                newest = entry
        return newest

    def _backward(self, entry: Any) -> None:
        seconds = next((float(v) for v in (getattr(entry, name, None) for name in (
            "entire_frame_compile_time_s", "backend_compile_time_s",
            "inductor_compile_time_s")) if v is not None), 0.0)
        compile_id = str(getattr(entry, "compile_id", "") or "")
        where = self.compile_ids.get(compile_id, f"compile {compile_id or '?'}")
        slot = self.backward.setdefault(where, {"where": where, "compiles": 0, "seconds": 0.0})
        slot["compiles"] += 1
        slot["seconds"] += seconds

    # ---- at exit --------------------------------------------------------------------

    def compile_section(self) -> Dict[str, Any]:
        unknown: Dict[str, str] = {}
        now = self._counter_values()

        def counted(group: str, key: str, needs: str) -> Optional[int]:
            if _counters() is None:
                unknown[f"{group}.{key}"] = "torch._dynamo was not imported"
                return None
            if needs and needs not in sys.modules:
                unknown[f"{group}.{key}"] = f"{needs} not loaded: not in this torch, or not used"
                return None
            name = f"{group}.{key}"
            return now.get(name, 0) - self.baseline.get(name, 0)

        with _lock:
            self._newest_forward_metrics()
            if _metrics() is not None and not hasattr(
                    getattr(_torch_utils(), "CompilationMetrics", None), "is_forward"):
                unknown["backward"] = "this torch does not record backward compiles apart"
            backward_seconds = sum(b["seconds"] for b in self.backward.values())
            breaks = sorted(self.breaks.values(), key=lambda b: -b["count"])
            recompiles = sorted(self.recompiles.items(), key=lambda kv: -kv[1])
            section = {
                "frames": self.compiles,
                "graphs": counted("stats", "unique_graphs", ""),
                "seconds": round(self.seconds + backward_seconds, 3),
                "forward_seconds": round(self.seconds, 3),
                "backward": {"compiles": sum(b["compiles"] for b in self.backward.values()),
                             "seconds": round(backward_seconds, 3),
                             "frames": [{**b, "seconds": round(b["seconds"], 3)}
                                        for b in self.backward.values()]},
                "graph_breaks": {
                    "total": sum(b["count"] for b in self.breaks.values()),
                    "top": [{**b, "where": f"{b['file']}:{b['line']}"} for b in breaks[:TOP]],
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
                "slowest_frames": self._slowest(),
            }
        with record.LOCK:
            eager = dict(record.REPORT.eager_in_capture)
        section["eager_in_capture"] = {"total": sum(eager.values()), "frames": eager}
        from rocm_autopatch.guards import watchdog

        section["watchdog_warnings"] = list(watchdog.fired)
        section["cache"] = {
            "fxgraph_hit": counted("inductor", "fxgraph_cache_hit", "torch._inductor.codecache"),
            "fxgraph_miss": counted("inductor", "fxgraph_cache_miss",
                                    "torch._inductor.codecache"),
            "aot_autograd_hit": counted("aot_autograd", "autograd_cache_hit",
                                        "torch._functorch._aot_autograd.autograd_cache"),
            "aot_autograd_miss": counted("aot_autograd", "autograd_cache_miss",
                                         "torch._functorch._aot_autograd.autograd_cache"),
            "seconds_saved": self.seconds_saved(),
        }
        if section["cache"]["seconds_saved"] is None:
            unknown["cache.seconds_saved"] = ("this torch does not record the compile time "
                                              "of the cache entries it loads")
        if not self.listening:
            unknown["graph_breaks"] = "torch's graph_breaks log was not found: not counted"
        section["unknown"] = unknown
        return section

    def _slowest(self) -> List[Dict[str, Any]]:
        """The frames that took longest to compile, their backward compiles included (AOT
        autograd compiles a frame's backward at its first ``backward()``)."""
        rows = []
        for f in self.frames.values():
            back = self.backward.get(f["where"], {}).get("seconds", 0.0)
            rows.append({**f, "seconds": round(f["seconds"] + back, 3),
                         "forward_seconds": round(f["seconds"], 3),
                         "backward_seconds": round(back, 3),
                         "max_seconds": round(f["max_seconds"], 3)})
        return sorted(rows, key=lambda f: -f["seconds"])[:TOP]

    def path(self) -> str:
        """Where this process writes: the template's path, or ``.<pid>`` before its
        extension where a parent process of this run armed the same path first."""
        pid = str(os.getpid())
        path = self.template.replace("{rank}", rank() or pid).replace("{pid}", pid)
        claimer, _, claimed = (settings.raw(_CLAIM) or "").partition(" ")
        if claimer and claimer != pid and claimed == path:  # a child would take its name
            path = _beside(path, pid)
        return path

    def place(self, path: str, text: str) -> str:
        """Write ``text`` to ``path``, unless another process wrote ``path`` while this one
        ran (a parent that imported torch after forking this child, two processes that
        srun or a shell started with one path): then beside it, ``.<pid>``, and one
        warning names both writers. Serialised per directory (``flock``), so that two
        writers never both decide the path is free. The path where it went."""
        with files.directory_lock(os.path.dirname(path) or "."):
            other = _writer_during(path, _process_start() or self.started)
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

    def document(self) -> Dict[str, Any]:
        with record.LOCK:
            data = record.REPORT.to_dict()
        return {
            "schema": SCHEMA,
            "process": {"pid": os.getpid(), "rank": rank(), "forked_from": _parent_in_run(),
                        "local_rank": _number(settings.LOCAL_RANK),
                        "world_size": _number(settings.WORLD_SIZE),
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
        if self.compiles == 0 and not self.backward:
            return  # compiled nothing (a launcher, a data worker): no file
        path = "?"
        try:
            path = self.path()
            document = self.document()
            path = self.place(path, json.dumps(document, indent=1, default=repr))
        except Exception as exc:  # noqa: BLE001 - never at exit
            try:
                log.warn_once(("compile_report", "write"),
                              f"{ENV}={self.template!r}: cannot write the compile report to "
                              f"{path}: {getattr(exc, 'strerror', None) or exc}; nothing "
                              "written (give a writable path to a regular file, e.g. "
                              "/tmp/report-{rank}.json)")
            except Exception:  # noqa: BLE001
                pass
            return
        try:
            c = document["compile"]
            verify = document.get("verify") or {}
            numerics = ""
            if verify.get("totals"):
                t = verify["totals"]
                numerics = (f"; numerics: {t['passed']} passed, "
                            f"{t['failed'] + t['fell back']} wrong")
            log.summary(f"compile: {c['graphs'] if c['graphs'] is not None else '?'} graphs, "
                        f"{c['graph_breaks']['total']} graph breaks, "
                        f"{c['recompiles']['total']} recompiles, {c['seconds']:.1f} s compiling"
                        f"{numerics}; report: {path} (`rocm-autopatch doctor --report` "
                        "renders it)")
        except Exception:  # noqa: BLE001
            pass


def _parent_in_run() -> Optional[int]:
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


def _failure(error: BaseException) -> str:
    """A failed compile as torch states it, with its cause (BackendCompilerFailed keeps
    only "backend=... raised:" in its first line)."""
    text = f"{type(error).__name__}: {_lines(error, 600)}"
    cause = getattr(error, "inner_exception", None) or error.__cause__
    if cause is not None and str(cause).strip() not in text:
        text += f" (cause: {type(cause).__name__}: {_lines(cause, 400)})"
    return text


_signature: Dict[int, Any] = {}


def _bind(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``_compile``'s arguments by name (their positions differ per release)."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    original = getattr(getattr(convert_frame, "_compile", None), "__wrapped__", None)
    if original is None:
        return dict(kwargs)
    key = id(original)
    if key not in _signature:
        try:
            _signature[key] = inspect.signature(original)
        except (TypeError, ValueError):
            _signature[key] = None
    sig = _signature[key]
    if sig is None:
        return dict(kwargs)
    try:
        return dict(sig.bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return dict(kwargs)


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
    sys.modules["multiprocessing.util"].Finalize(None, collector.write, exitpriority=0)


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
    settings.export(_CLAIM, f"{os.getpid()} {collector.path()}", keep=True)
    atexit.register(collector.write)
    _write_at_multiprocessing_exit(collector)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    return collector
