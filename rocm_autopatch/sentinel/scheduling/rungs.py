"""The ladder's rungs passed in earlier processes: the largest value of each integer input (a
decode loop's position, a token id) at which a graph's checks passed, kept on disk per graph
and read at the graph's first check, so that a later process climbs the ladder from there.

A decode loop's position is checked each time it passes 1.25 times the largest checked
(``crossings``). A position is checked once per process, so a process of four 256-token
generations paid all twelve of its rungs in its first generation: 2.1-2.4% of its wall
time on an H200 where a long-running one paid 0.5% (BENCHMARKS.md, "A long run's steady
state, past the ladder"). What a rung covers is the compiled code at that position: the
same code, at the same position, on the same torch, Triton and GPU, computes alike in the
next process. So a rung is kept by everything the compiled code follows from, and by
nothing else:

- the graph (``config.compile_once.graph_key``: its code and its inputs' shapes, strides,
  dtypes and devices), the remembered fix it was compiled with;
- torch's, Triton's and rocm-autopatch's versions, the GPU architecture;
- Inductor's settings (every value of ``torch._inductor.config`` but its paths; a custom
  pass by its ``uuid``, as torch's own cache key names it: one without is a graph not
  remembered). Where kernels are tuned at compile (``max_autotune*``,
  ``coordinate_descent_tuning``: the ``perf`` profile) the code chosen may differ from one
  process to the next: nothing is remembered or read.

A change to the compiler that none of these show (Inductor's decompositions or passes
patched in place by the program) is not seen: ``ROCM_AUTOPATCH_RUNGS=off``, or a deleted
file, starts every ladder at the bottom again.

Only graphs that passed every check are kept (at exit, after the last verdicts are read);
a graph found wrong keeps nothing. A bug that needs both a later position and other values
is not a rung's to find: the magnitudes and the sampled checks go on as before.

Read only by a process that is not one rank of several (``WORLD_SIZE`` above 1, or
``torch.distributed`` initialised with more than one rank): ranks read the file at
different times, and another job's exit between two ranks' reads would make them decide
differently. Every process writes (under the directory's lock; each key keeps its largest).

``ROCM_AUTOPATCH_RUNGS``: the file (default ``~/.cache/rocm-autopatch/rungs.json``); ``off``
neither reads nor writes.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from rocm_autopatch import files, log, probe, settings
from rocm_autopatch.sentinel.judging.status import PASSED

STORE_VERSION = 1
KEEP = 4096  # graphs kept in the file: the most recently checked
TUNED = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise",
         "coordinate_descent_tuning")

# This process's graphs, by key: (the schedule, the graph's record) to keep at exit
_KEPT: Dict[str, Tuple[Any, Dict[str, Any]]] = {}
_READ: Dict[str, Any] = {}  # the file as read once by this process


def path() -> Optional[str]:
    """The store's file; None when ``ROCM_AUTOPATCH_RUNGS=off``."""
    given = log.path_setting(settings.RUNGS)
    return settings.user_cache("rungs.json") if given == "" else given


def recall(plan: Any, gm: Any, flat: List[Any], healed: Any, entry: Dict[str, Any]) -> None:
    """At a graph's first check (``plan.magnitudes`` set): start its integers' ladder at the
    rungs an earlier process passed, and keep the graph to be written at exit. Never
    raises: a store that cannot be read starts the ladder at the bottom."""
    try:
        integer = plan.magnitudes.integer if plan.magnitudes is not None else ()
        if not integer or path() is None:
            return
        key = graph_key(gm, flat, healed)
        if key is None:
            return
        _KEPT[key] = (plan, entry)
        if one_of_several_ranks():
            return
        remembered = _load().get(key, {}).get("integers", {})
        for index, value in remembered.items():
            i = int(index)
            if i in integer and isinstance(value, (int, float)) and math.isfinite(value):
                plan.checked_max[i] = max(plan.checked_max.get(i, 0.0), float(value))
                plan.crossings.remembered[i] = float(value)
    except Exception:  # noqa: BLE001 - the ladder starts at the bottom, as without a store
        return


