"""``INDUCTOR_*`` environment overrides: find them, map them to config keys, parse them.

Any Inductor key can be set as ``INDUCTOR_<KEY>``, upper case, with a nested key's dot
written ``__`` (``INDUCTOR_TRITON__CUDAGRAPHS``; a single ``_`` works where it is not
ambiguous). Seed 000's short names are aliases. Values are parsed by the key's type on
the running torch, never evaluated. Bad names and values warn once and are ignored.
"""

from __future__ import annotations

import types
import typing
from types import ModuleType
from typing import Any, Dict, List, Mapping, Optional, Tuple

from rocm_autopatch import settings, torch_releases
from rocm_autopatch.config import source_types
from rocm_autopatch.settings import FALSE_WORDS, NONE_WORDS, OVERRIDE_PREFIX, TRUE_WORDS
from rocm_autopatch.settings import override_var as var_name

PREFIX = OVERRIDE_PREFIX
# Seed 000's names whose key isn't simply the upper-cased name.
ALIASES = {"INDUCTOR_COORD_DESCENT": "coordinate_descent_tuning"}


def config_keys(module: ModuleType) -> List[str]:
    entries = getattr(module, "_config", None)
    if isinstance(entries, dict):
        return sorted(entries)
    return sorted(k for k in getattr(module, "_allowed_keys", ()) if not k.startswith("_"))


def env_names(keys: List[str]) -> Dict[str, str]:
    """Env variable name -> config key, for every key."""
    names: Dict[str, str] = {}
    loose: Dict[str, List[str]] = {}
    for key in keys:
        names[var_name(key)] = key
        loose.setdefault(PREFIX + key.upper().replace(".", "_"), []).append(key)
    for name, owners in loose.items():
        if name not in names and len(owners) == 1:
            names[name] = owners[0]
    for name, key in ALIASES.items():
        if key in keys:
            names.setdefault(name, key)
    return names


def key_type(module: ModuleType, key: str) -> Any:
    """The type ``key``'s value is parsed by: what the running torch declares; where it
    declares none, or only NoneType (a None default, its annotation unseen), what its
    config's source declares (``source_types``)."""
    found = torch_releases.config_entry(module, key)
    declared = getattr(found, "value_type", None)
    if declared is not None and declared is not type(None):
        return declared
    # torch with _ConfigEntry but no value_type (< 2.6), or an older one whose _config
    # maps key -> value
    default = found.default if hasattr(found, "default") else getattr(module, key)
    if default is None:  # torch 2.4: ``cpp.simdlen``; 2.13: keys a subclass inherits
        return source_types.declared(module, key) or type(None)
    return type(default)


# ``int | None`` (PEP 604, how torch >= 2.10 writes its config types) is a types.UnionType,
# not a typing.Union: both are unions here (types.UnionType exists from Python 3.10).
_UNIONS = tuple(u for u in (typing.Union, getattr(types, "UnionType", None)) if u is not None)


def describe(kind: Any) -> str:
    args = typing.get_args(kind)
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in _UNIONS and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return " or ".join(describe(a) for a in inner) + " or none"
    if kind is bool:
        return "a boolean (1/0, true/false, on/off, yes/no)"
    if kind is int:
        return "an integer"
    if kind is float:
        return "a number"
    if kind is str:
        return "a string"
    return f"nothing: {getattr(kind, '__name__', kind)} keys can't be set from the environment"


def parse(raw: str, kind: Any) -> Any:
    """Parse ``raw`` as ``kind``; ValueError (saying what is accepted) when it isn't one."""
    text = raw.strip()
    low = text.lower()
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        for allowed in typing.get_args(kind):
            if str(allowed).lower() == low or (isinstance(allowed, bool) and
                                               low in (TRUE_WORDS if allowed else FALSE_WORDS)):
                return allowed
        raise ValueError(describe(kind))
    if origin in _UNIONS:
        args = typing.get_args(kind)
        if type(None) in args and low in NONE_WORDS:
            return None
        for option in args:
            if option is type(None):
                continue
            try:
                return parse(raw, option)
            except ValueError:
                pass
        raise ValueError(describe(kind))
    if kind is bool:
        if low in TRUE_WORDS:
            return True
        if low in FALSE_WORDS:
            return False
        raise ValueError(describe(kind))
    if kind is int:
        try:
            return int(text, 10)
        except ValueError:
            raise ValueError(describe(kind)) from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(describe(kind)) from None
    if kind is str:
        return raw
    raise ValueError(describe(kind))


def read(module: ModuleType, environ: Optional[Mapping[str, str]] = None,
         warn: Any = None) -> Dict[str, Tuple[Any, str]]:
    """{config key: (value, env var name)} for each valid ``INDUCTOR_*`` variable set.

    ``warn(key, message)`` is called once per bad variable; the variable is then ignored.
    """
    environ = settings.environment() if environ is None else environ
    keys = config_keys(module)
    names = env_names(keys)
    found: Dict[str, Tuple[Any, str]] = {}
    for var in sorted(environ):
        if not var.startswith(PREFIX):
            continue
        raw = environ[var]
        key = names.get(var)
        if key is None:
            import difflib  # only for a bad name: not on every start

            close = difflib.get_close_matches(var, list(names), n=3, cutoff=0.6)
            hint = f"; closest: {', '.join(close)}" if close else ""
            if warn:
                warn(("unknown", var), f"{var} names no torch._inductor.config key on this "
                     f"torch; ignored{hint}. Form: INDUCTOR_<KEY>, nested keys with __ "
                     "(INDUCTOR_TRITON__CUDAGRAPHS).")
            continue
        kind = key_type(module, key)
        try:
            value = parse(raw, kind)
        except ValueError as exc:
            if warn:
                warn(("value", var), f"{var}={raw!r} is not valid for inductor.{key}; "
                     f"accepted: {exc}. Keeping the profile's value.")
            continue
        found[key] = (value, var)
    return found
