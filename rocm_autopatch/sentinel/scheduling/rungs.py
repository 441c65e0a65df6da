"""The ladder's rungs passed in earlier processes: the largest value of each integer input (a
decode loop's position, a token id) at which a graph's checks passed, kept on disk per graph
and read at the graph's first check, so that a later process climbs the ladder from there;
and, for every graph, what a warm check cost (below).

A decode loop's position is checked each time it passes 1.25 times the largest checked
(``crossings``). A position is checked once per process, so a process of four 256-token
generations paid all twelve of its rungs in its first generation: 2.1-2.4% of its wall
time on an H200 where a long-running one paid 0.5% (BENCHMARKS.md, "A long run's steady
state, past the ladder"). What a rung covers is the compiled code at that position, so a
rung is kept by what that code follows from:

- the compile's part (``_compile_part``, made at the graph's first check, which the
  compile's own call makes at once): Inductor's settings as the compile saw them
  (``torch.compile``'s ``mode`` and ``options``, kept by ``at_compile``; every value of
  ``torch._inductor.config`` but where files go and how many workers compile; a custom pass
  by its ``uuid``, as torch's own cache key names it: one without is a graph not kept),
  grad mode, autocast, the matmul and convolution precision switches, the BLAS library,
  the attention backends, deterministic algorithms (``SWITCHES``), a remembered fix;
  torch's, Triton's and rocm-autopatch's versions; Inductor's cache directory, where the
  kernel configurations Inductor benchmarks at a kernel's first launch are kept (a process
  with another directory may choose others);
- the graph's part (``_key``): its code, its inputs' and held tensors' shapes,
  strides, dtypes and devices (a dynamic input's dtype and device only), the GPU's name and
  compute units.

Nothing is kept where kernels are tuned beyond that (``max_autotune*``,
``coordinate_descent_tuning``, fusions benchmarked, TunableOp: the ``perf`` profile), or
where Inductor's caches are off. A change to the compiler that none of these show
(Inductor's decompositions or passes patched in place by the program) is not seen:
``ROCM_AUTOPATCH_RUNGS=off``, or a deleted file, starts every ladder at the bottom again.

With the rungs, what a warm check cost (``check_seconds``: each of the last ``COSTS``
processes' lower median of its warm checks that captured no references (``replay``: a
capture is paid once, and its cost stored was taken up by every later process), the key's
graphs' lower median), kept also for
a graph without integer inputs (an image model's step, its inputs all floating: no rung,
only the cost). A
later process whose ladder starts high, or whose graph has no ladder, may run no warm check
in its first calls, and would otherwise check one call ``CALIBRATE_AFTER`` calls on only
to time one (``Schedule``; in a 200-step Llama training loop on an H200 that check took
0.3 s of 5, BENCHMARKS.md); it sets the sampled checks' period from their lower median and its own
pace instead, until one of its own checks is timed. One process's inflated cost (a first
check that paid a capture) does not set it alone, and a later process's checks bring it
back.

Only checks whose verdict passed raise a graph's rungs (``passed``, from ``check`` and
``pending``); at exit (after the last verdicts are read) a key whose graphs all passed is
written with its largest, and a key with a graph found wrong, or whose last verdict
differed unconfirmed, is removed from the store. A bug that needs both a later position
and other values is not a rung's to find: the magnitudes and the sampled checks go on.

Read only by a process that is not one rank of several (``WORLD_SIZE`` above 1; without
it, ``RANK`` or ``LOCAL_RANK`` set; or ``torch.distributed`` initialised by the graph's first
check with more than one rank):
ranks read the file at different times, and another job's exit between two ranks' reads
would make them decide differently. Every process writes (under the directory's lock).

``ROCM_AUTOPATCH_RUNGS``: the file (default: ``rungs.json`` in ``ROCM_AUTOPATCH_CACHE``'s
directory where it is set, else ``~/.cache/rocm-autopatch/rungs.json``); ``off`` neither
reads nor writes.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import warnings
import weakref
from typing import Any, Dict, List, Optional

from rocm_autopatch import files, log, probe, settings
from rocm_autopatch.sentinel.judging.status import FAILED, FELL_BACK, PASSED
from rocm_autopatch.sentinel.scheduling.ledger import lower_median

STORE_VERSION = 1
KEEP = 4096  # graphs kept in the file: the most recently written
COSTS = 8  # processes' check costs kept per graph
# (``benchmark_epilogue_fusion``, on by default, acts only under ``max_autotune``)
TUNED = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise",
         "coordinate_descent_tuning", "benchmark_fusion", "benchmark_combo_kernel")
# Inductor settings that say how a compile runs, not what it makes
HOW = ("compile_threads", "worker_start_method", "worker_suppress_logging")


class Kept:
    """One watched graph's part of the store: its key, the largest value of each integer
    input at a check that passed, and its record (its status at exit)."""

    def __init__(self, graph: Any, config_patches: Dict[str, Any]) -> None:
        self.graph = weakref.ref(graph)
        self.entry: Dict[str, Any] = graph.entry
        self.config_patches = config_patches  # ``torch.compile``'s options, for the key
        self.key: Optional[str] = None  # set at the first check
        self.integer: frozenset = frozenset()
        self.passed: Dict[int, float] = {}
        self.doubted = False  # a deferred verdict differed at exit, unconfirmed (``doubt``)

    def bad(self) -> bool:
        """Found wrong, or a deferred verdict differed and was not confirmed (at exit, or its
        confirming call never came: ``confirm`` set by a difference, not by a near tie,
        which ``untie`` counts), or one is still unread."""
        graph = self.graph()
        return self.doubted or self.entry.get("status") in (FAILED, FELL_BACK) or (
            graph is not None and (graph.confirm and not graph.untied
                                   or graph.pending is not None))


_KEPT: List[Kept] = []
_READ: Dict[str, Any] = {}  # the file as read once by this process


def path() -> Optional[str]:
    """The store's file; None when ``ROCM_AUTOPATCH_RUNGS=off``. By default beside the
    compile caches where ``ROCM_AUTOPATCH_CACHE`` names them (a mounted directory: the rungs
    outlive the container with the kernels they were found with), else the user's cache."""
    given = log.path_setting(settings.RUNGS)
    if given != "":
        return given
    root = str(log.setting(settings.CACHE, warn=False) or "").strip()
    if root:
        return os.path.join(os.path.abspath(os.path.expanduser(root)), "rungs.json")
    return settings.user_cache("rungs.json")


