"""``rocm-autopatch doctor --report FILE...``: one or many compile reports as one job view.

Reads the JSON files that ``ROCM_AUTOPATCH_REPORT`` wrote (one per process: every rank of a
torchrun or Slurm job) and shows per-process totals, the graph breaks and recompiles that
recur across processes (torch's reason, explanation and hints, at the user's file:line),
where ranks diverge (a rank that recompiles alone is a classic cause of hangs in
collectives), the slowest frames, the numerics sentinel's verdicts and the red flags:
frames that hit the recompile limit, graphs that compute wrong numbers, failed hooks. A
value a torch release does not count stays unknown ("?"), never zero. Every readable file
is shown; an unreadable one is named, and only when none is readable is that an error.

A concern that writes a section of its own into the report (the numerics sentinel's
``verify``) hands the view a ``Part`` for it: how its section is read, what it adds to the
job view, its lines, red flags and divergences. ``register`` takes it; the view imports no
concern.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from rocm_autopatch import settings
from rocm_autopatch.reporting import document, schema
from rocm_autopatch.text import Verbatim, keep

ReportError = schema.ReportError
Reports = List[Dict[str, Any]]


class Part(NamedTuple):
    """A concern's own section of the report, as the view reads and shows it."""

    name: str  # the section's key in the file ("verify")
    read: Callable[[Any], Any]  # the section as written -> as read; ReportError if it is not
    process: Callable[[Dict[str, Any]], Any]  # one process's entry in the job's rows
    data: Callable[[Reports], Dict[str, Any]]  # what it adds to the job view (--json)
    lines: Callable[[Dict[str, Any]], List[str]]  # its text, from the job view
    flags: Callable[[Reports, Callable[[str], str]], List[str]]  # its red flags
    # Where ranks diverge in it (each {"what", "where", "reason", "processes", "not_in"},
    # "what" its own word) and how one reads.
    diverging: Callable[[Reports, List[str]], List[Dict[str, Any]]]
    diverged: Callable[[Dict[str, Any]], str]
    diverged_lines: Callable[[Dict[str, Any]], List[str]]


PARTS: Dict[str, Part] = {}


def register(part: Part) -> None:
    """Show ``part``'s section from now on (the concern's owner calls it; idempotent)."""
    PARTS[part.name] = part


def _owner(d: Dict[str, Any]) -> Optional[Part]:
    return next((p for p in PARTS.values() if d.get("part") == p.name), None)


def normalise(data: Any) -> Dict[str, Any]:
    """A report with every section the view reads present and of the right type."""
    out = schema.read(data, settings.REPORT)
    for part in PARTS.values():
        out[part.name] = part.read(out.get(part.name))
    return out


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


def who(rank: Any, pid: Any) -> str:
    return f"rank {rank}" if rank is not None else f"pid {pid}"


def label(report: Dict[str, Any]) -> str:
    return who(report["process"].get("rank"), report["process"]["pid"])


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
            slot["processes"].append(label(report))
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
    everyone = [label(r) for r in reports]
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
            compiled.setdefault(where, {})[label(report)] = frame.get("compiles", 0)
    for where, counts in sorted(compiled.items()):
        if len(set(counts.values())) > 1 or len(counts) < len(everyone):
            found.append({"what": "compiles", "where": where, "reason": ", ".join(
                f"{who}: {counts.get(who, 0)}" for who in everyone),
                "processes": sorted(counts), "not_in": []})
    for part in PARTS.values():
        found += [{**d, "part": part.name} for d in part.diverging(reports, everyone)]
    return found


def red_flags(reports: List[Dict[str, Any]], mark: Callable[[str], str] = str) -> List[str]:
    """One line per red flag; ``mark`` wraps the spans a reader copies or searches for
    (``text.keep`` when rendering, so wrapping never splits them)."""
    flags = []
    for report in reports:
        for hit in report["compile"]["recompile_limit_hit"]:
            flags.append(f"{label(report)}: {mark(str(hit.get('where', '?')))} "
                         f"{mark('hit the recompile limit')} x{hit.get('count', '?')}: torch "
                         "runs it eagerly from then on (raise "
                         "torch._dynamo.config.recompile_limit, or dynamic=True for "
                         "changing shapes)")
        for error in report["errors"]:
            flags.append(f"{label(report)}: rocm-autopatch hook failed: {error}")
        for failed in report["compile"]["failed"]:
            flags.append(f"{label(report)}: {mark(str(failed.get('where', '?')))} "
                         f"{mark('failed to compile')} x{failed.get('count', '?')}: "
                         f"{str(failed.get('error', ''))[:300]}")
    for part in PARTS.values():
        flags += part.flags(reports, mark)
    return flags


def _diverged(d: Dict[str, Any]) -> str:
    owner = _owner(d)
    if owner is not None:
        return owner.diverged(d)
    if d["what"] == "recompile":
        return (f"ranks diverge: {d['where']} recompiled in {', '.join(d['processes'])} only "
                "(ranks that compile different graphs can hang collectives)")
    return (f"ranks diverge: {d['where']} compiled a different number of times "
            f"({d['reason']})")


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
            "unknown": c["unknown"],
            **{part.name: part.process(report) for part in PARTS.values()},
        })
    slowest = sorted(((f, label(r)) for r in reports for f in r["compile"]["slowest_frames"]
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
        **{k: v for part in PARTS.values() for k, v in part.data(reports).items()},
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
        out.append(f"  {who(p['rank'], p['pid']):<12}{_n(p['graphs']):>7}"
                   f"{_n(p['graph_breaks']):>7}{_n(p['recompiles']):>8}"
                   f"{_n(p['seconds'], '.1f'):>9}{_n(p['eager_in_capture']):>7}{cache:>15}"
                   f"{_n(p['cache'].get('seconds_saved'), '.1f'):>9}")
    out.append("  (seconds: forward and backward compiles; * calls run eagerly because a "
               "CUDA/HIP graph was being captured; cache: Inductor's FX-graph cache; saved: "
               "the original compile time of the entries loaded, as torch records it; ? = "
               "not counted by this torch)")
    for part in PARTS.values():
        out += part.lines(view)
    out += _breaks_and_recompiles_lines(view)
    if sum(_rank(r) is not None for r in reports) > 1:
        out += _diverging_lines(view)
    out += _slowest_lines(view)
    flags = red_flags(reports, mark=keep) + [_diverged(d) for d in view["diverging"]]
    out += [""] + ([f"! {flag}" for flag in flags] or ["healthy"])
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
        elif _owner(d) is not None:
            out += _owner(d).diverged_lines(d)
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
