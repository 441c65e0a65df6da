"""The change record: what rocm-autopatch applied, skipped or failed in this process.

One ``Report`` per process (``REPORT``), filled in by the hooks and read by
``rocm_autopatch.report()`` and ``rocm-autopatch doctor``. ``to_dict()`` is JSON-safe.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

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
    return repr(value)


@dataclass
class ConfigChange:
    key: str  # "inductor.max_autotune", "dynamo.recompile_limit"
    before: Any
    after: Any
    source: str  # "profile", "override" or "environment"
    status: str
    reason: str = ""
    wanted: Any = None
    torch_key: str = ""  # the name the running torch uses, when it differs


@dataclass
class CompileRewrite:
    before: Dict[str, Any]
    after: Dict[str, Any]
    call_site: str
    count: int = 1


@dataclass
class Report:
    active: bool = False
    platform: str = "unknown"  # "rocm", "cuda", "cpu" once torch is imported
    forced: bool = False
    mode: str = "unset"
    profile: str = "safe"
    torch_version: Optional[str] = None
    hip_version: Optional[str] = None
    reason: str = "torch not imported yet"
    config: List[ConfigChange] = field(default_factory=list)
    compile_rewrites: List[CompileRewrite] = field(default_factory=list)
    fixes: Dict[str, Dict[str, str]] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return jsonable(asdict(self))

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
