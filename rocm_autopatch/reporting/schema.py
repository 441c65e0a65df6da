"""The compile report's schema, declared once: what ``collector`` writes and what the job
view (``view``) reads, each field with its kind.

A reader takes every schema in ``READABLE``: a field that an older writer did not write is
read as absent (unknown), never as zero. A concern's own section (the numerics sentinel's
``verify``) is declared by that concern and read with ``of_kind``/``kinds_of`` here
(``view.Part``).
"""

from __future__ import annotations

import typing
from typing import Any, Dict, List, Tuple

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


def kinds_of(declared: type) -> Dict[str, str]:
    """A record class's fields -> their kinds here (``Optional[X]`` is X: absent reads as
    None): a concern declares its records once and the schema is made from them."""
    return {name: _kind_of(hint) for name, hint in typing.get_type_hints(declared).items()}


def _kind_of(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        origin = typing.get_origin(annotation)
    kind = origin or annotation
    return {bool: BOOL, int: NUMBER, float: NUMBER, str: TEXT, dict: OBJECT, list: "list"}[kind]


class ReportError(Exception):
    """A file that is not a readable compile report."""


def of_kind(value: Any, kind: str, what: str) -> Any:
    """``value`` if it is of ``kind`` (None stays None); ReportError naming ``what``."""
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
        top = of_kind(value.get("top"), LIST, f"{what}.top")
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
    out["process"] = {k: of_kind(process.get(k), kind, f"process.{k}")
                      for k, kind in PROCESS.items()}
    compiled: Dict[str, Any] = {}
    for key, kind in COMPILE.items():
        value = of_kind(data["compile"].get(key), kind, f"compile.{key}")
        if value is None and kind in (OBJECT, LIST, TOP):
            value = {"total": None, "top": []} if kind == TOP else [] if kind == LIST else {}
        compiled[key] = value
    out["compile"] = compiled
    out["errors"] = [str(e) for e in (data.get("errors") or [])]
    return out


def missing(document: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(section, field) declared here that ``document`` lacks (a test holds the writer to
    the declaration)."""
    return ([("process", k) for k in PROCESS if k not in document.get("process", {})]
            + [("compile", k) for k in COMPILE if k not in document.get("compile", {})])
