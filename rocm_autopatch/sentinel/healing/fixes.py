"""Fixes that ``rocm-autopatch bisect`` found, remembered for the next run: the store, and
applying one fix to one graph's compile.

A fix is the one change that made a graph match eager: a compiler step left out (one
decomposition, one Inductor lowering, one pass), one Inductor setting, or one knob
(``bisect.KNOBS``). It is kept with the graph's fingerprint (a hash of its code,
``repro.fingerprint``) and the torch, Triton and GPU it was found on, in one JSON file:
``ROCM_AUTOPATCH_FIXES``, else ``$XDG_CACHE_HOME/rocm-autopatch/fixes.json`` (``~/.cache``
without it); ``off`` neither reads nor writes it. An upgrade of any of the three makes a
fix stale: it is not applied (the doctor lists it as such).

The sentinel (``hook``) compiles a graph that has a fix with that change, then checks it as
any graph: it runs compiled if it now matches, and falls back as before if not. A step
left out is left out through torch's own switch for bisection
(``CompilerBisector.disable_subsystem``, ``torch/_inductor/compiler_bisector.py``, torch
>= 2.6), for this graph's compile only and for the named step only (its target: the
decomposed op, the node lowered, the pass); torch's FX-graph and AOTAutograd caches are
bypassed for that compile (a cached kernel would be the unhealed one).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
from typing import Any, Dict, Iterator, List, Optional

from rocm_autopatch import files, log, patching, probe, settings

STORE_VERSION = 1


def path() -> Optional[str]:
    """The store's file; None when ``ROCM_AUTOPATCH_FIXES=off``."""
    given = log.path_setting(settings.FIXES)
    return settings.user_cache("fixes.json") if given == "" else given


def here() -> Dict[str, Any]:
    """What a fix is valid for: this torch, Triton and GPU architecture(s)."""
    import torch

    return {"torch": torch.__version__, "triton": probe.triton_version(),
            "arch": ",".join(sorted(set(probe.arch_names()))) or "none"}


