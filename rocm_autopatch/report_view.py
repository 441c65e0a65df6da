"""``rocm-autopatch doctor --report FILE...``: one or many compile reports as one job view.

Reads the JSON files that ``ROCM_AUTOPATCH_REPORT`` wrote (one per process: every rank of a
torchrun or Slurm job) and shows per-process totals, the graph breaks and recompile reasons
that recur across processes, the slowest frames, and the red flags: frames that hit the
recompile limit (torch then stops compiling them and runs them eagerly for good), failed
start-up hooks. A value a torch release does not count stays unknown ("?"), never zero.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Sequence, Tuple

from rocm_autopatch import compile_report, verify
from rocm_autopatch.text import Verbatim, keep


class ReportError(Exception):
    """A file that is not a readable compile report."""


def load(paths: Sequence[str]) -> List[Dict[str, Any]]:
    reports = []
    for path in paths:
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise ReportError(f"{path}: not a readable compile report ({exc})") from None
        if not isinstance(data, dict) or "compile" not in data or "process" not in data:
            raise ReportError(f"{path}: not a compile report (written with "
                              f"{compile_report.ENV}=PATH)")
        data["_file"] = path
        reports.append(data)
    return sorted(reports, key=_order)


def _order(report: Dict[str, Any]) -> Tuple[int, str, int]:
    rank = report["process"].get("rank")
    number = int(rank) if isinstance(rank, str) and rank.isdigit() else 1 << 30
    return number, report["process"].get("host", ""), report["process"]["pid"]


def _who(rank: Any, pid: Any) -> str:
    return f"rank {rank}" if rank is not None else f"pid {pid}"


def _label(report: Dict[str, Any]) -> str:
    return _who(report["process"].get("rank"), report["process"]["pid"])


def _recurring(reports: List[Dict[str, Any]], section: str, fields: Tuple[str, str]
               ) -> List[Dict[str, Any]]:
    """Entries of ``compile[section]["top"]`` merged across processes."""
    merged: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for report in reports:
        for entry in report["compile"][section]["top"]:
            key = (entry[fields[0]], entry[fields[1]])
            slot = merged.setdefault(key, {fields[0]: key[0], fields[1]: key[1], "count": 0,
                                           "processes": []})
            slot["count"] += entry["count"]
            slot["processes"].append(_label(report))
    return sorted(merged.values(), key=lambda e: (-len(e["processes"]), -e["count"]))


def red_flags(reports: List[Dict[str, Any]], mark: Callable[[str], str] = str) -> List[str]:
    """One line per red flag; ``mark`` wraps the spans a reader copies or searches for
    (``text.keep`` when rendering, so wrapping never splits them)."""
    flags = []
    for report in reports:
        for hit in report["compile"]["recompile_limit_hit"]:
            flags.append(f"{_label(report)}: {mark(hit['where'])} "
                         f"{mark('hit the recompile limit')} x{hit['count']}: torch runs "
                         "it eagerly from then on (raise "
                         "torch._dynamo.config.recompile_limit, or dynamic=True for "
                         "changing shapes)")
        for error in report.get("errors", []):
            flags.append(f"{_label(report)}: rocm-autopatch hook failed: {error}")
        for graph in (report.get("verify") or {}).get("graphs", []):
            if graph.get("status") in (verify.FAILED, verify.FELL_BACK):
                flags.append(f"{_label(report)}: graph {graph['graph']} of "
                             f"{mark(graph['where'])} {mark('computes wrong numbers')} when "
                             f"compiled ({graph['status']}): {graph['reason']}")
    return flags


def job(reports: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The job view as data (``--json``)."""
    processes = []
    for report in reports:
        c = report["compile"]
        processes.append({
            "file": report["_file"], "rank": report["process"].get("rank"),
            "pid": report["process"]["pid"], "host": report["process"].get("host"),
            "torch": report.get("torch_version"), "profile": report.get("profile"),
            "active": report.get("active"), "frames": c["frames"], "graphs": c["graphs"],
            "graph_breaks": c["graph_breaks"]["total"], "recompiles": c["recompiles"]["total"],
            "seconds": c["seconds"], "eager_in_capture": c["eager_in_capture"]["total"],
            "watchdog_warnings": len(c["watchdog_warnings"]), "cache": c["cache"],
            "unknown": c.get("unknown", {}), "verify": _numerics(report),
        })
    slowest = sorted(((f, _label(r)) for r in reports for f in r["compile"]["slowest_frames"]),
                     key=lambda pair: -pair[0]["seconds"])
    flags = red_flags(reports)
    return {
        "processes": processes,
        "graph_breaks": _recurring(reports, "graph_breaks", ("reason", "where")),
        "recompiles": _recurring(reports, "recompiles", ("where", "reason")),
        "slowest_frames": [{**f, "process": who} for f, who in slowest[:compile_report.TOP]],
        "numerics": _graphs_not_passed(reports),
        "red_flags": flags,
        "healthy": not flags,
    }