def at_compile(graph: Any, config_patches: Any) -> None:
    """At a watched graph's compile (``watch``): ``torch.compile``'s options, which Inductor
    applies only inside the compile, kept for the key. The rest of the key is made at the
    graph's first check (``recall``), which the compile's own call makes at once: the
    program's state (grad mode, autocast, settings) is the compile's."""
    graph.rungs = Kept(graph, dict(config_patches or {}))


def recall(graph: Any, flat: List[Any], dynamic: List[int]) -> None:
    """At a graph's first check (``plan.magnitudes`` set): its key, and its integers' ladder
    started at the rungs an earlier process passed; its record says which, or why it keeps
    none. Never raises: a store that cannot be read starts the ladder at the bottom."""
    kept, plan = graph.rungs, graph.schedule
    try:
        integer = plan.magnitudes.integer if plan.magnitudes is not None else frozenset()
        if kept is None or not integer and plan.budget <= 0:
            return  # no rung to read, nor a period to set
        if path() is None:
            graph.note(rungs=f"off ({settings.RUNGS}=off)")
            return
        why: List[str] = []
        compiled_with = _compile_part(kept.config_patches, graph.healed, why)
        if compiled_with is None:
            graph.note(rungs=why[0])
            return
        kept.integer = integer
        kept.key = _key(compiled_with, graph.gm, flat, dynamic)
        _KEPT.append(kept)
        if one_of_several_ranks():
            graph.note(rungs="not read: one rank of several (kept at exit)")
            return
        names = [node.name for node in graph.placeholders]
        entry = _load().get(kept.key, {})
        stored, costs = entry.get("integers", {}), _costs(entry.get("check_seconds"))
        if costs and plan.budget > 0:  # the period set without a calibrating check
            plan.remembered = lower_median(costs)
        cost = (f"its sampled checks' period from a check's cost then "
                f"({1e3 * plan.remembered:.2f} ms)" if plan.remembered else "")
        graph.note(rungs="read: its ladder started there" + (f"; {cost}" if cost else "")
                   if stored else f"read: {cost}" if cost else "none stored yet")
        for index, value in stored.items():
            i = int(index)
            if i in integer and isinstance(value, (int, float)) and math.isfinite(value):
                plan.checked_max[i] = max(plan.checked_max.get(i, 0.0), float(value))
                plan.crossings.remembered[names[i] if i < len(names) else str(i)] = value
    except Exception as exc:  # noqa: BLE001 - the ladder starts at the bottom
        graph.note(rungs=f"none read: its key could not be made ({type(exc).__name__})")


