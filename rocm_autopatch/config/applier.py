"""The config applier: put a profile's values (and INDUCTOR_* overrides) into torch's config.

Values are written at the level torch keeps for environment defaults
(``_ConfigEntry.env_value_default``) where the running torch has one. That level is
global, so the values hold in every thread and in threads started later (from torch
2.12 a plain assignment is per-thread), and it sits below assignments in code, so a
value the user's own code sets later still wins. Older torch without that level gets a
plain assignment, which is global there. Every value is read back, in this thread and in
a fresh one, before it is reported ``applied``.
"""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rocm_autopatch.config import profiles, settings
from rocm_autopatch.reporting import record
from rocm_autopatch.reporting.record import APPLIED, FAILED, SKIPPED, UNCHANGED, ConfigChange

Warn = Callable[[Any, str], Any]
_MISSING = object()


def _entries(module: ModuleType) -> Optional[Dict[str, Any]]:
    """torch's table of config keys: ``_ConfigEntry`` objects, or plain values (older torch)."""
    entries = module.__dict__.get("_config")
    return entries if isinstance(entries, dict) else None


def entry(module: ModuleType, key: str) -> Any:
    entries = _entries(module)
    return entries.get(key) if entries is not None else None


def has_key(module: ModuleType, key: str) -> bool:
    entries = _entries(module)
    return key in entries if entries is not None else hasattr(module, key)


def torch_key(module: ModuleType, setting: profiles.Setting, short: str) -> Optional[str]:
    """The name the running torch uses for ``short`` (the key without its namespace)."""
    for name in (short, *setting.older_names):
        if has_key(module, name) and getattr(entry(module, name), "alias", None) is None:
            return name
    for name in (short, *setting.older_names):  # an alias is still better than nothing
        if has_key(module, name):
            return name
    return None


def read(module: ModuleType, key: str) -> Any:
    return getattr(module, key, _MISSING)


def set_value(module: ModuleType, key: str, value: Any) -> None:
    """Write ``value`` below user assignments and above torch's own default."""
    found = entry(module, key)
    alias = getattr(found, "alias", None)
    if isinstance(alias, str) and "." in alias:
        # An alias (inductor's force_disable_caches is torch.compiler.config's): written
        # where it lives, so that every thread reads it (torch >= 2.12 keeps assignments
        # per thread).
        owner, _, name = alias.rpartition(".")
        target = sys.modules.get(owner) or importlib.import_module(owner)
        if target is not module:
            set_value(target, name, value)
            return
    if found is None or not hasattr(found, "env_value_default") or alias is not None:
        setattr(module, key, value)
        return
    found.env_value_default = value
    # Invalidate torch's cached dict/hash of the config (names vary by release).
    dirty = module.__dict__.get("_hash_dirty_var")
    if dirty is not None:
        dirty.set(True)
    if "_is_dirty" in module.__dict__:
        module.__dict__["_is_dirty"] = True
    mark = getattr(module, "_mark_get_dict_dirty", None)
    if callable(mark):
        mark(key)


def _read_in_new_thread(module: ModuleType, keys: Sequence[str]) -> Dict[str, Any]:
    seen: Dict[str, Any] = {}

    def run() -> None:
        for key in keys:
            seen[key] = read(module, key)

    thread = threading.Thread(target=run, name="rocm-autopatch-verify", daemon=True)
    thread.start()
    thread.join()
    return seen


def _flag(var: str) -> bool:
    from rocm_autopatch import log

    return log.setting(var, warn=False)  # the compile guard warns about a bad value


def _hostile_env(setting: profiles.Setting, wanted: Any, before: Any, profile: str,
                 warn: Warn) -> None:
    for var in setting.env:
        value = settings.raw(var)
        if value is None or before == wanted:
            continue
        keep = settings.override_var(setting.key.split(".", 1)[1])
        warn(("env", var), f"{var}={value} is set in this environment (container "
             f"images do this); the {profile} profile sets {setting.key}={wanted!r} instead: "
             f"{setting.reason}. To keep it, set {keep}={value}.")


def _condition_fails(setting: profiles.Setting, archs: Callable[[], List[str]]) -> str:
    """Why ``setting`` does not apply on this machine ("" when it does)."""
    if setting.not_on_archs:
        hit = [a for a in archs() if a.startswith(setting.not_on_archs)]
        if hit:
            return (f"{setting.key}={setting.value!r} not used on {', '.join(hit)} "
                    f"(KFD topology): {setting.ref}")
    return ""


def _bound(setting: profiles.Setting, before: Any) -> Any:
    """The value to write for a limit (``at_least``) or a cap (``at_most``)."""
    value = setting.value
    if setting.at_most:
        if setting.cap_by == profiles.USABLE_CPUS:
            from rocm_autopatch import probe

            value = min(value, probe.usable_cpus())
        if isinstance(before, int) and not isinstance(before, bool) and 0 < before < value:
            value = before  # never raise a cap someone lowered
    if setting.at_least and isinstance(before, int) and before > value:
        value = before  # never lower a limit someone raised
    return value


