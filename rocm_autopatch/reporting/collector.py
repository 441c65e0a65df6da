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

import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from rocm_autopatch import frames, log, patching, settings, torch_releases
from rocm_autopatch.reporting import breaks

ENV = settings.REPORT

_lock = threading.Lock()
_reasons = threading.local()  # what it returned in this thread's compile


def _all_reasons() -> str:
    found = getattr(_reasons, "found", None)
    _reasons.found = None
    if isinstance(found, str):
        return found
    if isinstance(found, (list, tuple)):
        return "\n".join(str(r) for r in found if r)
    return ""


# ---- the collector -----------------------------------------------------------------------

class Collector:
    """Per-process compile statistics, fed by torch's logs and the compile-frame hook."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.lock = _lock  # the counts' lock (the document reads them under it)
        self.listener = breaks.Listener(self.graph_break)
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
        self.slow: List[Dict[str, Any]] = []  # the watchdog's warnings: where, seconds, compile
        self.compiles = 0
        self.seconds = 0.0
        self.baseline = self.counter_values()
        self._skip_existing_metrics()

    def counter_values(self) -> Dict[str, int]:
        counters = torch_releases.counters()
        if counters is None:
            return {}
        return {f"{group}.{key}": int(counters[group][key])
                for group in ("stats", "inductor", "aot_autograd") if group in counters
                for key in list(counters[group])}

    def _skip_existing_metrics(self) -> None:
        metrics = torch_releases.compilation_metrics()
        self.metrics_kept = list(metrics) if metrics is not None else []
        self.metrics_seen = {id(m) for m in self.metrics_kept}
        self.metrics_before = len(self.metrics_kept)  # entries of compiles before arming

    def seconds_saved(self) -> Optional[float]:
        """What the caches saved this process, as torch counts it: for each entry it loaded,
        the time its original compile took (CompilationMetrics.distributed_ephemeral_timeout_us,
        which torch/_inductor/codecache.py adds up from each FX-graph cache hit's
        _time_taken_ns, torch >= 2.6); None where this torch does not record it."""
        if not torch_releases.metrics_record("distributed_ephemeral_timeout_us"):
            return None
        return round(sum(getattr(m, "distributed_ephemeral_timeout_us", None) or 0
                         for m in self.metrics_kept[self.metrics_before:]) / 1e6, 3)

    def listen(self) -> None:
        """Attach to torch's graph-break loggers that exist now (idempotent)."""
        for logger in torch_releases.artifact_loggers("graph_breaks"):
            if logger.name in self.listening:
                continue
            self.listening.add(logger.name)
            if not logger.isEnabledFor(logging.DEBUG):  # TORCH_LOGS does not print them
                logger.setLevel(logging.DEBUG)
                logger.propagate = False  # so torch's handlers print nothing new
            logger.addHandler(self.listener)

    # ---- fed by torch's log and the compile-frame hook ---------------------------------

    def graph_break(self, message: str, error: Optional[BaseException] = None) -> None:
        found = breaks.parse_break(message, error)
        compile_id = torch_releases.compile_id()
        key = (f"{found['file']}:{found['line']}", found["reason"])
        with _lock:
            slot = self.breaks.setdefault(key, {**found, "count": 0, "compile_ids": []})
            slot["count"] += 1
            if compile_id and compile_id not in slot["compile_ids"]:
                slot["compile_ids"].append(compile_id)

    def slow_compile(self, warned: Dict[str, Any]) -> None:
        """The compile watchdog warned about a compile (where, seconds, compile #)."""
        with _lock:
            self.slow.append(dict(warned))

    def watch(self, convert_frame: Any) -> None:
        """Every guard failure of a recompile, as ``TORCH_LOGS=recompiles`` prints them:
        the list torch's ``get_and_maybe_log_recompilation_reasons`` returns, one reason per
        cache entry. torch's CompilationMetrics keep only the first (``reasons[0]`` in
        ``torch/_dynamo/convert_frame.py``), which loses a guard such as ``input_ids``'s."""
        for name in torch_releases.RECOMPILE_REASONS:
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
        bound = torch_releases.compile_arguments(args, kwargs)
        return torch_releases.is_recompilation(bound), str(bound.get("compile_id") or "")

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
        newest = self.newest_forward_metrics()
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
                known = torch_releases.metrics_record("recompile_reason")
                text = (breaks.clip(reason) if reason else "not stated by torch" if known else
                        "unknown: this torch does not record recompile reasons")
                key = (where, text)
                self.recompiles[key] = self.recompiles.get(key, 0) + 1
            if error is not None:
                if torch_releases.hit_recompile_limit(error):
                    self.limit_hits[where] = self.limit_hits.get(where, 0) + 1
                else:
                    key = (where, _failure(error))
                    self.failures[key] = self.failures.get(key, 0) + 1

    def newest_forward_metrics(self) -> Any:
        """The metrics entry torch recorded for the compile that just ended (if new), after
        taking in the backward compiles recorded since the last look."""
        metrics = torch_releases.compilation_metrics()
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


def _failure(error: BaseException) -> str:
    """A failed compile as torch states it, with its cause (BackendCompilerFailed keeps
    only "backend=... raised:" in its first line)."""
    text = f"{type(error).__name__}: {breaks.clip(error, 600)}"
    cause = getattr(error, "inner_exception", None) or error.__cause__
    if cause is not None and str(cause).strip() not in text:
        text += f" (cause: {type(cause).__name__}: {breaks.clip(cause, 400)})"
    return text