def held() -> Dict[str, Any]:
    """The store's file (None: ``ROCM_AUTOPATCH_RUNGS=off``) and how many graphs it holds
    (the doctor's line)."""
    where = path()
    return {"store": where, "graphs": len(_stored(where)) if where else 0}


def doubt(graph: Any) -> None:
    """A deferred verdict of ``graph`` that differed at exit, with no call left to confirm
    it: its key is removed from the store (``keep``)."""
    if graph.rungs is not None:
        graph.rungs.doubted = True


def passed(graph: Any, values: Optional[Dict[int, float]]) -> None:
    """A check of ``graph`` whose verdict passed, its watched inputs' ``values``."""
    kept = graph.rungs
    if kept is None or not values:
        return
    for i, value in values.items():
        if i in kept.integer and math.isfinite(value):
            kept.passed[i] = max(kept.passed.get(i, 0.0), value)


def keep() -> int:
    """At exit: write each key whose graphs all passed with the largest integers their
    passing checks saw (each stored value only rises), and remove each key with a graph found
    wrong; how many keys were written. Never raises."""
    try:
        where = path()
        rise: Dict[str, Dict[str, float]] = {}
        costs: Dict[str, List[float]] = {}  # warm checks' costs, the period's (``Schedule``)
        drop = set()
        for kept in list(_KEPT):
            if kept.key is None:
                continue
            if kept.bad():
                drop.add(kept.key)
            elif kept.entry.get("status") == PASSED:
                plan = getattr(kept.graph(), "schedule", None)
                timed = plan is not None and bool(plan.uncaptured)
                used = timed or plan is not None and plan.remembered is not None
                if not (kept.passed or used and not kept.integer):
                    continue  # a graph without integers is kept for its check's cost
                found = rise.setdefault(kept.key, {})
                for i, v in kept.passed.items():
                    found[str(i)] = max(found.get(str(i), 0.0), v)
                if timed:  # checks that captured nothing: a capture is paid once
                    costs.setdefault(kept.key, []).append(lower_median(plan.uncaptured))
        for key in drop:
            rise.pop(key, None)
        if where and (rise or drop):
            _write(where, rise, drop, costs)
        return len(rise)
    except Exception as exc:  # noqa: BLE001 - never at exit
        if log.path_setting(settings.RUNGS):  # a path the user named: said once
            log.warn_once(("rungs", "write"), f"{settings.RUNGS}: its file could not be "
                          f"written ({type(exc).__name__}: {str(exc)[:120]}); the next "
                          "process climbs each ladder from the bottom")
        return 0


