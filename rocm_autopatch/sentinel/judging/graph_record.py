"""The record of one graph under the sentinel's watch, declared once: each field with its
type, its default and what it means.

``report().verify["graphs"]`` holds these records as plain dicts (JSON-safe, read as users
read them), the compile report writes them, and the report's schema
(``reporting.schema.VERIFY_GRAPH``) is generated from this declaration, so the writer and
the readers cannot drift apart. ``new`` makes a record with every field and ``section``
holds them; the sentinel changes one only through ``Graph.note``, which refuses a field
not declared here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, FrozenSet, List, Optional

from rocm_autopatch import record
from rocm_autopatch.sentinel.judging.status import ALL, PENDING


@dataclasses.dataclass
class GraphRecord:
    graph: str  # Dynamo's compile id, "0/0"
    where: str  # the frame compiled (and the user's line that called into it)
    status: str = PENDING  # sentinel.status
    reason: str = ""  # why skipped or failed
    # What the checks covered (scheduling.coverage)
    calls: int = 0  # calls run through the sentinel
    calls_checked: int = 0
    checked_because: Dict[str, int] = dataclasses.field(default_factory=dict)  # by reason
    shapes: Dict[str, Any] = dataclasses.field(default_factory=dict)  # dynamic, seen, checked
    values: Dict[str, Any] = dataclasses.field(default_factory=dict)  # magnitudes followed
    period: int = 0  # sampled checks: every period-th call (0: none yet)
    values_stride: int = 1  # magnitudes are read every stride-th call
    sampled_calls: List[int] = dataclasses.field(default_factory=list)  # the last sampled
    # the checks after the first ones and the wrapper at the graph's calls, as a share of
    # the wall time from the first calls to when the record was last brought up to date (a
    # check, a new shape, a new read stride); the process's whole share, the reads
    # included, is schedule.LEDGER's
    budget_spent: float = 0.0
    budget: float = 0.0  # ROCM_AUTOPATCH_VERIFY_BUDGET
    checks_skipped: int = 0  # checks due that could not run (memory...)
    large_output_checked: bool = False  # a checked call had an output of 2^31 or more
    skipped_reason: str = ""  # the last skipped check's reason
    # A failure: when and why it was found
    unverified_calls: int = 0  # calls since the last check that passed
    found_at_call: Optional[int] = None  # the call whose check found it
    found_because: Optional[str] = None  # why that call was checked: first, shape, values...
    found_period: Optional[int] = None  # (sampled) the period in force then
    found_stride: Optional[int] = None  # (values) the stride of the read that found it
    backward: str = "not checked yet"  # the backward pass's verdict
    mismatch: Optional[Dict[str, Any]] = None  # the first value the judge rejected
    judge: Optional[Dict[str, Any]] = None  # the last check's verdicts and errors vs float64
    seconds: float = 0.0  # spent checking
    # how the last check ran its eager and float64 references: replayed as a captured
    # device graph, or op by op and why (sentinel.runs.replay)
    references: str = "run op by op"
    # checks whose references ran beside the program, the verdict read at a later call
    # (``check`` mode, references replayed, gradients off: sentinel.runs.deferred)
    checks_read_later: int = 0
    repro: str = ""  # the repro directory of a graph found wrong ("" when none was written)
    healed: str = ""  # the remembered fix it was compiled with (sentinel.fixes)
    # the store of rungs for it: read (where its ladder started is under values), none yet,
    # or why it keeps none (sentinel.scheduling.rungs)
    rungs: str = ""
    bisect: Optional[Dict[str, Any]] = None  # the background bisection started at exit


FIELDS: FrozenSet[str] = frozenset(f.name for f in dataclasses.fields(GraphRecord))


def new(graph: str, where: str, **fields: Any) -> Dict[str, Any]:
    """A record with every declared field: ``graph``, ``where``, ``fields``, the defaults."""
    return dataclasses.asdict(GraphRecord(graph, where, **fields))


def section() -> Dict[str, Any]:
    """``report().verify``, created on first use: mode, calls, graphs and totals."""
    with record.LOCK:
        found = record.REPORT.verify
        if not found:
            found.update({"mode": "off", "calls": 0, "graphs": [],
                          "totals": dict.fromkeys(ALL, 0)})
        return found
