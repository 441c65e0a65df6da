"""Coordinate descent's cached results reused on a warm start: the decision, read from an
entry torch's own ``AutotuneCache`` wrote to a real ``.best_config`` file and read back in a
new cache object (as a new process would).

What cannot exist here is a Triton kernel (no Triton on the CPU): ``Kernel`` stands in for
Inductor's ``CachingAutotuner`` with the attributes the decision reads (its autotune cache's
save hook, its Inductor metadata), and ``_Config`` for a ``triton.Config``. That the wrapper
takes effect on the running torch is measured on the GPU (``benchmarks/warm_start.py``:
the warm start's coordinate-descent benchmarks, BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.fast


class _Config(SimpleNamespace):
    """A triton.Config's fields as torch's cache reads them (not the class: no Triton)."""


def _cache(tmp_path: Path, configs_hash: str = "h1") -> Any:
    pytest.importorskip("torch")
    AutotuneCache = pytest.importorskip(  # (not in torch 2.4: nothing reused there)
        "torch._inductor.runtime.autotune_cache").AutotuneCache

    # torch keeps the entry beside the kernel's file (its local cache key is that path)
    meta = {"autotune_local_cache": True, "coordinate_descent_tuning": True}
    return AutotuneCache.create(meta, str(tmp_path / "ckernel.py"), configs_hash), meta


class Kernel:
    """Stands in for a CachingAutotuner (needs Triton): its cache hook and metadata."""

    def __init__(self, cache: Any, meta: Any) -> None:
        self.save_cache_hook = cache.save
        self.inductor_meta = meta


def _saved(tmp_path: Path, found_by_coordesc: bool, config: _Config) -> None:
    cache, _ = _cache(tmp_path)
    cache.save(config, 3 * 10**9, found_by_coordesc=found_by_coordesc)


def test_a_config_coordinate_descent_found_earlier_runs_without_tuning(tmp_path: Path
                                                                       ) -> None:
    from rocm_autopatch.config import coordesc_reuse

    best = _Config(kwargs={"XBLOCK": 128}, num_warps=4, num_stages=1)
    _saved(tmp_path, True, best)
    assert list(tmp_path.rglob("*.best_config"))  # torch's own file
    cache, meta = _cache(tmp_path)  # a new process: a new cache object, the same file
    launcher = SimpleNamespace(config=_Config(kwargs={"XBLOCK": 128}, num_warps=4,
                                              num_stages=1))
    assert coordesc_reuse.cached(Kernel(cache, meta), launcher) is launcher
    assert launcher.config.found_by_coordesc is True


def test_nothing_is_reused_that_torch_would_tune(tmp_path: Path) -> None:
    """An entry not found by coordinate descent, one for other configs (another
    configs_hash), tuning off, and no entry at all: torch tunes."""
    from rocm_autopatch.config import coordesc_reuse

    config = _Config(kwargs={"XBLOCK": 64}, num_warps=2, num_stages=1)
    launcher = SimpleNamespace(config=config)
    cache, meta = _cache(tmp_path)
    assert coordesc_reuse.cached(Kernel(cache, meta), launcher) is None  # no entry
    _saved(tmp_path, False, config)
    assert coordesc_reuse.cached(Kernel(cache, meta), launcher) is None  # a heuristic's
    _saved(tmp_path, True, config)
    other, _ = _cache(tmp_path, configs_hash="h2")
    assert coordesc_reuse.cached(Kernel(other, meta), launcher) is None  # other configs
    off = {**meta, "coordinate_descent_tuning": False}
    assert coordesc_reuse.cached(Kernel(cache, off), launcher) is None
    assert coordesc_reuse.cached(Kernel(cache, meta), launcher) is launcher


WIRED = r'''
import json, os
import torch._inductor.runtime.triton_heuristics as th
from rocm_autopatch import patching
import rocm_autopatch
fix = rocm_autopatch.report().fixes.get("coordesc_reuse")
print(json.dumps({"ours": patching.ours(th.CachingAutotuner.coordinate_descent_tuning),
                  "fix": fix and fix["status"]}))
'''


@pytest.mark.parametrize("mode,wrapped", [("force", True), ("0", False)])
def test_the_wheel_wraps_torchs_autotuner_when_it_is_imported(
        torch_venv: Any, mode: str, wrapped: bool) -> None:
    """Through the installed wheel and its .pth: importing Inductor's Triton runtime wraps
    the real ``CachingAutotuner.coordinate_descent_tuning`` (forced here: no ROCm build),
    and records it; switched off, torch's own method stays."""
    import json

    proc = torch_venv.run(WIRED, env={"ROCM_AUTOPATCH": mode})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"ours": wrapped, "fix": "applied" if wrapped else None}, out
