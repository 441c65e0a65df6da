"""``rocm-autopatch doctor --report FILE...``: one or many compile reports as one job view.

Reads the JSON files that ``ROCM_AUTOPATCH_REPORT`` wrote (one per process: every rank of a
torchrun or Slurm job) and shows per-process totals, the graph breaks and recompiles that
recur across processes (torch's reason, explanation and hints, at the user's file:line),
where ranks diverge (a rank that recompiles alone is a classic cause of hangs in
collectives), the slowest frames, the numerics sentinel's verdicts and the red flags:
frames that hit the recompile limit, graphs that compute wrong numbers, failed hooks. A
value a torch release does not count stays unknown ("?"), never zero. Every readable file
is shown; an unreadable one is named, and only when none is readable is that an error.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rocm_autopatch.config import settings
from rocm_autopatch.reporting import document, schema
from rocm_autopatch.sentinel import status
from rocm_autopatch.text import Verbatim, keep

ReportError = schema.ReportError


def normalise(data: Any) -> Dict[str, Any]:
    """A report with every section the view reads present and of the right type."""
    return schema.read(data, settings.REPORT)


def load(paths: Sequence[str]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(the readable reports, in rank order; "path: why" for each file that is not one)."""
    reports, problems = [], []
    for path in paths:
        try:
            with open(path) as fh:
                report = normalise(json.load(fh))
        except (OSError, ValueError, RecursionError) as exc:
            problems.append(f"{path}: not readable as a compile report "
                            f"({type(exc).__name__}: {str(exc)[:200]})")
            continue
        except ReportError as exc:
            problems.append(f"{path}: {exc}")
            continue
        report["_file"] = path
        reports.append(report)
    return sorted(reports, key=_order), problems


def _rank(report: Dict[str, Any]) -> Optional[int]:
    """The process's rank in its job; None for a process that is not a rank (no rank, a
    value that is not one, or a child forked by a rank: it inherits its parent's)."""
    rank = report["process"].get("rank")
    if report["process"].get("forked_from") is not None:
        return None
    return int(rank) if isinstance(rank, str) and rank.isascii() and rank.isdigit() else None


def _order(report: Dict[str, Any]) -> Tuple[int, str, str]:
    rank = _rank(report)
    number = rank if rank is not None else 1 << 30
    return number, str(report["process"].get("host", "")), str(report["process"]["pid"])


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
            key = (str(entry.get(fields[0], "?")), str(entry.get(fields[1], "?")))
            slot = merged.setdefault(key, {**entry, fields[0]: key[0], fields[1]: key[1],
                                           "count": 0, "processes": []})
            slot["count"] += entry.get("count", 0) if isinstance(entry.get("count"), int) else 0
            slot["processes"].append(_label(report))
    return sorted(merged.values(), key=lambda e: (-len(e["processes"]), -e["count"]))


