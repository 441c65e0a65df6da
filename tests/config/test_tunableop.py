"""TunableOp under the perf profile (``rocm_autopatch/config/tunableop.py``).

torch tunes and writes its results file only on a GPU: here the files torch writes at exit
are written by the tests in torch's format (``aten/src/ATen/cuda/tunable/README.md``), a
STAND-IN for what cannot happen without a GPU. Everything else is real: the subprocess with
the real .pth and torch, the environment torch would read, the merge under the lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Venv, fake_kfd

from rocm_autopatch.config import tunableop

VALIDATORS = ("Validator,PT_VERSION,2.13.0\nValidator,ROCM_VERSION,7.2.0\n"
              "Validator,HIPBLASLT_VERSION,1.2.0\n")


def _results(shapes: range, solution: str = "Gemm_Hipblaslt_1219") -> str:
    return "".join(f"GemmTunableOp_BFloat16_TN,tn_{n}_4096_2048,{solution},0.05\n"
                   for n in shapes)


@pytest.mark.fast
def test_a_line_a_killed_writer_left_unfinished_is_never_merged() -> None:
    whole = VALIDATORS + _results(range(1, 3))
    cut = whole + "GemmTunableOp_BFloat16_TN,tn_3_4096_2048,Gemm_Hipbl"  # no newline
    validators, results = tunableop.parse(cut)
    assert len(validators) == 3 and sorted(k[1] for k in results) == [
        "tn_1_4096_2048", "tn_2_4096_2048"]
    assert tunableop.parse("garbage\nA,B\n") == ([], {})


@pytest.mark.fast
def test_runs_are_merged_and_what_they_add_survives(tmp_path: Path) -> None:
    (tmp_path / "run-a-1-0.csv").write_text(VALIDATORS + _results(range(0, 10)))
    (tmp_path / "run-b-2-0.csv").write_text(VALIDATORS + _results(range(5, 15)))
    assert tunableop.merge(str(tmp_path)) == 15
    merged = tunableop.parse((tmp_path / "results.csv").read_text())
    assert len(merged[0]) == 3 and len(merged[1]) == 15
    # Runs that found something are kept until their life ends; nothing new: gone after
    # an hour (a seed torch never rewrote).
    later = time.time() + tunableop.SEED_LIFE + 60
    assert tunableop.merge(str(tmp_path), now=later) == 15
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


@pytest.mark.fast
def test_a_run_of_another_stack_replaces_the_merged_file_when_newer(tmp_path: Path) -> None:
    (tmp_path / "results.csv").write_text(VALIDATORS + _results(range(0, 4)))
    os.utime(tmp_path / "results.csv", (1, 1))
    newer = VALIDATORS.replace("7.2.0", "7.3.0") + _results(range(100, 102))
    (tmp_path / "run-c-3-0.csv").write_text(newer)
    assert tunableop.merge(str(tmp_path)) == 2
    assert "ROCM_VERSION,7.3.0" in (tmp_path / "results.csv").read_text()


@pytest.mark.fast
def test_each_ordinal_gets_a_seed_of_the_merged_results(tmp_path: Path) -> None:
    (tmp_path / "results.csv").write_text(VALIDATORS + _results(range(0, 3)))
    name = tunableop.seed(str(tmp_path), 2)
    assert name.endswith("-%d.csv") and os.path.dirname(name) == str(tmp_path)
    for ordinal in (0, 1):  # what torch reads: %d replaced by the device ordinal
        seeded = Path(name.replace("%d", str(ordinal))).read_text()
        assert seeded == (tmp_path / "results.csv").read_text()


MERGER = r"""
import sys, time
sys.path.insert(0, sys.argv[3])
from rocm_autopatch.config import tunableop
where, me = sys.argv[1], int(sys.argv[2])
for i in range(40):
    # STAND-IN for torch's write at exit (a GPU is needed for torch to write it)
    lines = "".join(f"GemmTunableOp_BFloat16_TN,tn_{me}_{i}_{j}_64,Gemm_Rocblas_7,0.1\n"
                    for j in range(20))
    with open(f"{where}/run-{me}-{i}-0.csv", "w") as fh:
        fh.write(VALIDATORS + lines)
    tunableop.merge(where)
