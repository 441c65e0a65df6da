"""The sentinel's part of the compile report: its ``verify`` section read (the fields its
graph record declares), and shown in the job view (``rocm-autopatch doctor --report``):
each process's totals, the graphs not passed with their repro and bisection, each graph's
coverage in one line, its red flags, and graphs judged wrong on some ranks only.
``PART`` is what the view is handed (``reporting.view.register``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from rocm_autopatch import settings
from rocm_autopatch.reporting import document, schema, view
from rocm_autopatch.sentinel.healing import bisect
from rocm_autopatch.sentinel.judging import status
from rocm_autopatch.sentinel.judging.graph_record import GraphRecord
from rocm_autopatch.sentinel.scheduling import crossings
from rocm_autopatch.text import Verbatim

NAME = "verify"
GRAPH = schema.kinds_of(GraphRecord)  # one graph of verify.graphs (schema 4 on)


def read(section: Any) -> Dict[str, Any]:
    """``verify`` as written -> with its graphs' fields of their declared kinds."""
    found = schema.of_kind(section, schema.OBJECT, NAME) or {}
    graphs = schema.of_kind(found.get("graphs"), schema.LIST, f"{NAME}.graphs") or []
    for i, graph in enumerate(graphs):
        for key, kind in GRAPH.items():
            schema.of_kind(graph.get(key), kind, f"{NAME}.graphs[{i}].{key}")
    return {**found, "graphs": graphs}


def missing(section: Dict[str, Any]) -> List[str]:
    """Fields the record declares that the first graph written lacks (a test holds the
    writer to the declaration)."""
    return [k for g in (section.get("graphs") or [])[:1] for k in GRAPH if k not in g]