def diverging(reports: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Recompiles and frames seen in some ranks of a job but not all. Only ranks are
    compared, one process per rank: a parent and its forked child, or processes without a
    rank, are not ranks of a job and do not diverge from one another."""
    ranks: Dict[int, Dict[str, Any]] = {}
    for report in reports:
        rank = _rank(report)
        if rank is not None:
            ranks.setdefault(rank, report)
    reports = [ranks[r] for r in sorted(ranks)]
    if len(reports) < 2:
        return []
    everyone = [_label(r) for r in reports]
    found = []
    for entry in _recurring(reports, "recompiles", ("where", "reason")):
        if len(entry["processes"]) < len(everyone):
            found.append({"what": "recompile", "where": entry["where"],
                          "reason": entry["reason"], "processes": entry["processes"],
                          "not_in": [p for p in everyone if p not in entry["processes"]]})
    compiled: Dict[str, Dict[str, int]] = {}
    for report in reports:
        for frame in report["compile"]["slowest_frames"]:
            where = str(frame.get("where", "?"))
            compiled.setdefault(where, {})[_label(report)] = frame.get("compiles", 0)
    for where, counts in sorted(compiled.items()):
        if len(set(counts.values())) > 1 or len(counts) < len(everyone):
            found.append({"what": "compiles", "where": where, "reason": ", ".join(
                f"{who}: {counts.get(who, 0)}" for who in everyone),
                "processes": sorted(counts), "not_in": []})
    return found + _verdicts_differ(reports, everyone)


def _verdicts_differ(reports: List[Dict[str, Any]], everyone: List[str]
                     ) -> List[Dict[str, Any]]:
    """Graphs the numerics sentinel judged wrong on some ranks and not on others: a
    miscompile of one rank's GPU, build or shapes (its verdicts per rank, by graph)."""
    verdicts: Dict[str, Dict[str, List[str]]] = {}
    for report in reports:
        for g in report["verify"]["graphs"]:
            label = f"graph {g.get('graph', '?')} of {g.get('where', '?')}"
            verdicts.setdefault(label, {}).setdefault(_label(report), []).append(
                str(g.get("status")))
    found = []
    for label, by_rank in sorted(verdicts.items()):
        seen = {who: sorted(by_rank.get(who, [])) for who in everyone}
        wrong = [who for who, said in seen.items() if set(said) & set(status.WRONG)]
        if wrong and len({tuple(said) for said in seen.values()}) > 1:
            found.append({"what": "verdict", "where": label, "reason": "; ".join(
                f"{who}: {', '.join(said) or 'not compiled'}" for who, said in seen.items()),
                "processes": wrong, "not_in": [w for w in everyone if w not in wrong]})
    return found


def red_flags(reports: List[Dict[str, Any]], mark: Callable[[str], str] = str) -> List[str]:
    """One line per red flag; ``mark`` wraps the spans a reader copies or searches for
    (``text.keep`` when rendering, so wrapping never splits them)."""
    flags = []
    for report in reports:
        for hit in report["compile"]["recompile_limit_hit"]:
            flags.append(f"{_label(report)}: {mark(str(hit.get('where', '?')))} "
                         f"{mark('hit the recompile limit')} x{hit.get('count', '?')}: torch "
                         "runs it eagerly from then on (raise "
                         "torch._dynamo.config.recompile_limit, or dynamic=True for "
                         "changing shapes)")
        for error in report["errors"]:
            flags.append(f"{_label(report)}: rocm-autopatch hook failed: {error}")
        for failed in report["compile"]["failed"]:
            flags.append(f"{_label(report)}: {mark(str(failed.get('where', '?')))} "
                         f"{mark('failed to compile')} x{failed.get('count', '?')}: "
                         f"{str(failed.get('error', ''))[:300]}")
        for graph in report["verify"]["graphs"]:
            if graph.get("status") in status.WRONG:
                flags.append(f"{_label(report)}: graph {graph.get('graph', '?')} of "
                             f"{mark(str(graph.get('where', '?')))} "
                             f"{mark('computes wrong numbers')} when compiled "
                             f"({graph['status']}): {graph.get('reason', '')}")
    return flags


def _diverged(d: Dict[str, Any]) -> str:
    if d["what"] == "verdict":
        return (f"ranks diverge: {d['where']} computes wrong numbers in "
                f"{', '.join(d['processes'])} only ({d['reason']})")
    if d["what"] == "recompile":
        return (f"ranks diverge: {d['where']} recompiled in {', '.join(d['processes'])} only "
                "(ranks that compile different graphs can hang collectives)")
    return (f"ranks diverge: {d['where']} compiled a different number of times "
            f"({d['reason']})")


def _graphs_not_passed(reports: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Graphs the numerics sentinel failed or did not compare, merged across processes."""
    merged: Dict[Tuple[str, str, str], Dict[str, Any]] = {}
    for report in reports:
        for g in report["verify"]["graphs"]:
            if g.get("status") == status.PASSED:
                continue
            key = (f"graph {g.get('graph', '?')} of {g.get('where', '?')}",
                   str(g.get("status", "?")), str(g.get("reason", "")))
            slot = merged.setdefault(key, {"graph": key[0], "status": key[1],
                                           "reason": key[2], "processes": []})
            slot["processes"].append(_label(report))
            folder = g.get("repro")
            if isinstance(folder, str) and folder and "repro" not in slot:
                slot["repro"] = folder
                slot["bisect"] = _bisected(folder, g.get("bisect"))
    bad = status.WRONG
    return sorted(merged.values(), key=lambda e: (e["status"] not in bad,
                                                  -len(e["processes"])))


def _bisected(folder: str, started: Any) -> str:
    """The bisection of a repro directory in one line: its answer, or where it stands."""
    from rocm_autopatch.sentinel import bisect

    done = bisect.read(folder)
    if done:
        return str(done.get("answer", "?")) + (" (fix remembered for the next run)"
                                               if done.get("remembered") else "")
    if isinstance(started, dict) and started.get("status"):
        return f"{started['status']} (its answer will be in {folder}/{bisect.RESULT})"
    return f"not run: `rocm-autopatch bisect {folder}` names the compiler step"


COVERAGE_LINES = 20  # graphs listed in the text view


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def coverage(reports: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """What the numerics sentinel covered, per graph, merged across processes: shapes seen
    and checked, calls run and checked (why), the largest input magnitude checked, and the
    statuses (a graph may pass on one rank and fail on another)."""
    merged: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for report in reports:
        for g in report["verify"]["graphs"]:
            key = (str(g.get("graph", "?")), str(g.get("where", "?")))
            slot = merged.setdefault(key, {
                "graph": key[0], "where": key[1], "processes": [], "statuses": {},
                "calls": 0, "calls_checked": 0, "sampled": 0, "shapes_seen": 0,
                "shapes_checked": 0, "dynamic": False, "largest_checked": None,
                "unverified_calls": 0})
            slot["processes"].append(_label(report))
            state = str(g.get("status", "?"))
            slot["statuses"][state] = slot["statuses"].get(state, 0) + 1
            shapes = g.get("shapes") if isinstance(g.get("shapes"), dict) else {}
            because = (g.get("checked_because")
                       if isinstance(g.get("checked_because"), dict) else {})
            values = g.get("values") if isinstance(g.get("values"), dict) else {}
            slot["calls"] += _count(g.get("calls"))
            slot["calls_checked"] += _count(g.get("calls_checked"))
            slot["sampled"] += _count(because.get("sampled"))
            slot["unverified_calls"] += _count(g.get("unverified_calls"))
            # Shapes: the most any one process saw (ranks mostly see the same ones).
            slot["shapes_seen"] = max(slot["shapes_seen"], _count(shapes.get("seen")))
            slot["shapes_checked"] = max(slot["shapes_checked"], _count(shapes.get("checked")))
            slot["dynamic"] = slot["dynamic"] or bool(shapes.get("dynamic"))
            largest = values.get("largest_checked")
            if isinstance(largest, (int, float)):
                slot["largest_checked"] = max(largest, slot["largest_checked"] or 0.0)
    return list(merged.values())


def coverage_line(c: Dict[str, Any]) -> str:
    """One graph in one line: "graph 0/0: 14 shapes, 14 checked; 10,000 calls, 31
    checked (3 sampled); passed"."""
    shapes = (f"{c['shapes_seen']:,} shape{'s' if c['shapes_seen'] != 1 else ''}, "
              f"{c['shapes_checked']:,} checked" if c["dynamic"] else "static shapes")
    states = c["statuses"]
    verdict = (next(iter(states)) if len(states) == 1 else
               ", ".join(f"{state} in {n}" for state, n in sorted(states.items())))
    ranks = len(c["processes"])
    return (f"graph {c['graph']}: {shapes}; {c['calls']:,} calls, {c['calls_checked']:,} "
            f"checked ({c['sampled']:,} sampled); {verdict}"
            + (f" ({ranks} processes)" if ranks > 1 else ""))


def _numerics(report: Dict[str, Any]) -> Dict[str, Any]:
    """The numerics sentinel's totals for one process (mode "off" when it was not on)."""
    info = report["verify"]
    totals = info.get("totals") if isinstance(info.get("totals"), dict) else {}
    return {"mode": info.get("mode", "off"), **{str(k).replace(" ", "_"): v
                                                for k, v in totals.items()}}


def job(reports: List[Dict[str, Any]], problems: Sequence[str] = ()) -> Dict[str, Any]:
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
            "seconds": c["seconds"], "backward_compiles": c["backward"].get("compiles"),
            "eager_in_capture": c["eager_in_capture"].get("total", 0),
            "watchdog_warnings": len(c["watchdog_warnings"]), "cache": c["cache"],
            "unknown": c["unknown"], "verify": _numerics(report),
        })
    slowest = sorted(((f, _label(r)) for r in reports for f in r["compile"]["slowest_frames"]
                      if isinstance(f.get("seconds"), (int, float))),
                     key=lambda pair: -pair[0]["seconds"])
    flags = red_flags(reports) + [_diverged(d) for d in diverging(reports)]
    return {
        "processes": processes,
        "unreadable": list(problems),
        "graph_breaks": _recurring(reports, "graph_breaks", ("reason", "where")),
        "recompiles": _recurring(reports, "recompiles", ("where", "reason")),
        "diverging": diverging(reports),
        "slowest_frames": [{**f, "process": who} for f, who in slowest[:document.TOP]],
        "numerics": _graphs_not_passed(reports),
        "coverage": coverage(reports),
        "red_flags": flags,
        "healthy": not flags,
    }


