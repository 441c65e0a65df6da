"""The compile report's document, made from a collector's counts at exit and written: the
process, the record behind ``report()``, the ``compile`` section (with what this torch does
not count, and why) and the one summary line. Fields as ``schema`` declares them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from rocm_autopatch import log, record, settings, torch_releases
from rocm_autopatch.reporting import placement, schema
from rocm_autopatch.reporting.collector import Collector

TOP = 10  # entries kept per list (graph breaks, recompiles, slowest frames)
# Torch's counters of its caches: (group, key, the module that counts it).
CACHE_COUNTERS = {
    "fxgraph_hit": ("inductor", "fxgraph_cache_hit", "torch._inductor.codecache"),
    "fxgraph_miss": ("inductor", "fxgraph_cache_miss", "torch._inductor.codecache"),
    "aot_autograd_hit": ("aot_autograd", "autograd_cache_hit",
                         "torch._functorch._aot_autograd.autograd_cache"),
    "aot_autograd_miss": ("aot_autograd", "autograd_cache_miss",
                          "torch._functorch._aot_autograd.autograd_cache"),
}


def build(col: Collector) -> Dict[str, Any]:
    """The whole file: the schema, the process, ``report()``'s record, the compile section."""
    with record.LOCK:
        data = record.REPORT.to_dict()
    return {
        "schema": schema.SCHEMA,
        "process": {"pid": os.getpid(), "rank": placement.rank(),
                    "forked_from": placement.parent_in_run(),
                    "local_rank": _number(settings.LOCAL_RANK),
                    "world_size": _number(settings.WORLD_SIZE),
                    "host": os.uname().nodename, "argv": list(sys.argv),
                    "python": sys.version.split()[0],
                    "started": round(col.started, 3), "written": round(time.time(), 3)},
        **data,
        "compile": compile_section(col),
    }


def compile_section(col: Collector) -> Dict[str, Any]:
    """Counts since the report was armed; ``unknown``: what this torch does not count."""
    unknown: Dict[str, str] = {}
    now = col.counter_values()

    def counted(group: str, key: str, needs: str) -> Optional[int]:
        if torch_releases.counters() is None:
            unknown[f"{group}.{key}"] = "torch._dynamo was not imported"
            return None
        if needs and needs not in sys.modules:
            unknown[f"{group}.{key}"] = f"{needs} not loaded: not in this torch, or not used"
            return None
        name = f"{group}.{key}"
        return now.get(name, 0) - col.baseline.get(name, 0)

    with col.lock:
        col.newest_forward_metrics()
        if (torch_releases.compilation_metrics() is not None
                and not torch_releases.metrics_record("is_forward")):
            unknown["backward"] = "this torch does not record backward compiles apart"
        section = {"frames": col.compiles, "graphs": counted("stats", "unique_graphs", ""),
                   **_compiles(col)}
    with record.LOCK:
        eager = dict(record.REPORT.eager_in_capture)
    section["eager_in_capture"] = {"total": sum(eager.values()), "frames": eager}
    with col.lock:
        section["watchdog_warnings"] = list(col.slow)
    section["cache"] = {name: counted(*where) for name, where in CACHE_COUNTERS.items()}
    section["cache"]["seconds_saved"] = col.seconds_saved()
    if section["cache"]["seconds_saved"] is None:
        unknown["cache.seconds_saved"] = ("this torch does not record the compile time "
                                          "of the cache entries it loads")
    if not col.listening:
        unknown["graph_breaks"] = "torch's graph_breaks log was not found: not counted"
    section["unknown"] = unknown
    return section