def keep() -> int:
    """At exit: write the largest integers checked of every graph that passed (merged with
    the file's, each key keeping its largest); how many graphs were written."""
    where = path()
    found = {}
    for key, (plan, entry) in _KEPT.items():
        integer = plan.magnitudes.integer if plan.magnitudes is not None else ()
        values = {str(i): v for i, v in plan.checked_max.items() if i in integer}
        if entry.get("status") == PASSED and values:
            found[key] = values
    if not where or not found:
        return 0
    try:
        with files.directory_lock(os.path.dirname(where)):
            graphs = _stored(where)
            now = datetime.datetime.now().isoformat(timespec="seconds")
            for key, values in found.items():
                old = graphs.get(key, {}).get("integers", {})
                merged = {i: max(float(old.get(i, 0.0)), v) for i, v in values.items()}
                graphs[key] = {"integers": {**old, **merged}, "when": now}
            kept = dict(sorted(graphs.items(), key=lambda kv: str(kv[1].get("when")))[-KEEP:])
            files.write_atomically(where, json.dumps({"version": STORE_VERSION,
                                                      "graphs": kept}, indent=1))
        return len(found)
    except Exception as exc:  # noqa: BLE001 - never at exit
        log.warn_once(("rungs", "write"), f"{settings.RUNGS}: {where} could not be written "
                      f"({type(exc).__name__}: {str(exc)[:120]}); the next process climbs "
                      "the ladder from the bottom")
        return 0


def _load() -> Dict[str, Any]:
    if "graphs" not in _READ:
        where = path()
        _READ["graphs"] = _stored(where) if where and os.path.exists(where) else {}
    return _READ["graphs"]


def _stored(where: str) -> Dict[str, Any]:
    """The file's graphs; {} (with one warning) where it is there but cannot be read."""
    if not os.path.exists(where):
        return {}
    data = files.read_json(where)
    graphs = data.get("graphs") if data is not None else None
    if not isinstance(graphs, dict):
        log.warn_once(("rungs", "read"), f"{settings.RUNGS}: {where} could not be read as "
                      "rocm-autopatch's remembered rungs; each graph climbs the ladder from "
                      "the bottom (delete the file, or set it to another path)")
        return {}
    return {k: v for k, v in graphs.items() if isinstance(v, dict)}


def graph_key(gm: Any, flat: List[Any], healed: Any) -> Optional[str]:
    """What the compiled code follows from (see the module's docstring); None where kernels
    are tuned at compile, or a setting holds what cannot be named alike in every process (a
    custom pass without torch's ``uuid``)."""
    import torch
    from torch._inductor import config

    import rocm_autopatch
    from rocm_autopatch.config import compile_once

    copied = config.get_config_copy()
    if any(copied.get(name) for name in TUNED):
        return None
    named = {}
    for key, value in copied.items():
        if any(w in key for w in ("dir", "path")):
            continue  # where files go, not what is compiled
        if not _plain(value):
            uuid = getattr(value, "uuid", None)  # torch's CustomGraphPass names itself
            if not callable(uuid):
                return None
            value = [type(value).__qualname__, str(uuid())]
        named[key] = value
    parts = [compile_once.graph_key(torch, gm, flat, False), json.dumps(healed, default=str),
             torch.__version__, str(probe.triton_version()), rocm_autopatch.__version__,
             ",".join(sorted(set(probe.arch_names()))), json.dumps(named, sort_keys=True)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _plain(value: Any) -> bool:
    """A value JSON writes alike in every process."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, float, str))


def one_of_several_ranks() -> bool:
    """Is this process one rank of a job of more than one (``WORLD_SIZE``, or
    ``torch.distributed`` as initialised now)?"""
    world = log.setting(settings.WORLD_SIZE, warn=False)
    if isinstance(world, int) and world > 1:
        return True
    import torch

    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1)