def _n(value: Any, spec: str = "") -> str:
    if value is None:
        return "?"
    return format(value, spec) if spec and isinstance(value, (int, float)) else str(value)


def render(view: Dict[str, Any], reports: List[Dict[str, Any]]) -> List[str]:
    """The job view of ``reports`` as text lines (the doctor fits them to 80 columns)."""
    procs = view["processes"]
    out = [f"rocm-autopatch compile report: {len(procs)} process"
           f"{'es' if len(procs) != 1 else ''}", ""]
    for problem in view["unreadable"]:
        out.append(f"! {problem}")
    out.append(f"  {'process':<12}{'graphs':>7}{'breaks':>7}{'recomp.':>8}{'seconds':>9}"
               f"{'eager*':>7}{'cache hit/miss':>15}{'saved s':>9}")
    for p in procs:
        cache = f"{_n(p['cache'].get('fxgraph_hit'))}/{_n(p['cache'].get('fxgraph_miss'))}"
        out.append(f"  {_who(p['rank'], p['pid']):<12}{_n(p['graphs']):>7}"
                   f"{_n(p['graph_breaks']):>7}{_n(p['recompiles']):>8}"
                   f"{_n(p['seconds'], '.1f'):>9}{_n(p['eager_in_capture']):>7}{cache:>15}"
                   f"{_n(p['cache'].get('seconds_saved'), '.1f'):>9}")
    out.append("  (seconds: forward and backward compiles; * calls run eagerly because a "
               "CUDA/HIP graph was being captured; cache: Inductor's FX-graph cache; saved: "
               "the original compile time of the entries loaded, as torch records it; ? = "
               "not counted by this torch)")
    out += _numerics_lines(view)
    out += _breaks_and_recompiles_lines(view)
    if sum(_rank(r) is not None for r in reports) > 1:
        out += _diverging_lines(view)
    out += _slowest_lines(view)
    flags = red_flags(reports, mark=keep) + [_diverged(d) for d in view["diverging"]]
    out += [""] + ([f"! {flag}" for flag in flags] or ["healthy"])
    return out


