"""The change record: what rocm-autopatch applied, skipped or failed in this process.

One ``Report`` per process (``REPORT``), filled in by the hooks and read by
``rocm_autopatch.report()`` and ``rocm-autopatch doctor``. ``to_dict()`` is JSON-safe.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

# Statuses of a config entry.
APPLIED = "applied"  # our value is now what torch reads
UNCHANGED = "unchanged"  # torch already had the value we wanted
SKIPPED = "skipped"  # not touched, see reason (key missing, no-op on this torch...)
FAILED = "failed"  # we tried and torch does not read our value


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


class CompileRewrite(_Fields):
    before: Dict[str, Any] = {}
    after: Dict[str, Any] = {}
    call_site: str = ""
    count: int = 1
    reason: str = ""


class Report(_Fields):
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
    fixes: Dict[str, Dict[str, str]] = {}
    # "function (file:line)" -> calls that ran eagerly because a graph was being captured
    eager_in_capture: Dict[str, int] = {}
    # The numerics sentinel (ROCM_AUTOPATCH_VERIFY): {"mode", "calls", "graphs": [...],
    # "totals"}; empty while it is off (rocm_autopatch/verify.py)
    verify: Dict[str, Any] = {}
    errors: List[str] = []
    warnings: List[str] = []

    def config_entry(self, key: str) -> Optional[ConfigChange]:
        for entry in self.config:
            if entry.key == key:
                return entry
        return None

    def set_config(self, change: ConfigChange) -> None:
        with LOCK:
            self.config = [c for c in self.config if c.key != change.key]
            self.config.append(change)


LOCK = threading.RLock()
REPORT = Report()

# The compile report: the variable that asks for it, and its collector once armed
# (``compile_report.Collector``; None when the variable is unset: nothing is counted).
ENV_REPORT = "ROCM_AUTOPATCH_REPORT"
COMPILE: Optional[Any] = None
# The numerics sentinel's variable (``verify``; read here so that off imports nothing).
ENV_VERIFY = "ROCM_AUTOPATCH_VERIFY"


def frame_label(filename: str, line: int, name: str) -> str:
    """How a compiled frame is named everywhere a user reads it: ``f (file.py:12)``."""
    return f"{name} ({filename}:{line})"


def hook_failed(module_name: str, target: str, exc: BaseException) -> None:
    from rocm_autopatch import log

    message = f"{target} (on import of {module_name}) failed: {exc!r}"
    with LOCK:
        REPORT.errors.append(message)
    log.warn_once(("hook", target), f"{message}; the rest of rocm-autopatch still applies.")
