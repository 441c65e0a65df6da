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

import functools
import threading
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rocm_autopatch import record, settings, torch_releases
from rocm_autopatch.config import profiles
from rocm_autopatch.record import APPLIED, FAILED, PENDING, SKIPPED, UNCHANGED, ConfigChange

Warn = Callable[[Any, str], Any]
Wanted = Tuple[profiles.Setting, str, Any, str]  # the rule, torch's name, value, source
_MISSING = object()


def torch_key(module: ModuleType, setting: profiles.Setting, short: str) -> Optional[str]:
    """The name the running torch uses for ``short`` (the key without its namespace)."""
    for name in (short, *setting.older_names):
        found = torch_releases.config_entry(module, name)
        if torch_releases.config_has_key(module, name) and getattr(found, "alias", None) is None:
            return name
    for name in (short, *setting.older_names):  # an alias is still better than nothing
        if torch_releases.config_has_key(module, name):
            return name
    return None


def read(module: ModuleType, key: str) -> Any:
    return getattr(module, key, _MISSING)


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
    if setting.broken_by:
        from rocm_autopatch.config import broken_settings

        broken = broken_settings.why(setting.broken_by)
        if broken:
            return f"{setting.key}={setting.value!r} not used: {broken}"
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


MODULES = {"inductor": "torch._inductor.config", "dynamo": "torch._dynamo.config"}


def record_pending(profile: str) -> None:
    """At ``import torch``: every key ``profile`` will set, recorded ``pending`` until torch
    imports its config module (Inductor's at the first compile; importing it earlier would
    double every torch program's import time), so that ``report().config`` says from the
    start what will apply. A key already applied keeps its entry."""
    layers: Dict[str, profiles.Setting] = {}
    for setting in profiles.PROFILES[profile]:
        layers[setting.key] = setting  # a later layer's entry wins (perf over safe)
    for key, setting in layers.items():
        if record.config_entry(key) is None:
            owner = MODULES[key.split(".", 1)[0]]
            record.set_config(ConfigChange(
                key, None, None, "profile", PENDING,
                f"set when torch imports {owner} (Inductor's: at the first compile)",
                wanted=setting.value, why=setting.reason, ref=setting.ref))


def apply(module: ModuleType, namespace: str, profile: str,
          overrides: Dict[str, Tuple[Any, str]], warn: Warn,
          archs: Optional[Callable[[], List[str]]] = None) -> List[ConfigChange]:
    """Apply ``profile``'s ``namespace`` ("inductor"/"dynamo") settings to ``module``."""
    if archs is None:
        from rocm_autopatch import probe

        archs = probe.arch_names
    prefix = namespace + "."
    wanted: Dict[str, Wanted] = {}  # key -> (setting, torch's name, value, source)
    not_here: Dict[str, str] = {}  # key -> why a later layer's entry does not apply
    changes: List[ConfigChange] = []
    for setting in profiles.PROFILES[profile]:
        if setting.key.startswith(prefix):
            changes = _plan(module, setting, prefix, archs, wanted, not_here, changes)
    for short, (value, var) in overrides.items():
        key = prefix + short
        # The override's own record: its variable is its reason, the profile's rule is not.
        raw = settings.raw(var)
        why = f"{var}={value if raw is None else raw!r} in the environment (INDUCTOR_<KEY>)"
        setting = profiles.Setting(key, value, why)
        wanted[key] = (setting, short, value, "override")
        changes = [c for c in changes if c.key != key]
    for key, (setting, name, value, source) in wanted.items():
        try:
            change = _apply_one(module, key, setting, name, value, source, profile,
                                not_here.get(key, ""), prefix, warn)
        except Exception as exc:  # noqa: BLE001 - one key failing must not stop the rest
            change = ConfigChange(key, None, None, source, FAILED,
                                  f"applying it raised {exc!r}", wanted=value, torch_key=name)
        changes.append(change)
    _held_in_every_thread(module, changes, prefix)
    for change in changes:
        record.set_config(change)
    return changes


def _plan(module: ModuleType, setting: profiles.Setting, prefix: str,
          archs: Callable[[], List[str]], wanted: Dict[str, Wanted], not_here: Dict[str, str],
          changes: List[ConfigChange]) -> List[ConfigChange]:
    """One rule of the profile: wanted, or skipped with its reason (a later rule for the
    same key replaces an earlier one's record); the changes so far."""
    name = torch_key(module, setting, setting.key[len(prefix):])
    skipped = functools.partial(ConfigChange, setting.key, wanted=setting.value,
                                why=setting.reason, ref=setting.ref)
    if name is None:
        older = f" (nor {', '.join(setting.older_names)})" if setting.older_names else ""
        return [c for c in changes if c.key != setting.key] + [
            skipped(None, None, "profile", SKIPPED, "not in this torch's config" + older)]
    failed = _condition_fails(setting, archs)
    if failed:
        not_here[setting.key] = failed
        if setting.key not in wanted:  # no earlier layer sets it: torch's value stays
            value = read(module, name)
            return [c for c in changes if c.key != setting.key] + [
                skipped(value, value, "profile", SKIPPED, failed)]
        return changes
    if setting.kept_by and _flag(setting.kept_by):
        wanted.pop(setting.key, None)
        value = read(module, name)
        return [c for c in changes if c.key != setting.key] + [
            skipped(value, value, "environment", SKIPPED, f"{setting.kept_by}=1: torch's own "
                    "value is kept, so graphs work as torch makes them")]
    set_by = [v for v in setting.env if settings.raw(v) is not None]
    if setting.env_wins and set_by:
        wanted.pop(setting.key, None)
        value, var = read(module, name), set_by[0]
        return changes + [skipped(value, value, "environment", SKIPPED,
                                  f"{var}={settings.raw(var)} is set: your value is kept")]
    wanted[setting.key] = (setting, name, setting.value, "profile")
    return changes


def _held_in_every_thread(module: ModuleType, changes: List[ConfigChange],
                          prefix: str) -> None:
    """A value that only this thread sees is not applied (torch >= 2.12 keeps assignments
    per thread): read back in a new thread, it fails where it differs."""
    done = [c for c in changes if c.status in (APPLIED, UNCHANGED)]
    names = [c.torch_key or c.key[len(prefix):] for c in done]
    elsewhere = _read_in_new_thread(module, names)
    for change, name in zip(done, names):
        if elsewhere.get(name, _MISSING) != change.wanted:
            change.status = FAILED
            change.reason = (f"a new thread reads {elsewhere.get(name)!r}: the value "
                             "holds in the importing thread only")


def _apply_one(module: ModuleType, key: str, setting: profiles.Setting, name: str, value: Any,
               source: str, profile: str, not_here: str, prefix: str, warn: Warn
               ) -> ConfigChange:
    """Write one key and read it back: its change record."""
    before = read(module, name)
    deprecated = getattr(torch_releases.config_entry(module, name), "deprecated", False)
    noop = profiles.NOOP_KEYS.get(key) or ("deprecated in this torch" if deprecated else "")
    if noop:
        return ConfigChange(key, before, before, source, SKIPPED, f"no-op: {noop}",
                            wanted=value, torch_key=name)
    value = _bound(setting, before) if source == "profile" else value
    if source == "profile":
        _hostile_env(setting, value, before, profile, warn)
    try:
        if before != value:
            torch_releases.set_config_default(module, name, value)
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
    force = getattr(torch_releases.config_entry(module, key), "env_value_force", _MISSING)
    if force is not _MISSING and read(module, key) == force:
        return "pinned by a TORCHINDUCTOR_* force variable in the environment"
    return "torch reads another value back (set earlier in code in this thread?)"
