"""The ladder's rungs remembered across processes (``sentinel/scheduling/rungs.py``): a later
process starts a graph's ladder where an earlier one's checks passed, through the installed
wheel and its real ``.pth``, with real compiles; a rank of several, a graph found wrong, a
damaged store and the key's rules (in this process, on a real FX graph and Inductor's own
config)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import Venv, clean_env, named_in_cache_key

# A decode-like step: a position (an integer tensor, as transformers' cache_position) that
# grows from 16 to END; wrong past position 100 where BUG is.
JOB = r'''
import json, sys, torch
from torch._inductor import decomposition as d
end, bug = int(sys.argv[1]), sys.argv[2] == "bug"
if bug:  # silu wrong once its argument passes 1, which x + pos / 100 does from position 100
    d.decompositions[torch.ops.aten.silu.default] = (
        lambda x: x * torch.sigmoid(x) * torch.where(x > 1.0, 1.5, 1.0))
    NAMED
w = torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) / 8
f = torch.compile(lambda x, pos: torch.nn.functional.silu(x + pos / 100) @ w, dynamic=False)
x = torch.rand(4, 64, generator=torch.Generator().manual_seed(0)) * 0.01
import rocm_autopatch
for i in range(16, end):
    f(x, torch.tensor(i, dtype=torch.int64))
(g,) = rocm_autopatch.report().verify["graphs"]
print(json.dumps(g))
'''
BUG = "x * torch.sigmoid(x) * torch.where(x > 1.0, 1.5, 1.0)"


def _run(venv: Venv, store: Path, end: int, bug: bool = False, **env: str) -> tuple:
    code = JOB.replace("NAMED", named_in_cache_key(BUG).replace("\n", "\n    "))
    proc = venv.run(code, str(end), "bug" if bug else "healthy",
                    env={"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_VERIFY": "check",
                         "ROCM_AUTOPATCH_VERIFY_BUDGET": "0",  # no sampled checks
                         "ROCM_AUTOPATCH_RUNGS": str(store), **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _stored(store: Path) -> dict:
    (entry,) = json.loads(store.read_text())["graphs"].values()
    return entry["integers"]


@pytest.mark.heavy(30)
def test_a_later_process_starts_its_ladder_where_an_earlier_ones_checks_passed(
        torch_venv: Venv, tmp_path: Path) -> None:
    store = tmp_path / "rungs.json"
    first, _ = _run(torch_venv, store, 300)
    climbed = first["checked_because"]["values"]
    largest = first["values"]["largest_checked"]
    # positions 16 to 299 on rungs 1.25x apart: about log(299 / 16) / log(1.25), 13 checks
    assert first["status"] == "passed" and climbed >= 10 and 240 < largest < 300, first
    assert first["values"]["remembered"] == {}
    (position,) = _stored(store)
    assert _stored(store) == {position: largest}

    report = tmp_path / "report.json"  # the same positions: no rung left to check
    again, _ = _run(torch_venv, store, 300, ROCM_AUTOPATCH_REPORT=str(report))
    assert again["values"]["remembered"] == {position: largest}, again
    assert again["checked_because"] == {"first": 1, "shape": 0, "values": 0, "sampled": 0}
    doctor = subprocess.run([str(torch_venv.path / "bin" / "rocm-autopatch"), "doctor",
                             "--report", str(report)], capture_output=True, text=True,
                            env=clean_env(), timeout=120)
    assert ("      its ladder started at an earlier process's rungs: "
            f"input {position} at {largest:,.0f}\n") in doctor.stdout, doctor.stdout

    further, _ = _run(torch_venv, store, 400)  # past 1.25 times the remembered rung: one
    assert further["checked_because"]["values"] == 1, further
    assert largest * 1.25 < further["values"]["largest_checked"] < 400
    assert _stored(store) == {position: further["values"]["largest_checked"]}

    # One rank of several reads nothing (ranks read at different times), and climbs again
    rank, _ = _run(torch_venv, store, 300, WORLD_SIZE="2")
    assert rank["values"]["remembered"] == {}, rank
    assert rank["checked_because"]["values"] == climbed


@pytest.mark.heavy(15)
def test_a_graph_found_wrong_keeps_no_rung_and_a_damaged_store_warns_once(
        torch_venv: Venv, tmp_path: Path) -> None:
    store = tmp_path / "rungs.json"
    store.write_text("{not json")
    g, stderr = _run(torch_venv, store, 300, bug=True)
    assert g["status"] == "failed" and g["found_because"] == "values", g
    assert g["found_at_call"] + 15 <= 1.25 * 100, g  # position = call + 15; by 1.25p
    assert stderr.count(f"ROCM_AUTOPATCH_RUNGS: {store} could not be read") == 1, stderr
    assert store.read_text() == "{not json"  # nothing to keep: the file left as it was

    off, _ = _run(torch_venv, tmp_path / "unused.json", 300, ROCM_AUTOPATCH_RUNGS="off")
    assert off["values"]["remembered"] == {} and not (tmp_path / "unused.json").exists()


# ---- the key (in this process) -------------------------------------------------------------

@pytest.fixture
def traced() -> tuple:
    gm = torch.fx.symbolic_trace(lambda x, pos: torch.nn.functional.silu(x + pos / 100))
    return gm, [torch.ones(4, 8), torch.tensor(16)]


@pytest.mark.fast
def test_the_key_follows_the_graph_its_inputs_and_the_fix_and_not_the_process(
        traced: tuple) -> None:
    from rocm_autopatch.sentinel.scheduling import rungs

    gm, flat = traced
    key = rungs.graph_key(gm, flat, None)
    assert key is not None and key == rungs.graph_key(gm, list(flat), None)
    assert rungs.graph_key(gm, [torch.ones(4, 9), flat[1]], None) != key
    assert rungs.graph_key(gm, flat, {"change": {"kind": "skip"}}) != key
    with torch._inductor.config.patch(max_fusion_size=7):
        assert rungs.graph_key(gm, flat, None) != key  # another setting: other code


@pytest.mark.fast
def test_no_key_where_kernels_are_tuned_or_a_pass_cannot_be_named(traced: tuple) -> None:
    from torch._inductor import config

    from rocm_autopatch.sentinel.scheduling import rungs

    gm, flat = traced
    for name in rungs.TUNED:
        with config.patch(**{name: True}):
            assert rungs.graph_key(gm, flat, None) is None, name
    with config.patch(post_grad_custom_post_pass=lambda graph: None):
        assert rungs.graph_key(gm, flat, None) is None  # a pass without torch's uuid
    custom = pytest.importorskip("torch._inductor.custom_graph_pass")

    class Named(custom.CustomGraphPass):
        def __call__(self, graph: object) -> None:
            return None

        def uuid(self) -> str:
            return "named"

    with config.patch(post_grad_custom_post_pass=Named()):
        named = rungs.graph_key(gm, flat, None)
    assert named is not None and named != rungs.graph_key(gm, flat, None)


@pytest.mark.fast
def test_one_rank_of_several_is_told_by_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from rocm_autopatch.sentinel.scheduling import rungs

    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not rungs.one_of_several_ranks()
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert rungs.one_of_several_ranks()