def data(reports: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The job view's numerics (graphs not passed) and coverage (every graph)."""
    return {"numerics": _not_passed(reports), "coverage": coverage(reports)}


def flags(reports: List[Dict[str, Any]], mark: Callable[[str], str]) -> List[str]:
    """A red flag for every graph judged wrong, in every process."""
    out = []
    for report in reports:
        for graph in report[NAME]["graphs"]:
            if graph.get("status") in status.WRONG:
                out.append(f"{view.label(report)}: graph {graph.get('graph', '?')} of "
                           f"{mark(str(graph.get('where', '?')))} "
                           f"{mark('computes wrong numbers')} when compiled "
                           f"({graph['status']}): {graph.get('reason', '')}")
    return out


def diverged(d: Dict[str, Any]) -> str:
    return (f"ranks diverge: {d['where']} computes wrong numbers in "
            f"{', '.join(d['processes'])} only ({d['reason']})")


def diverged_lines(d: Dict[str, Any]) -> List[str]:
    return [f"  judged wrong in {', '.join(d['processes'])} only ({d['reason']}):",
            Verbatim(f"      {d['where']}")]


def diverging(reports: List[Dict[str, Any]], everyone: List[str]
                     ) -> List[Dict[str, Any]]:
    """Graphs the numerics sentinel judged wrong on some ranks and not on others: a
    miscompile of one rank's GPU, build or shapes (its verdicts per rank, by graph)."""
    verdicts: Dict[str, Dict[str, List[str]]] = {}
    for report in reports:
        for g in report[NAME]["graphs"]:
            label = f"graph {g.get('graph', '?')} of {g.get('where', '?')}"
            verdicts.setdefault(label, {}).setdefault(view.label(report), []).append(
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


def _not_passed(reports: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Graphs the numerics sentinel failed or did not compare, merged across processes."""
    merged: Dict[Tuple[str, str, str], Dict[str, Any]] = {}
    for report in reports:
        for g in report[NAME]["graphs"]:
            if g.get("status") == status.PASSED:
                continue
            key = (f"graph {g.get('graph', '?')} of {g.get('where', '?')}",
                   str(g.get("status", "?")), str(g.get("reason", "")))
            slot = merged.setdefault(key, {"graph": key[0], "status": key[1],
                                           "reason": key[2], "processes": []})
            slot["processes"].append(view.label(report))
            folder = g.get("repro")
            if isinstance(folder, str) and folder and "repro" not in slot:
                slot["repro"] = folder
                slot["bisect"] = _bisected(folder, g.get("bisect"))
    bad = status.WRONG
    return sorted(merged.values(), key=lambda e: (e["status"] not in bad,
                                                  -len(e["processes"])))


def _bisected(folder: str, started: Any) -> str:
    """The bisection of a repro directory in one line: its answer, or where it stands."""
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
        for g in report[NAME]["graphs"]:
            key = (str(g.get("graph", "?")), str(g.get("where", "?")))
            slot = merged.setdefault(key, {
                "graph": key[0], "where": key[1], "processes": [], "statuses": {},
                "calls": 0, "calls_checked": 0, "sampled": 0, "shapes_seen": 0,
                "shapes_checked": 0, "dynamic": False, "largest_checked": None,
                "remembered": None, "ladder_floor": 0.0, "unverified_calls": 0})
            slot["processes"].append(view.label(report))
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
            floor = values.get("ladder_floor")  # ranks may round to different powers
            if isinstance(floor, (int, float)) and not isinstance(floor, bool):
                slot["ladder_floor"] = max(float(floor), slot["ladder_floor"])
                budget = g.get("budget")  # a check may cost this share of the time to a rung
                if isinstance(budget, (int, float)) and not isinstance(budget, bool):
                    slot["rung_share"] = crossings.LADDER_CEILING * float(budget)
            remembered = values.get("remembered")  # rungs an earlier process passed
            if isinstance(remembered, dict) and remembered and not slot["remembered"]:
                slot["remembered"] = {str(k): v for k, v in remembered.items()
                                      if isinstance(v, (int, float))}
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


def process(report: Dict[str, Any]) -> Dict[str, Any]:
    """The numerics sentinel's totals for one process (mode "off" when it was not on)."""
    info = report[NAME]
    totals = info.get("totals") if isinstance(info.get("totals"), dict) else {}
    return {"mode": info.get("mode", "off"), **{str(k).replace(" ", "_"): v
                                                for k, v in totals.items()}}


def lines(job: Dict[str, Any]) -> List[str]:
    procs = job["processes"]
    checked = [p for p in procs if p[NAME]["mode"] != "off"]
    out: List[str] = []
    if checked:
        out += ["", "Numerics (ROCM_AUTOPATCH_VERIFY: compiled graphs compared with eager)"]
        for p in checked:
            v = p[NAME]
            out.append(f"  {view.who(p['rank'], p['pid']):<12}{v['mode']}: "
                       f"{v.get('passed', 0)} passed, {v.get('failed', 0)} failed, "
                       f"{v.get('fell_back', 0)} fell back, {v.get('skipped', 0)} not "
                       "compared")
        for e in job["numerics"][:document.TOP]:
            out.append(f"  in {len(e['processes'])} of {len(procs)}: {e['status']}: "
                       f"{e['reason']}")
            out.append(Verbatim(f"      {e['graph']}"))
            if e.get("repro"):
                out.append(Verbatim(f"      repro: {e['repro']}"))
                out.append(f"      bisect: {e['bisect']}")
        out += ["", "Numerics coverage (per graph, all processes: shapes, calls checked)"]
        for c in job["coverage"][:COVERAGE_LINES]:
            out.append(f"  {coverage_line(c)}")
            if c.get("remembered"):  # where ``sentinel.scheduling.rungs`` started its ladder
                out.append("      started where an earlier process's checks passed: " + ", ".join(
                    f"{name} at {v:,.0f}" for name, v in c["remembered"].items()))
            if c.get("ladder_floor"):  # ``sentinel.scheduling.crossings.floor``
                share = (f"over {c['rung_share']:.0%} of" if c.get("rung_share")
                         else "too much of")
                out.append(f"      no rung forced below {c['ladder_floor']:,.0f} (there a "
                           f"check costs {share} the time to the next rung; the "
                           "first checks come before it is known; "
                           f"{settings.VERIFY_BUDGET}=0 forces every rung, samples none)")
            out.append(Verbatim(f"      {c['where']}"))
        if len(job["coverage"]) > COVERAGE_LINES:
            out.append(f"  ... {len(job['coverage']) - COVERAGE_LINES} more graphs "
                       "(--json lists them all)")
    return out


PART = view.Part(NAME, read, process, data, lines, flags, diverging, diverged, diverged_lines)