def _write(where: str, rise: Dict[str, Dict[str, float]], drop: set,
           costs: Dict[str, List[float]]) -> None:
    with files.directory_lock(os.path.dirname(where)):
        graphs = _stored(where)
        now = datetime.datetime.now().isoformat(timespec="seconds")
        for key in drop:
            graphs.pop(key, None)
        for key, values in rise.items():
            before = graphs.get(key, {})
            old = before.get("integers", {})
            merged = {i: max(float(old.get(i, 0.0)), v) for i, v in values.items()}
            graphs[key] = {"integers": {**old, **merged}, "when": now}
            history = _costs(before.get("check_seconds")) + _costs(
                [lower_median(costs[key])] if key in costs else [])  # this process's last
            if history:
                graphs[key]["check_seconds"] = [round(c, 6) for c in history[-COSTS:]]
        kept = dict(sorted(graphs.items(), key=lambda kv: str(kv[1].get("when")))[-KEEP:])
        files.write_atomically(where, json.dumps({"version": STORE_VERSION, "graphs": kept},
                                                 indent=1))


def _costs(stored: Any) -> List[float]:
    """The check costs a store holds (one number, as first written, or a list), each a
    positive finite number of seconds; anything else is left out."""
    values = stored if isinstance(stored, list) else [stored]
    return [float(v) for v in values if isinstance(v, (int, float))
            and not isinstance(v, bool) and 0 < v < math.inf]


def _load() -> Dict[str, Any]:
    if "graphs" not in _READ:
        where = path()
        _READ["graphs"] = _stored(where) if where else {}
    return _READ["graphs"]


def _stored(where: str) -> Dict[str, Any]:
    """The file's graphs; {} (with one warning) where it is there but not a store of ours."""
    if not os.path.exists(where):
        return {}
    data = files.read_json(where)
    graphs = data.get("graphs") if data is not None else None
    if not isinstance(graphs, dict) or data.get("version") != STORE_VERSION:
        log.warn_once(("rungs", "read"), f"{settings.RUNGS}: {where} could not be read as "
                      "rocm-autopatch's remembered rungs; each graph climbs the ladder from "
                      "the bottom (the file is written anew at exit)")
        return {}
    return {k: v for k, v in graphs.items()
            if isinstance(v, dict) and isinstance(v.get("integers"), dict)}