def load(where: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every remembered fix; [] when there is no store or it cannot be read (one warning)."""
    where = where or path()
    if not where or not os.path.exists(where):
        return []
    try:
        with open(where) as fh:
            data = json.load(fh)
        fixes = data.get("fixes") if isinstance(data, dict) else None
        if not isinstance(fixes, list):
            raise ValueError("no list of fixes")
        return [f for f in fixes if isinstance(f, dict) and isinstance(f.get("change"), dict)]
    except Exception as exc:  # noqa: BLE001 - a damaged store is one warning, not a crash
        log.warn_once(("fixes", "read"), f"{settings.FIXES}: {where} could not be read "
                      f"({type(exc).__name__}: {str(exc)[:120]}); no remembered fix is "
                      "applied (`rocm-autopatch forget --all` clears it)")
        return []


def _write(where: str, fixes: List[Dict[str, Any]]) -> None:
    """Replace the store at once: a reader sees the old file or the new, never a part."""
    files.write_atomically(where, json.dumps({"version": STORE_VERSION, "fixes": fixes},
                                             indent=1))


def remember(fix: Dict[str, Any], where: Optional[str] = None) -> str:
    """Keep ``fix`` (it replaces one for the same graph and environment); the store's path."""
    where = where or path()
    if not where:
        return ""
    fix = {**fix, "found": datetime.datetime.now().isoformat(timespec="seconds")}
    with files.directory_lock(os.path.dirname(where)):  # ranks update it one at a time
        kept = [f for f in load(where) if not _same(f, fix)]
        _write(where, kept + [fix])
    _LOOKUP.clear()
    return where


def forget(fingerprint: Optional[str] = None, where: Optional[str] = None) -> int:
    """Drop the fixes of one graph (all of them when None); how many were dropped."""
    where = where or path()
    if not where or not os.path.exists(where):
        return 0
    with files.directory_lock(os.path.dirname(where)):
        fixes = load(where)
        kept = [f for f in fixes if fingerprint is not None
                and not str(f.get("fingerprint", "")).startswith(fingerprint)]
        _write(where, kept)
    _LOOKUP.clear()
    return len(fixes) - len(kept)


def _same(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("fingerprint", "torch", "triton", "arch"))


def stale(fix: Dict[str, Any], now: Dict[str, Any]) -> str:
    """Why ``fix`` does not apply in the environment ``now`` ("" when it does)."""
    differ = [f"{k} {fix.get(k)} (now {now[k]})" for k in ("torch", "triton", "arch")
              if fix.get(k) != now[k]]
    return ("found with " + ", ".join(differ)) if differ else ""


_LOOKUP: Dict[str, Any] = {}  # the store as read once by this process


def lookup(fingerprint: str) -> Optional[Dict[str, Any]]:
    """The fix remembered for the graph ``fingerprint`` in this environment, if any.
    Never raises: a store that cannot be read applies nothing."""
    try:
        if "fixes" not in _LOOKUP:
            now = here()
            _LOOKUP["fixes"] = {f["fingerprint"]: f for f in load()
                                if not stale(f, now) and f.get("fingerprint")}
        return _LOOKUP["fixes"].get(fingerprint)
    except Exception:  # noqa: BLE001
        return None


def op_name(target: Any) -> str:
    """torch's repr of an op, as its bisector records it, in words: "aten.silu.default"."""
    found = re.fullmatch(r"<OpOverload\(op='([^']+)', overload='([^']+)'\)>", str(target))
    return f"{found.group(1)}.{found.group(2)}" if found else str(target)


def describe(change: Dict[str, Any]) -> str:
    """A change in words: "the decomposition of aten.silu.default left out"."""
    kind = change.get("kind")
    if kind == "skip":
        what = {"decomposition": "the decomposition of {t} left out (the op runs as ATen's)",
                "lowerings": "Inductor's lowering of {t} left to ATen (every such node)",
                "cudagraphs": "CUDA/HIP graphs off",
                }.get(change.get("subsystem", ""), "{s} {t} off")
        return what.format(t=op_name(change.get("target") or "(every application)"),
                           s=str(change.get("subsystem", "?")).replace("_", "-"))
    if kind == "config":
        return f"{change.get('module')} config {change.get('key')}={change.get('value')!r}"
    if kind == "env":
        return f"{change.get('name')}={change.get('value')} while it compiles"
    if kind == "index64":
        return "64-bit indexing in its kernels"
    if kind == "stages1":
        return "Triton software pipelining off in its templates (num_stages=1)"
    return f"unknown change {change!r}"


@contextlib.contextmanager
def applied(fix: Optional[Dict[str, Any]]) -> Iterator[None]:
    """Compile with ``fix``'s change (nothing when None)."""
    if fix is None:
        yield
        return
    change = fix["change"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_no_cache())
        kind = change.get("kind")
        if kind == "skip":
            stack.enter_context(_skip(change))
        elif kind == "config":
            stack.enter_context(_config(change))
        elif kind == "env":
            stack.enter_context(_env(change))
        elif kind == "index64":
            stack.enter_context(_index64())
        elif kind == "stages1":
            stack.enter_context(_one_stage())
        yield


@contextlib.contextmanager
def _no_cache() -> Iterator[None]:
    """Neither torch's FX-graph cache nor its AOTAutograd cache serves or keeps this compile:
    the cache key does not know the change."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    patches = [inductor_config.patch(fx_graph_cache=False)]
    if hasattr(functorch_config, "enable_autograd_cache"):
        patches.append(functorch_config.patch(enable_autograd_cache=False))
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


@contextlib.contextmanager
def _skip(change: Dict[str, Any]) -> Iterator[None]:
    if change["subsystem"] == "decomposition" and change.get("target"):
        with _undecomposed(change["target"]):
            yield
        return
    from torch._inductor.compiler_bisector import CompilerBisector

    backend, subsystem, target = change["backend"], change["subsystem"], change.get("target")
    original = CompilerBisector.__dict__["disable_subsystem"]
    family = _family(target) if subsystem == "lowerings" and target else None

    def disable_subsystem(cls: Any, name: str, system: str, debug_info: Any = None) -> bool:
        if name == backend and system == subsystem and (
                target is None or (debug_info is not None and (
                    family.fullmatch(debug_info()) if family else debug_info() == target))):
            return True
        return original.__func__(cls, name, system, debug_info)

    with patching.swapped(CompilerBisector, "disable_subsystem",
                          classmethod(disable_subsystem)):
        yield


def _family(node: str) -> re.Pattern[str]:
    """The nodes of one op in a graph: torch's bisector names the first wrong one ("relu");
    the same op's other nodes ("relu_1", "relu_2") are made the same way and left to ATen
    with it."""
    base = re.sub(r"_\d+$", "", node)
    return re.compile(re.escape(base) + r"(_\d+)?")


@contextlib.contextmanager
def _undecomposed(target: str) -> Iterator[None]:
    """The op leaves Inductor's decomposition tables for the time of this compile, so that
    Inductor runs it as ATen's kernel (its implicit fallback). torch's bisector leaves a
    decomposition out only under aot_eager_decomp_partition: under Inductor, an op both
    decomposed and falling back is refused (torch/_inductor/lowering.py make_fallback,
    "both a fallback and a decomp for same op")."""
    from torch._inductor import decomposition

    tables = [decomposition.decompositions]
    if hasattr(decomposition, "fast_random_decomps"):  # one cached table (functools.cache)
        tables.append(decomposition.fast_random_decomps())
    taken = []
    for table in tables:
        for op in [op for op in table if repr(op) == target]:
            taken.append((table, op, table.pop(op)))
    for op in {op for _, op, _ in taken}:
        _fallback(op)
    try:
        yield
    finally:
        for table, op, fn in taken:
            table[op] = fn


def _fallback(op: Any) -> None:
    """Registers ATen's kernel as the op's lowering now, as Inductor's implicit fallback
    would when it meets the op (torch/_inductor/graph.py call_function), but with
    warn=False. Inductor's own call keeps warn=True, and with the variable CI set (as every
    CI service sets it) make_fallback refuses any op that torch._decomp can decompose
    ("make_fallback(aten.silu.default): a decomposition exists"); with
    implicit_fallbacks=False Inductor would not fall back at all. Like Inductor's, the
    lowering stays registered for the process: once the decomposition is back, the op
    never reaches lowering again."""
    from torch._inductor import lowering

    if op in lowering.lowerings:
        return
    constraint = None
    try:
        from torch._library.utils import get_layout_constraint_tag

        tag = get_layout_constraint_tag(op, with_default=False)
        # No tag: the contiguous inputs Inductor requires of such ops in backward
        # (pytorch#140452), the stricter of its two choices, since one lowering serves both.
        constraint = (lowering.require_contiguous if tag is None
                      else lowering.tag_to_layout_constraint(tag))
    except (ImportError, AttributeError):  # an older torch without layout tags: the default
        pass
    lowering.make_fallback(op, layout_constraint=constraint, warn=False)


@contextlib.contextmanager
def _config(change: Dict[str, Any]) -> Iterator[None]:
    import importlib

    module = importlib.import_module({"inductor": "torch._inductor.config",
                                      "aot_eager_decomp_partition": "torch._functorch.config"
                                      }[change["module"]])
    with module.patch(**{change["key"]: change["value"]}):  # type: ignore[attr-defined]
        yield


@contextlib.contextmanager
def _env(change: Dict[str, Any]) -> Iterator[None]:
    """Triton reads these when it compiles a kernel: in this process, so the kernels of this
    compile are built here (compile_threads=1), not in workers started with the old value."""
    import torch._inductor.config as inductor_config

    with settings.exported(change["name"], str(change["value"])), \
            inductor_config.patch(compile_threads=1):
        yield


@contextlib.contextmanager
def _index64() -> Iterator[None]:
    from torch._inductor.codegen.simd import SIMDScheduling

    with patching.swapped(SIMDScheduling, "can_use_32bit_indexing",
                          staticmethod(lambda *args, **kwargs: False)):
        yield


@contextlib.contextmanager
def _one_stage() -> Iterator[None]:
    """Inductor's templates built with num_stages=1: the backend default they read, in the
    module that defines it and the one that imported it (torch 2.13's template heuristics)."""
    import importlib

    with contextlib.ExitStack() as stack:
        for name in ("torch._inductor.utils", "torch._inductor.template_heuristics.triton"):
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            if hasattr(module, "get_backend_num_stages"):
                stack.enter_context(patching.swapped(module, "get_backend_num_stages",
                                                     lambda: 1))
        yield
