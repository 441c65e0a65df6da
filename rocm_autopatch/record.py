"""The change record: what rocm-autopatch applied, skipped or failed in this process.

One ``Report`` per process (``REPORT``), filled in by the hooks and read by
``rocm_autopatch.report()`` and ``rocm-autopatch doctor``. ``to_dict()`` is JSON-safe.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

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
    """A small record type. Not a dataclass: creating four dataclasses cost ~2.5 ms at
    ``import torch`` time (BENCHMARKS.md, hook cost)."""

    _fields: Tuple[Tuple[str, Callable[[], Any]], ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = [name for name, _ in self._fields]
        kwargs.update(zip(names, args))
        for name, default in self._fields:
            setattr(self, name, kwargs.pop(name) if name in kwargs else default())
        if kwargs:
            raise TypeError(f"unknown fields for {type(self).__name__}: {sorted(kwargs)}")

    def to_dict(self) -> Dict[str, Any]:
        return {name: jsonable(getattr(self, name)) for name, _ in self._fields}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_dict() == other.to_dict()  # type: ignore[union-attr]

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name, _ in self._fields)
        return f"{type(self).__name__}({inner})"


def _const(value: Any) -> Callable[[], Any]:
    return lambda: value


class ConfigChange(_Fields):
    key: str  # "inductor.max_autotune", "dynamo.recompile_limit"
    before: Any
    after: Any
    source: str  # "profile", "override" or "environment"
    status: str
    reason: str
    wanted: Any
    torch_key: str  # the name the running torch uses, when it differs
    _fields = (("key", _const("")), ("before", _const(None)), ("after", _const(None)),
               ("source", _const("")), ("status", _const("")), ("reason", _const("")),
               ("wanted", _const(None)), ("torch_key", _const("")))


class CompileRewrite(_Fields):
    before: Dict[str, Any]
    after: Dict[str, Any]
    call_site: str
    count: int
    _fields = (("before", dict), ("after", dict), ("call_site", _const("")),
               ("count", _const(1)))


class Report(_Fields):
    active: bool
    platform: str  # "rocm", "cuda", "cpu" once torch is imported
    forced: bool
    mode: str
    profile: str
    torch_version: Optional[str]
    hip_version: Optional[str]
    reason: str
    config: List[ConfigChange]
    compile_rewrites: List[CompileRewrite]
    fixes: Dict[str, Dict[str, str]]
    errors: List[str]
    warnings: List[str]
    _fields = (("active", _const(False)), ("platform", _const("unknown")),
               ("forced", _const(False)), ("mode", _const("unset")), ("profile", _const("safe")),
               ("torch_version", _const(None)), ("hip_version", _const(None)),
               ("reason", _const("torch not imported yet")), ("config", list),
               ("compile_rewrites", list), ("fixes", dict), ("errors", list),
               ("warnings", list))

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


def hook_failed(module_name: str, target: str, exc: BaseException) -> None:
    from rocm_autopatch import log

    message = f"{target} (on import of {module_name}) failed: {exc!r}"
    with LOCK:
        REPORT.errors.append(message)
    log.warn_once(("hook", target), f"{message}; the rest of rocm-autopatch still applies.")