def apply(module: ModuleType, namespace: str, profile: str,
          overrides: Dict[str, Tuple[Any, str]], warn: Warn,
          archs: Optional[Callable[[], List[str]]] = None) -> List[ConfigChange]:
    """Apply ``profile``'s ``namespace`` ("inductor"/"dynamo") settings to ``module``."""
    if archs is None:
        from rocm_autopatch import probe

        archs = probe.arch_names
    prefix = namespace + "."
    wanted: Dict[str, Tuple[profiles.Setting, str, Any, str]] = {}  # key -> (setting, ...)
    not_here: Dict[str, str] = {}  # key -> why a later layer's entry does not apply
    changes: List[ConfigChange] = []
    for setting in profiles.PROFILES[profile]:
        if not setting.key.startswith(prefix):
            continue
        short = setting.key[len(prefix):]
        name = torch_key(module, setting, short)
        if name is None:
            changes = [c for c in changes if c.key != setting.key]
            changes.append(ConfigChange(setting.key, None, None, "profile", SKIPPED,
                                        "not in this torch's config" + (
                                            f" (nor {', '.join(setting.older_names)})"
                                            if setting.older_names else ""),
                                        wanted=setting.value, why=setting.reason,
                                        ref=setting.ref))
            continue
        failed = _condition_fails(setting, archs)
        if failed:
            not_here[setting.key] = failed
            continue
        if setting.kept_by and _flag(setting.kept_by):
            wanted.pop(setting.key, None)
            changes = [c for c in changes if c.key != setting.key]
            value = read(module, name)
            changes.append(ConfigChange(setting.key, value, value, "environment", SKIPPED,
                                        f"{setting.kept_by}=1: torch's own value is kept, so "
                                        "graphs work as torch makes them",
                                        wanted=setting.value, why=setting.reason,
                                        ref=setting.ref))
            continue
        set_by = [v for v in setting.env if settings.raw(v) is not None]
        if setting.env_wins and set_by:
            wanted.pop(setting.key, None)
            var = set_by[0]
            changes.append(ConfigChange(setting.key, read(module, name), read(module, name),
                                        "environment", SKIPPED,
                                        f"{var}={settings.raw(var)} is set: your value is kept",
                                        wanted=setting.value, why=setting.reason,
                                        ref=setting.ref))
            continue
        wanted[setting.key] = (setting, name, setting.value, "profile")
    for short, (value, var) in overrides.items():
        key = prefix + short
        # The override's own record: its variable is its reason, the profile's rule is not.
        raw = settings.raw(var)
        why = f"{var}={value if raw is None else raw!r} in the environment (INDUCTOR_<KEY>)"
        setting = profiles.Setting(key, value, why)
        wanted[key] = (setting, short, value, "override")
        changes = [c for c in changes if c.key != key]

    applied_keys: List[Tuple[str, str]] = []
    for key, (setting, name, value, source) in wanted.items():
        try:
            change = _apply_one(module, key, setting, name, value, source, profile,
                                not_here.get(key, ""), prefix, warn)
        except Exception as exc:  # noqa: BLE001 - one key failing must not stop the rest
            change = ConfigChange(key, None, None, source, FAILED,
                                  f"applying it raised {exc!r}", wanted=value, torch_key=name)
        changes.append(change)
        if change.status in (APPLIED, UNCHANGED):
            applied_keys.append((key, name))

    # A value that only this thread sees is not applied (torch >= 2.12 is per-thread).
    elsewhere = _read_in_new_thread(module, [name for _, name in applied_keys])
    for change in changes:
        if change.status in (APPLIED, UNCHANGED):
            name = change.torch_key or change.key[len(prefix):]
            if elsewhere.get(name, _MISSING) != change.wanted:
                change.status = FAILED
                change.reason = (f"a new thread reads {elsewhere.get(name)!r}: the value "
                                 "holds in the importing thread only")
    for change in changes:
        record.REPORT.set_config(change)
    return changes


def _apply_one(module: ModuleType, key: str, setting: profiles.Setting, name: str, value: Any,
               source: str, profile: str, not_here: str, prefix: str, warn: Warn
               ) -> ConfigChange:
    """Write one key and read it back: its change record."""
    before = read(module, name)
    noop = profiles.NOOP_KEYS.get(key) or (
        "deprecated in this torch" if getattr(entry(module, name), "deprecated", False) else "")
    if noop:
        return ConfigChange(key, before, before, source, SKIPPED, f"no-op: {noop}",
                            wanted=value, torch_key=name)
    value = _bound(setting, before) if source == "profile" else value
    if source == "profile":
        _hostile_env(setting, value, before, profile, warn)
    try:
        if before != value:
            set_value(module, name, value)
    except Exception as exc:  # noqa: BLE001 - reported as this key's failure
        return ConfigChange(key, before, read(module, name), source, FAILED,
                            f"setting it raised {exc!r}", wanted=value, torch_key=name)
    after = read(module, name)
    status = UNCHANGED if before == value else APPLIED
    reason = "" if status == APPLIED else "torch already had this value"
    if after != value:
        status, reason = FAILED, _why_not(module, name)
    if not_here:
        reason = (reason + "; " if reason else "") + not_here
    why, ref = (setting.reason, setting.ref) if source == "profile" else (
        f"set by {setting.reason}", "")
    return ConfigChange(key, before, after, source, status, reason, wanted=value,
                        torch_key=name if name != key[len(prefix):] else "", why=why, ref=ref)


def _why_not(module: ModuleType, key: str) -> str:
    force = getattr(entry(module, key), "env_value_force", _MISSING)
    if force is not _MISSING and read(module, key) == force:
        return "pinned by a TORCHINDUCTOR_* force variable in the environment"
    return "torch reads another value back (set earlier in code in this thread?)"
