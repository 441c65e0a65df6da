"""Each graph compiled once by the ranks of a job on one machine, not once per rank.

The ranks of a job on one machine share the compile caches (``ROCM_AUTOPATCH_CACHE``, or
torch's default directory), but on a cold start they reach each graph together and each
misses the cache, since none has written it yet: two processes started together on an
empty directory both compiled (BENCHMARKS.md, warm start). A rank whose cache is warm then
reaches the job's first collective while its peer still compiles (nanochat#722,
unsloth-zoo#967: watchdog aborts in the collective after the compile).

Inductor's ``_compile_fx_inner`` (the FX graph cache lookup, the compile on a miss, the
write of the entry; ``torch/_inductor/compile_fx.py``) is wrapped. In a job of several ranks
(``WORLD_SIZE`` > 1) each graph takes a lock named by the graph (its code, its inputs'
shapes, strides, dtypes and devices with their index, forward or backward) in Inductor's
cache directory:

- the first rank to reach a graph holds the lock while it looks up, compiles and writes;
- a rank that finds the lock held waits until it is free, then looks up and hits the entry
  the holder wrote (it does not hold the lock for its own lookup: on a warm start no rank
  waits for more than one other's load);
- a rank waits at most ``WAIT`` seconds, then compiles as it would have, saying so once (a
  holder that hangs); a holder that dies frees its lock (``flock``).

Not where a compile can itself wait for the other ranks: torch's compiler collectives
(``torch._dynamo.config.enable_compiler_collectives``), autotuning shared between ranks
(``torch._inductor.config.distributed_max_autotune_gemm``, which the profiles turn off
unless the user keeps it) and compile-on-one-rank (``torch.distributed.config.
compile_on_one_rank``): there a rank waiting for the lock while its holder waits for it in
a collective would stall until the bound. Nor where the FX graph cache is off (there is
nothing to share). Ranks on other machines have other directories: each machine compiles
once.

Ranks on different GPUs of one machine (one GPU per rank, the usual job) share nothing
here: Inductor's FX graph cache key holds its inputs' device index (``torch/_inductor/
codecache.py``, ``FxGraphCachePickler`` normalises it only with ``device_id_agnostic``,
which the cache does not use; on two H100s, torch 2.11, a graph compiled on ``cuda:0``
missed on ``cuda:1``, BENCHMARKS.md), and the compiled code names its device. The lock's
name holds the index too, so those ranks compile in parallel as without it, never one
after the other; what they share is Triton's own cache of kernels. The lock serves ranks
that use one device: CPU jobs (gloo), several ranks on one GPU.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from types import ModuleType
from typing import Any, List, Optional, Sequence

from rocm_autopatch import files, log, patching, record

NAME = "compile_once"  # its entry in report().fixes
REF = ("torch/_inductor/compile_fx.py _compile_fx_inner (FxGraphCache lookup, compile, "
       "save); nanochat#722, unsloth-zoo#967")
WAIT = 600.0  # seconds a rank waits for another's compile of a graph (torch's default
# collective timeout for NCCL is 10 minutes: a longer wait would outlast it anyway)
POLL = 0.05
FOLDER = "rocm_autopatch_compile_locks"
WAITS: List[float] = []  # seconds this process waited, per graph it found being compiled


def install(compile_fx: ModuleType, world: int) -> None:
    """At ``torch._inductor.compile_fx``'s import, in a job of ``world`` ranks (more than
    one: ``startup.wiring`` loads this module only then). Never raises."""
    try:
        if not callable(getattr(compile_fx, "_compile_fx_inner", None)):
            record.fix(NAME, record.SKIPPED, "this torch has no _compile_fx_inner to take a "
                       "lock around: each rank compiles every graph", REF)
            return
        if patching.wrap(compile_fx, "_compile_fx_inner", _once) is not None:
            record.fix(NAME, record.APPLIED, f"the {world} ranks of this job compile each "
                       "graph once per machine: the first compiles, the others wait for it "
                       f"(at most {WAIT:g} s) and load its result from the cache", REF)
    except Exception as exc:  # noqa: BLE001 - each rank compiles, as without us
        log.hook_failed("torch._inductor.compile_fx",
                        "rocm_autopatch.config.compile_once.install", exc)


def _once(original: Any) -> Any:
    def _compile_fx_inner(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            path = _where(gm, example_inputs, kwargs.get("is_backward", False))
        except Exception:  # noqa: BLE001 - no lock: this rank compiles, as without us
            path = ""
        if not path:
            return original(gm, example_inputs, *args, **kwargs)
        with GraphLock(path):
            return original(gm, example_inputs, *args, **kwargs)

    return _compile_fx_inner


def _where(gm: Any, example_inputs: Sequence[Any], is_backward: bool) -> str:
    """The graph's lock directory; "" where no lock applies."""
    import torch
    from torch._dynamo import config as dynamo_config
    from torch._inductor import config as inductor_config

    if any(getattr(config, key, False) for config, key in (
            (dynamo_config, "enable_compiler_collectives"),
            (inductor_config, "distributed_max_autotune_gemm"),
            (sys.modules.get("torch.distributed.config"), "compile_on_one_rank"),
            (inductor_config, "force_disable_caches"))) or \
            not getattr(inductor_config, "fx_graph_cache", True):
        return ""  # a compile that may wait in a collective, or no cache to share
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), FOLDER, graph_key(torch, gm, example_inputs, is_backward))


def graph_key(torch: ModuleType, gm: Any, example_inputs: Sequence[Any],
              is_backward: bool) -> str:
    """What names a graph alike on every rank: its code and its inputs' metadata, the
    device's index included as in Inductor's FX key (a graph alike in code with other
    constants waits once, then compiles: its FX key differs)."""
    parts = [str(gm.code), "backward" if is_backward else "forward"]
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            parts.append(f"{tuple(x.shape)}|{tuple(x.stride())}|{x.dtype}|{x.device}")
        else:
            parts.append(repr(x))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


class GraphLock:
    """Held for a graph's lookup and compile by the first rank; waited for by the others,
    who then go on without it (``WAITS`` records how long). Nothing where the lock cannot
    be had (no ``fcntl``, a file system without locks)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: Optional[int] = None

    def __enter__(self) -> None:
        try:
            self.fd = files.open_directory(self.path)
            if files.try_lock(self.fd):
                return  # held: this rank compiles
            began = time.monotonic()
            while not files.try_lock(self.fd):
                if time.monotonic() - began > WAIT:
                    log.warn_once((NAME, "wait"), f"rocm-autopatch: waited {WAIT:g} s for "
                                  "another rank's compile of a graph; compiling it here")
                    break
                time.sleep(POLL)
            WAITS.append(time.monotonic() - began)
            self.__exit__()  # free: the entry is written; look it up without the lock
        except Exception:  # noqa: BLE001 - compile unlocked
            self.__exit__()

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock
            self.fd = None