def _numerics_lines(view: Dict[str, Any]) -> List[str]:
    procs = view["processes"]
    checked = [p for p in procs if p["verify"]["mode"] != "off"]
    out: List[str] = []
    if checked:
        out += ["", "Numerics (ROCM_AUTOPATCH_VERIFY: compiled graphs compared with eager)"]
        for p in checked:
            v = p["verify"]
            out.append(f"  {_who(p['rank'], p['pid']):<12}{v['mode']}: "
                       f"{v.get('passed', 0)} passed, {v.get('failed', 0)} failed, "
                       f"{v.get('fell_back', 0)} fell back, {v.get('skipped', 0)} not "
                       "compared")
        for e in view["numerics"][:document.TOP]:
            out.append(f"  in {len(e['processes'])} of {len(procs)}: {e['status']}: "
                       f"{e['reason']}")
            out.append(Verbatim(f"      {e['graph']}"))
            if e.get("repro"):
                out.append(Verbatim(f"      repro: {e['repro']}"))
                out.append(f"      bisect: {e['bisect']}")
        out += ["", "Numerics coverage (per graph, all processes: shapes, calls checked)"]
        for c in view["coverage"][:COVERAGE_LINES]:
            out.append(f"  {coverage_line(c)}")
            out.append(Verbatim(f"      {c['where']}"))
        if len(view["coverage"]) > COVERAGE_LINES:
            out.append(f"  ... {len(view['coverage']) - COVERAGE_LINES} more graphs "
                       "(--json lists them all)")
    return out