"""


def test_two_ranks_merging_at_once_lose_and_corrupt_nothing(tmp_path: Path) -> None:
    """Two processes (two ranks) write runs and merge into one directory at the same time,
    40 times each: the merged file is always whole and ends with every result of both."""
    root = str(Path(tunableop.__file__).parents[2])
    code = f"VALIDATORS = {VALIDATORS!r}\n" + MERGER
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(me), root])
             for me in (1, 2)]
    seen = []
    while any(p.poll() is None for p in procs):
        text = (tmp_path / "results.csv").read_text() if (tmp_path / "results.csv").exists() \
            else ""
        if text:
            assert text.endswith("\n")  # never a partial file
            seen.append(len(tunableop.parse(text)[1]))
        time.sleep(0.01)
    assert [p.returncode for p in procs] == [0, 0]
    assert tunableop.merge(str(tmp_path)) == 2 * 40 * 20
    assert seen == sorted(seen)  # results only ever added


TUNE = """
import json, os, torch, rocm_autopatch
fix = rocm_autopatch.report().fixes.get("tunableop")
print(json.dumps({"fix": fix, "env": {k: v for k, v in os.environ.items()
                                      if k.startswith("PYTORCH_TUNABLEOP")}}))
"""


def _start(venv: Venv, **env: str) -> dict:
    proc = venv.run(TUNE, env={"ROCM_AUTOPATCH": "force", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.heavy(20)
def test_perf_tunes_into_the_cache_and_the_next_start_reads_it(torch_venv: Venv,
                                                              tmp_path: Path) -> None:
    env = {"ROCM_AUTOPATCH_PROFILE": "perf", "ROCM_AUTOPATCH_CACHE": str(tmp_path / "cache"),
           "ROCM_AUTOPATCH_KFD_TOPOLOGY": fake_kfd(tmp_path / "kfd", 90402)}
    first = _start(torch_venv, **env)
    assert first["env"]["PYTORCH_TUNABLEOP_ENABLED"] == "1"
    name = first["env"]["PYTORCH_TUNABLEOP_FILENAME"]
    where = Path(name).parent
    assert where.parts[-2] == "tunableop" and where.parent.parent.name.endswith("-gfx942")
    assert str(where).startswith(str(tmp_path / "cache"))
    assert first["fix"]["status"] == "applied" and "0 GEMM shapes" in first["fix"]["reason"]
    # STAND-IN: what torch writes at this process's exit on ordinal 0 after tuning 3 shapes
    Path(name.replace("%d", "0")).write_text(VALIDATORS + _results(range(0, 3)))
    second = _start(torch_venv, **env)
    assert "3 GEMM shapes already tuned" in second["fix"]["reason"]
    seed = Path(second["env"]["PYTORCH_TUNABLEOP_FILENAME"].replace("%d", "0"))
    assert len(tunableop.parse(seed.read_text())[1]) == 3  # what torch reads: tuned


@pytest.mark.heavy(20)
def test_safe_sets_nothing_and_the_users_variables_win(torch_venv: Venv,
                                                      tmp_path: Path) -> None:
    cache = {"ROCM_AUTOPATCH_CACHE": str(tmp_path / "cache")}
    safe = _start(torch_venv, **cache)
    assert safe["env"] == {} and safe["fix"] is None
    assert not list((tmp_path / "cache").glob("*/tunableop"))  # the compile caches only
    theirs = _start(torch_venv, ROCM_AUTOPATCH_PROFILE="perf", PYTORCH_TUNABLEOP_ENABLED="0",
                    **cache)
    assert theirs["env"] == {"PYTORCH_TUNABLEOP_ENABLED": "0"}
    assert theirs["fix"]["status"] == "skipped" and "PYTORCH_TUNABLEOP_ENABLED=0" in \
        theirs["fix"]["reason"]
    nowhere = _start(torch_venv, ROCM_AUTOPATCH_PROFILE="perf")
    assert nowhere["env"] == {} and "ROCM_AUTOPATCH_CACHE" in nowhere["fix"]["reason"]
