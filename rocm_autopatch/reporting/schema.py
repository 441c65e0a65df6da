"""The compile report's schema, declared once: what ``collector`` writes and what the job
view (``view``) reads, each field with its kind.

A reader takes every schema in ``READABLE``: a field that an older writer did not write is
read as absent (unknown), never as zero.
"""

from __future__ import annotations

import typing
from typing import Any, Dict, List, Tuple

from rocm_autopatch.sentinel import graph_record

SCHEMA = 4  # 4: verify graphs carry their coverage (VERIFY_GRAPH); 3: process.forked_from
READABLE = (1, 2, 3, 4)  # 1: before graph breaks came from torch's log (no hints, no backward)

NUMBER, TEXT, OBJECT, LIST, TOP = "number", "text", "object", "list of objects", "top"

PROCESS: Dict[str, str] = {
    "pid": NUMBER,
    "rank": TEXT,  # digits, or absent: not a rank of a job
    "local_rank": TEXT,
    "world_size": TEXT,
    "host": TEXT,
    "argv": "list",
    "python": TEXT,
    "started": NUMBER,
    "written": NUMBER,
    # The pid of the process of this run that armed the report first, where this one is
    # its child (fork, multiprocessing): a child is not a rank of its own.
    "forked_from": NUMBER,
}

COMPILE: Dict[str, str] = {
    "frames": NUMBER,  # frame compiles (Dynamo's _compile calls)
    "graphs": NUMBER,  # torch's counters["stats"]["unique_graphs"]
    "seconds": NUMBER,  # forward and backward compiles
    "forward_seconds": NUMBER,
    "backward": OBJECT,  # {"compiles", "seconds", "frames": [...]}
    "graph_breaks": TOP,  # {"total", "top": [...]}, from torch's graph_breaks log
    "recompiles": TOP,  # {"total", "top": [...]}, every guard failure torch states
    "recompile_limit_hit": LIST,
    "failed": LIST,  # compiles that raised: the backend, a fullgraph error
    "slowest_frames": LIST,  # forward and backward seconds per frame
    "eager_in_capture": OBJECT,
    "watchdog_warnings": LIST,
    "cache": OBJECT,
    "unknown": OBJECT,  # what this torch does not count, and why
}


BOOL = "bool"


def _kind_of(annotation: Any) -> str:
    """A declared type -> its kind here: Optional[X] is X (absent reads as None)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        origin = typing.get_origin(annotation)
    kind = origin or annotation
    return {bool: BOOL, int: NUMBER, float: NUMBER, str: TEXT, dict: OBJECT, list: "list"}[kind]


# One graph of ``verify.graphs`` (the numerics sentinel), from schema 4 on: generated from
# the record's one declaration (sentinel/graph_record.py).
VERIFY_GRAPH: Dict[str, str] = {
    name: _kind_of(hint)
    for name, hint in typing.get_type_hints(graph_record.GraphRecord).items()}


class ReportError(Exception):
    """A file that is not a readable compile report."""


def _kind(value: Any, kind: str, what: str) -> Any:
    if value is None:
        return None
    ok = {NUMBER: isinstance(value, (int, float)) and not isinstance(value, bool),
          BOOL: isinstance(value, bool),
          TEXT: isinstance(value, str), OBJECT: isinstance(value, dict),
          "list": isinstance(value, list),
          LIST: isinstance(value, list) and all(isinstance(v, dict) for v in value),
          TOP: isinstance(value, dict)}[kind]
    if not ok:
        raise ReportError(f"{what} is not a {'object' if kind == TOP else kind}")
    if kind == TOP:
        top = _kind(value.get("top"), LIST, f"{what}.top")
        return {"total": value.get("total"), "top": top or []}
    return value


def read(data: Any, env: str) -> Dict[str, Any]:
    """A report with every declared field present and of its kind (absent: None, or empty
    for a list or object); ReportError for what is not a report."""
    if not isinstance(data, dict) or "compile" not in data or "process" not in data:
        raise ReportError(f"not a compile report (written with {env}=PATH)")
    schema = data.get("schema")
    if schema not in READABLE:
        raise ReportError(f"report schema {schema!r}: this rocm-autopatch reads "
                          f"{', '.join(map(str, READABLE))}")
    for section in ("process", "compile"):
        if not isinstance(data[section], dict):
            raise ReportError(f"{section} is not an object")
    if not isinstance(data["process"].get("pid"), int) or not data["compile"]:
        raise ReportError("empty sections: no process id or no compile section")
    out = dict(data)
    process = dict(data["process"])
    for key in ("rank", "local_rank", "world_size"):  # written as text; a number is read too
        if isinstance(process.get(key), int) and not isinstance(process.get(key), bool):
            process[key] = str(process[key])
    out["process"] = {k: _kind(process.get(k), kind, f"process.{k}")
                      for k, kind in PROCESS.items()}
    compiled: Dict[str, Any] = {}
    for key, kind in COMPILE.items():
        value = _kind(data["compile"].get(key), kind, f"compile.{key}")
        if value is None and kind in (OBJECT, LIST, TOP):
            value = {"total": None, "top": []} if kind == TOP else [] if kind == LIST else {}
        compiled[key] = value
    out["compile"] = compiled
    verify = _kind(data.get("verify"), OBJECT, "verify") or {}
    graphs = _kind(verify.get("graphs"), LIST, "verify.graphs") or []
    for i, graph in enumerate(graphs):
        for key, kind in VERIFY_GRAPH.items():
            _kind(graph.get(key), kind, f"verify.graphs[{i}].{key}")
    out["verify"] = {**verify, "graphs": graphs}
    out["errors"] = [str(e) for e in (data.get("errors") or [])]
    return out


def missing(document: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(section, field) declared here that ``document`` lacks (a test holds the writer to
    the declaration)."""
    graphs = (document.get("verify") or {}).get("graphs") or []
    return ([("process", k) for k in PROCESS if k not in document.get("process", {})]
            + [("compile", k) for k in COMPILE if k not in document.get("compile", {})]
            + [("verify.graphs", k) for g in graphs[:1] for k in VERIFY_GRAPH if k not in g])
