"""The change record: what rocm-autopatch applied, skipped or failed in this process.

One ``Report`` per process (``REPORT``), filled in by the hooks and read by
``rocm_autopatch.report()`` and ``rocm-autopatch doctor``. ``to_dict()`` is JSON-safe.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

# Statuses of a config entry.
PENDING = "pending"  # the profile will set it when torch imports that config module
APPLIED = "applied"  # our value is now what torch reads
UNCHANGED = "unchanged"  # torch already had the value we wanted
SKIPPED = "skipped"  # not touched, see reason (key missing, no-op on this torch...)
FAILED = "failed"  # we tried and torch does not read our value
# Statuses of a fix (``Report.fixes``), besides APPLIED and SKIPPED.
NOT_NEEDED = "not needed"  # this torch does not have the problem
OFF = "off"  # a feature the user did not turn on


def jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, _Fields):
        return value.to_dict()
    return repr(value)


class _Fields:
    """A small record type: fields are the class's annotations, defaults its attributes
    (a list or dict default is copied per instance). Not a dataclass: creating four
    dataclasses cost ~2.5 ms at ``import torch`` time (BENCHMARKS.md, hook cost)."""

    _fields: Tuple[str, ...] = ()

    def __init_subclass__(cls) -> None:
        cls._fields = tuple(name for name in cls.__annotations__ if not name.startswith("_"))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(zip(self._fields, args))
        for name in self._fields:
            if name in kwargs:
                value = kwargs.pop(name)
            else:
                value = getattr(type(self), name)
                if isinstance(value, (list, dict)):
                    value = type(value)()
            setattr(self, name, value)
        if kwargs:
            raise TypeError(f"unknown fields for {type(self).__name__}: {sorted(kwargs)}")

    def to_dict(self) -> Dict[str, Any]:
        return {name: jsonable(getattr(self, name)) for name in self._fields}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_dict() == other.to_dict()  # type: ignore[union-attr]

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({inner})"


class ConfigChange(_Fields):
    key: str = ""  # "inductor.max_autotune", "dynamo.recompile_limit"
    before: Any = None
    after: Any = None
    source: str = ""  # "profile", "override" or "environment"
    status: str = ""
    reason: str = ""
    wanted: Any = None
    torch_key: str = ""  # the name the running torch uses, when it differs
    why: str = ""  # the rule's reason, for a user
    ref: str = ""  # its public evidence (issue/PR, torch source path), or that there is none


class Fix(Dict[str, str]):
    """One fix's record: ``status``, ``reason`` (for a user) and ``ref`` (public evidence).
    A dict, so that ``report().fixes`` is JSON as it is."""

    def __init__(self, status: str, reason: str, ref: str = "") -> None:
        super().__init__(status=status, reason=reason, ref=ref)


class CompileRewrite(_Fields):
    before: Dict[str, Any] = {}
    after: Dict[str, Any] = {}
    call_site: str = ""
    count: int = 1
    reason: str = ""


class Report(_Fields):
    """What rocm-autopatch did in this process, as ``rocm_autopatch.report()`` returns it.

    Fields: ``active`` (applied here?), ``platform`` ("rocm", "cuda", "cpu"), ``forced``
    (``ROCM_AUTOPATCH=force``), ``mode``, ``profile`` ("safe"/"perf"), ``torch_version``,
    ``hip_version``, ``reason`` (why active or not), ``activation`` (the start-up path that
    ran), ``config`` (one ``ConfigChange`` per key: before, after, source, status, why,
    ref; status ``pending`` until torch imports that config module, then ``applied``,
    ``unchanged``, ``skipped`` or ``failed``), ``compile_rewrites`` (the ``torch.compile``
    calls rewritten, where, how often), ``fixes`` (each fix's status, reason, public ref),
    ``eager_in_capture``, ``verify`` (the numerics sentinel: mode, graphs, totals),
    ``errors`` and ``warnings``. ``to_dict()`` is JSON-safe.
    """

    active: bool = False
    platform: str = "unknown"  # "rocm", "cuda", "cpu" once torch is imported
    forced: bool = False
    mode: str = "unset"
    profile: str = "safe"
    torch_version: Optional[str] = None
    hip_version: Optional[str] = None
    reason: str = "torch not imported yet"
    # {"via": the start-up path that installed the trigger (.pth, .start, torch.backends
    # entry point, launcher, doctor), "reached": every path that reached it, in order}
    activation: Dict[str, Any] = {}
    config: List[ConfigChange] = []
    compile_rewrites: List[CompileRewrite] = []
    fixes: Dict[str, Fix] = {}
    # "function (file:line)" -> calls that ran eagerly because a graph was being captured
    eager_in_capture: Dict[str, int] = {}
    # The numerics sentinel (ROCM_AUTOPATCH_VERIFY): {"mode", "calls", "graphs": [...],
    # "totals"}; empty while it is off (rocm_autopatch/sentinel/)
    verify: Dict[str, Any] = {}
    errors: List[str] = []
    warnings: List[str] = []

    def __repr__(self) -> str:
        """A few lines, not the whole record (``to_dict()`` has everything)."""
        def tally(statuses: List[str]) -> str:
            counts: Dict[str, int] = {}
            for status in statuses:
                counts[status] = counts.get(status, 0) + 1
            return ", ".join(f"{n} {status}" for status, n in counts.items())

        keys = tally([c.status for c in self.config]) or "none yet"
        fixes = tally([fix["status"] for fix in self.fixes.values()])
        return (f"<rocm-autopatch report: {'active' if self.active else 'not active'}, "
                f"{self.platform}, torch {self.torch_version}, profile {self.profile}\n"
                f"  {self.reason}\n  config keys: {keys}\n  fixes: {fixes or 'none'}\n"
                f"  torch.compile calls rewritten: {len(self.compile_rewrites)}; numerics "
                f"sentinel: {self.verify.get('mode', 'off')}; warnings: {len(self.warnings)}, "
                f"errors: {len(self.errors)} (to_dict() has everything)>")


LOCK = threading.RLock()
REPORT = Report()

# The compile report's collector once armed (``compile_report.Collector``; None while
# ROCM_AUTOPATCH_REPORT is unset: nothing is counted).
COMPILE: Optional[Any] = None


def config_entry(key: str) -> Optional[ConfigChange]:
    """The record's entry for config ``key`` ("inductor.max_autotune"); None if none."""
    with LOCK:
        return next((entry for entry in REPORT.config if entry.key == key), None)


def set_config(change: ConfigChange) -> None:
    """Record what became of one config key (its earlier entry replaced)."""
    with LOCK:
        REPORT.config = [c for c in REPORT.config if c.key != change.key] + [change]


def fix(name: str, status: str, reason: str, ref: str = "") -> None:
    """Record what became of one fix (the compile guard, the capture policy, the
    watchdog, the numerics sentinel): the one writer of ``Report.fixes``."""
    with LOCK:
        REPORT.fixes[name] = Fix(status, reason, ref)