def _breaks_and_recompiles_lines(view: Dict[str, Any]) -> List[str]:
    procs = view["processes"]
    out = ["", "Graph breaks (most processes first; as torch logs them)"]
    for e in view["graph_breaks"][:document.TOP]:
        out.append(f"  x{e['count']} in {len(e['processes'])} of {len(procs)}: {e['reason']}")
        out.append(Verbatim(f"      at {e['where']}"))
        if e.get("explanation"):
            out.append(f"      {e['explanation']}")
        for hint in (e.get("hints") or [])[:2]:
            out.append(f"      hint: {hint}")
    if not view["graph_breaks"]:
        out.append("  none")
    out += ["", "Recompiles (most processes first; the guards torch says failed)"]
    for e in view["recompiles"][:document.TOP]:
        out.append(f"  x{e['count']} in {len(e['processes'])} of {len(procs)}:")
        out.append(Verbatim(f"      {e['where']}"))
        out += [f"      {line.strip()}" for line in str(e["reason"]).splitlines()[:6]]
    if not view["recompiles"]:
        out.append("  none")
    return out


def _diverging_lines(view: Dict[str, Any]) -> List[str]:
    out = ["", "Where ranks diverge (a rank that recompiles alone can hang collectives)"]
    for d in view["diverging"][:document.TOP]:
        if d["what"] == "recompile":
            out.append(f"  recompiled in {', '.join(d['processes'])} only "
                       f"(not {', '.join(d['not_in'])}):")
            out.append(Verbatim(f"      {d['where']}"))
            out.append(f"      {str(d['reason']).splitlines()[0]}")
        elif d["what"] == "verdict":
            out.append(f"  judged wrong in {', '.join(d['processes'])} only ({d['reason']}):")
            out.append(Verbatim(f"      {d['where']}"))
        else:
            out.append(f"  compiled a different number of times ({d['reason']}):")
            out.append(Verbatim(f"      {d['where']}"))
    if not view["diverging"]:
        out.append("  none: every rank compiled the same frames the same number of times")
    return out


def _slowest_lines(view: Dict[str, Any]) -> List[str]:
    out = ["", "Slowest frames (seconds compiling, forward and backward; compiles)"]
    for f in view["slowest_frames"]:
        back = f.get("backward_seconds")
        out.append(Verbatim(f"  {f['seconds']:>8.2f} s x{f.get('compiles', '?')} "
                            f"[{f['process']}] {f.get('where', '?')}"
                            + (f" (backward {back:.2f} s)" if back else "")))
    if not view["slowest_frames"]:
        out.append("  none")
    return out