def _compiles(col: Collector) -> Dict[str, Any]:
    """Seconds, backward compiles, graph breaks, recompiles, failures, the slowest frames."""
    backward_seconds = sum(b["seconds"] for b in col.backward.values())
    breaks = sorted(col.breaks.values(), key=lambda b: -b["count"])
    recompiles = sorted(col.recompiles.items(), key=lambda kv: -kv[1])
    return {
        "seconds": round(col.seconds + backward_seconds, 3),
        "forward_seconds": round(col.seconds, 3),
        "backward": {"compiles": sum(b["compiles"] for b in col.backward.values()),
                     "seconds": round(backward_seconds, 3),
                     "frames": [{**b, "seconds": round(b["seconds"], 3)}
                                for b in col.backward.values()]},
        "graph_breaks": {
            "total": sum(b["count"] for b in col.breaks.values()),
            "top": [{**b, "where": f"{b['file']}:{b['line']}"} for b in breaks[:TOP]],
        },
        "recompiles": {
            "total": sum(col.recompiles.values()),
            "top": [{"where": w, "reason": r, "count": n} for (w, r), n in recompiles[:TOP]],
        },
        "recompile_limit_hit": [{"where": w, "count": n}
                                for w, n in sorted(col.limit_hits.items())],
        "failed": [{"where": w, "error": e, "count": n}
                   for (w, e), n in sorted(col.failures.items())],
        "slowest_frames": _slowest(col),
    }


def _slowest(col: Collector) -> List[Dict[str, Any]]:
    """The frames that took longest to compile, their backward compiles included (AOT
    autograd compiles a frame's backward at its first ``backward()``)."""
    rows = []
    for f in col.frames.values():
        back = col.backward.get(f["where"], {}).get("seconds", 0.0)
        rows.append({**f, "seconds": round(f["seconds"] + back, 3),
                     "forward_seconds": round(f["seconds"], 3),
                     "backward_seconds": round(back, 3),
                     "max_seconds": round(f["max_seconds"], 3)})
    return sorted(rows, key=lambda f: -f["seconds"])[:TOP]


def summary(doc: Dict[str, Any], path: str) -> str:
    """The one line said at exit (``ROCM_AUTOPATCH_LOG=info``, rank 0)."""
    c = doc["compile"]
    totals = (doc.get("verify") or {}).get("totals")
    numerics = (f"; numerics: {totals['passed']} passed, "
                f"{totals['failed'] + totals['fell back']} wrong") if totals else ""
    return (f"compile: {c['graphs'] if c['graphs'] is not None else '?'} graphs, "
            f"{c['graph_breaks']['total']} graph breaks, "
            f"{c['recompiles']['total']} recompiles, {c['seconds']:.1f} s compiling"
            f"{numerics}; report: {path} (`rocm-autopatch doctor --report` renders it)")


def _number(name: str) -> Optional[str]:
    found = log.setting(name)
    return None if found is None else str(found)


# What a concern must finish before the report is written (the sentinel's verdicts still
# pending): registered by the concern, run first by ``write``, each bounded by its owner.
BEFORE_WRITE: List[Callable[[], None]] = []


def before_write(fn: Callable[[], None]) -> None:
    """Run ``fn`` before the report is written (once per function)."""
    if fn not in BEFORE_WRITE:
        BEFORE_WRITE.append(fn)


def write(col: Collector) -> None:
    """The exit handler: write ``col``'s file once per process; never raises."""
    if col.written and col.pid == os.getpid():
        return
    col.written = True
    for fn in list(BEFORE_WRITE):
        try:
            fn()
        except Exception:  # noqa: BLE001 - never at exit
            pass
    if col.compiles == 0 and not col.backward:
        return  # compiled nothing (a launcher, a data worker): no file
    path = "?"
    try:
        path = placement.path(col.template)
        doc = build(col)
        path = placement.place(path, json.dumps(doc, indent=1, default=repr), col.started)
    except Exception as exc:  # noqa: BLE001 - never at exit
        try:
            log.warn_once(("compile_report", "write"),
                          f"{settings.REPORT}={col.template!r}: cannot write the compile "
                          f"report to {path}: {getattr(exc, 'strerror', None) or exc}; "
                          "nothing written (give a writable path to a regular file, e.g. "
                          "/tmp/report-{rank}.json)")
        except Exception:  # noqa: BLE001
            pass
        return
    try:
        log.summary(summary(doc, path))
    except Exception:  # noqa: BLE001
        pass