def _graphs_not_passed(reports: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Graphs the numerics sentinel failed or did not compare, merged across processes."""
    merged: Dict[Tuple[str, str, str], Dict[str, Any]] = {}
    for report in reports:
        for g in (report.get("verify") or {}).get("graphs", []):
            if g.get("status") == verify.PASSED:
                continue
            key = (f"graph {g['graph']} of {g['where']}", g["status"], g.get("reason", ""))
            slot = merged.setdefault(key, {"graph": key[0], "status": key[1],
                                           "reason": key[2], "processes": []})
            slot["processes"].append(_label(report))
    bad = (verify.FAILED, verify.FELL_BACK)
    return sorted(merged.values(), key=lambda e: (e["status"] not in bad,
                                                  -len(e["processes"])))


def _numerics(report: Dict[str, Any]) -> Dict[str, Any]:
    """The numerics sentinel's totals for one process (mode "off" when it was not on)."""
    info = report.get("verify") or {}
    totals = info.get("totals") or {}
    return {"mode": info.get("mode", "off"), **{k.replace(" ", "_"): v
                                                for k, v in totals.items()}}


def _n(value: Any) -> str:
    return "?" if value is None else str(value)


def render(view: Dict[str, Any], reports: List[Dict[str, Any]]) -> List[str]:
    """The job view of ``reports`` as text lines (the doctor fits them to 80 columns)."""
    procs = view["processes"]
    out = [f"rocm-autopatch compile report: {len(procs)} process"
           f"{'es' if len(procs) != 1 else ''}", ""]
    out.append(f"  {'process':<12}{'graphs':>7}{'breaks':>7}{'recomp.':>8}{'seconds':>9}"
               f"{'eager*':>7}{'fx cache hit/miss':>19}")
    for p in procs:
        who = _who(p["rank"], p["pid"])
        cache = f"{_n(p['cache'].get('fxgraph_hit'))}/{_n(p['cache'].get('fxgraph_miss'))}"
        out.append(f"  {who:<12}{_n(p['graphs']):>7}{_n(p['graph_breaks']):>7}"
                   f"{p['recompiles']:>8}{p['seconds']:>9.1f}{p['eager_in_capture']:>7}"
                   f"{cache:>19}")
    out.append("  (* calls run eagerly because a CUDA/HIP graph was being captured; "
               "? = not counted by this torch)")
    checked = [p for p in procs if p["verify"]["mode"] != "off"]
    if checked:
        out += ["", "Numerics (ROCM_AUTOPATCH_VERIFY: compiled graphs compared with eager)"]
        for p in checked:
            v = p["verify"]
            out.append(f"  {_who(p['rank'], p['pid']):<12}{v['mode']}: "
                       f"{v.get('passed', 0)} passed, {v.get('failed', 0)} failed, "
                       f"{v.get('fell_back', 0)} fell back, {v.get('skipped', 0)} not "
                       "compared")
        for e in view["numerics"][:compile_report.TOP]:
            out.append(f"  in {len(e['processes'])} of {len(procs)}: {e['status']}: "
                       f"{e['reason']}")
            out.append(Verbatim(f"      {e['graph']}"))
    for title, key, first in (("Graph breaks", "graph_breaks", "reason"),
                              ("Recompiles", "recompiles", "reason")):
        out += ["", f"{title} (most processes first)"]
        entries = view[key]
        if not entries:
            out.append("  none")
        for e in entries[:compile_report.TOP]:
            out.append(f"  x{e['count']} in {len(e['processes'])} of {len(procs)}: {e[first]}")
            out.append(Verbatim(f"      at {e['where']}"))
    out += ["", "Slowest frames (seconds compiling, compiles)"]
    for f in view["slowest_frames"] or []:
        out.append(Verbatim(f"  {f['seconds']:>8.2f} s x{f['compiles']} [{f['process']}] "
                            f"{f['where']}"))
    if not view["slowest_frames"]:
        out.append("  none")
    flags = red_flags(reports, mark=keep)
    out += [""] + ([f"! {flag}" for flag in flags] or ["healthy"])
    return out