def _compile_part(config_patches: Dict[str, Any], healed: Any,
                  why: Optional[List[str]] = None) -> Optional[str]:
    """The compile's part of the key (the module's docstring); None where kernels are tuned,
    Inductor's caches are off, or a setting holds what cannot be named alike in every
    process (a custom pass without torch's ``uuid``), the reason then added to ``why``."""
    why = [] if why is None else why
    import torch
    from torch._inductor import config

    import rocm_autopatch

    with config.patch(config_patches):
        copied = config.get_config_copy()
        # read as attributes: a copy does not hold every switch (force_disable_caches)
        tuned = [name for name in TUNED if getattr(config, name, False)] + (
            ["TunableOp"] if _tunable_op(torch) else [])
        uncached = getattr(config, "force_disable_caches", False) or not getattr(
            config, "autotune_local_cache", True)
    if tuned or uncached:
        why.append(f"none kept: kernels are tuned ({', '.join(tuned)})" if tuned else
                   "none kept: Inductor's caches are off")
        return None
    named = {}
    for key, value in copied.items():
        last = key.rsplit(".", 1)[-1]
        if last.endswith(("_dir", "_path", "_dirs", "_paths")) or last in HOW:
            continue  # where files go and how the compile runs, not what it makes
        if not _plain(value):
            uuid = getattr(value, "uuid", None)  # torch's CustomGraphPass names itself
            if not callable(uuid):
                why.append(f"none kept: Inductor's {key} has no uuid to name it by")
                return None
            value = [type(value).__qualname__, str(uuid())]
        named[key] = value
    parts = [json.dumps(named, sort_keys=True), json.dumps(_context(torch)),
             json.dumps(healed, default=str, sort_keys=True), torch.__version__,
             str(probe.triton_version()), rocm_autopatch.__version__, _cache_dir()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


# What else decides the kernels a compile makes or the ATen ops it calls: grad mode (a
# training forward is another graph), autocast, the precision of matmuls and convolutions
# (old and new switches: on torch >= 2.9 reading the old raises once the new is set), the
# BLAS library, the attention backends, deterministic algorithms. Each read on its own, its
# warnings silenced (a deprecated switch warns): one a release lacks, or refuses, is named so
# in the key.
SWITCHES = ("is_grad_enabled()", "is_autocast_enabled()", "get_autocast_dtype('cuda')",
            "is_autocast_enabled('cpu')", "get_autocast_dtype('cpu')",
            "get_float32_matmul_precision()", "backends.cuda.matmul.allow_tf32",
            "backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
            "backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
            "backends.cuda.matmul.fp32_precision", "backends.fp32_precision",
            "backends.cudnn.allow_tf32", "backends.cudnn.conv.fp32_precision",
            "backends.cuda.preferred_blas_library()", "backends.cuda.flash_sdp_enabled()",
            "backends.cuda.mem_efficient_sdp_enabled()", "backends.cuda.math_sdp_enabled()",
            "backends.cuda.cudnn_sdp_enabled()", "are_deterministic_algorithms_enabled()")


def _context(torch: Any) -> List[str]:
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in SWITCHES:
            path, _, call = name.partition("(")
            value: Any = torch
            try:
                for part in path.split("."):
                    value = getattr(value, part)
                if call:  # "()" or "'cuda')": no argument, or one string
                    value = value(*([call[1:-2]] if call != ")" else []))
                found.append(repr(value))
            except Exception as exc:  # noqa: BLE001 - a switch this release lacks, or refuses
                found.append(type(exc).__name__)
    return found


def _tunable_op(torch: Any) -> bool:
    """Is TunableOp on (ATen's GEMMs tuned at their first call)? False where this build
    cannot say (a CPU build has no such switch)."""
    try:
        return bool(torch.cuda.tunable.is_enabled())
    except (AttributeError, RuntimeError):
        return False


def _cache_dir() -> str:
    """Inductor's cache directory (where its kernels' benchmarked configurations are)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # torch before 2.5
        from torch._inductor.utils import cache_dir  # type: ignore[no-redef]
    return os.path.realpath(cache_dir())


def _key(compiled_with: str, gm: Any, flat: List[Any], dynamic: List[int]) -> str:
    """The whole key: the compile's part, the graph's code and its inputs' layout (a dynamic
    input's dtype and device only: one key for all its shapes), the GPUs it runs on."""
    import torch

    parts = [compiled_with, str(gm.code)]
    devices = set()
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            shape = "dynamic" if i in dynamic else f"{tuple(x.shape)}|{tuple(x.stride())}"
            parts.append(f"{shape}|{x.dtype}|{x.device}")
            devices.add(x.device)
        else:
            parts.append("dynamic" if i in dynamic else repr(x))
    for device in sorted(devices, key=str):
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            parts.append(f"{props.name}|{props.multi_processor_count}|"
                         f"{','.join(sorted(set(probe.arch_names())))}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _plain(value: Any) -> bool:
    """A value JSON writes alike in every process."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, float, str))


def one_of_several_ranks() -> bool:
    """Is this process one rank of several (``WORLD_SIZE`` above 1; without it, ``RANK`` or
    ``LOCAL_RANK`` set; or ``torch.distributed`` initialised now with more than one rank)?
    A one-process launch (``WORLD_SIZE=1``) is not."""
    world = log.setting(settings.WORLD_SIZE, warn=False)
    if isinstance(world, int) and world > 1 or world is None and log.rank() is not None:
        return True
    import torch

    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1)
