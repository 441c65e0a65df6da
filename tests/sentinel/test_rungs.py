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
from conftest import Venv, clean_env, named_in_cache_key, rank_lines

from rocm_autopatch.sentinel.scheduling.schedule import CALIBRATE_AFTER

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


RANKS = r'''
import json, os, torch
import torch.distributed as dist
dist.init_process_group("gloo")
w = torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) / 8
f = torch.compile(lambda x, pos: torch.nn.functional.silu(x + pos / 100) @ w, dynamic=False)
x = torch.rand(4, 64, generator=torch.Generator().manual_seed(0)) * 0.01
import rocm_autopatch
for i in range(16, 300):
    f(x, torch.tensor(i, dtype=torch.int64))
(g,) = rocm_autopatch.report().verify["graphs"]
print(json.dumps({"rank": dist.get_rank(), **g}), flush=True)
dist.destroy_process_group()
'''


@pytest.mark.heavy(45)
def test_a_later_process_starts_its_ladder_where_an_earlier_ones_checks_passed(
        torch_venv: Venv, tmp_path: Path) -> None:
    store = tmp_path / "rungs.json"
    first, _ = _run(torch_venv, store, 300)
    climbed = first["checked_because"]["values"]
    largest = first["values"]["largest_checked"]
    # positions 16 to 299 on rungs 1.25x apart: about log(299 / 16) / log(1.25), 13 checks
    assert first["status"] == "passed" and climbed >= 10 and 240 < largest < 300, first
    assert first["values"]["remembered"] == {} and first["rungs"] == "none stored yet"
    (position,) = _stored(store)
    assert _stored(store) == {position: largest}

    # A real 2-rank torchrun job (gloo) of the same graph reads nothing (ranks read the
    # file at different times: another job's exit between two reads would set them
    # apart), and both ranks climb the ladder as the first process did. They write under
    # the first's key (had they read, they would have found it) and raise nothing.
    job = tmp_path / "ranks.py"
    job.write_text(RANKS)
    written = store.stat().st_mtime_ns
    proc = torch_venv.torchrun("--standalone", "--nproc-per-node", "2", str(job),
                               cwd=str(tmp_path), timeout=300, env={
                                   "ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_VERIFY": "check",
                                   "ROCM_AUTOPATCH_VERIFY_BUDGET": "0",
                                   "ROCM_AUTOPATCH_RUNGS": str(store)})
    assert proc is not None and proc.returncode == 0, proc and proc.stderr[-3000:]
    ranks = rank_lines(proc.stdout)
    assert [r["rank"] for r in ranks] == [0, 1], proc.stdout[-2000:]
    for r in ranks:
        assert r["status"] == "passed" and r["values"]["remembered"] == {}, r
        assert r["rungs"] == "not read: one rank of several (kept at exit)", r
        assert r["checked_because"] == first["checked_because"], (r, first)
    # written again (the ranks kept what they passed), still one key: theirs was the first's
    assert store.stat().st_mtime_ns != written and _stored(store) == {position: largest}

    # The same positions: no rung left to check. With a budget for sampled checks, the
    # period comes from the warm checks' cost the first process kept, so no call is checked
    # only to time one (without it, call 1 + CALIBRATE_AFTER would be: test_schedule).
    (costs,) = [entry["check_seconds"] for entry in
                json.loads(store.read_text())["graphs"].values()]
    assert len(costs) == 3 and all(0 < c < 1 for c in costs), costs  # the first, two ranks
    cost = sorted(costs)[1]  # their lower median
    report = tmp_path / "report.json"
    again, _ = _run(torch_venv, store, 300, ROCM_AUTOPATCH_REPORT=str(report),
                    ROCM_AUTOPATCH_VERIFY_BUDGET="0.01")
    assert again["rungs"] == ("read: its ladder started there; its sampled checks' period "
                              f"from a check's cost then ({1e3 * cost:.2f} ms)"), again
    (name,) = again["values"]["remembered"]  # by the graph's name for the input
    assert "pos" in name and again["values"]["remembered"][name] == largest, again
    # no check at call 33 (1 + CALIBRATE_AFTER); a sampled one may come where the period
    # the remembered cost sets allows it (under a busy machine's load, at call 128 or 256)
    assert 1 + CALIBRATE_AFTER not in again["sampled_calls"], again
    assert all(c % 2 == 0 for c in again["sampled_calls"]), again  # periods, not call 33
    because = again["checked_because"]
    assert (because["first"], because["shape"], because["values"]) == (1, 0, 0), again
    doctor = subprocess.run([str(torch_venv.path / "bin" / "rocm-autopatch"), "doctor",
                             "--report", str(report)], capture_output=True, text=True,
                            env=clean_env(), timeout=120)
    assert ("      started where an earlier process's checks passed: "
            f"{name} at {largest:,.0f}\n") in doctor.stdout, doctor.stdout
    # the doctor's summary says the store holds one graph, and how to start over
    summary = subprocess.run([str(torch_venv.path / "bin" / "rocm-autopatch"), "doctor"],
                             capture_output=True, text=True, timeout=120, env=clean_env(
                                 ROCM_AUTOPATCH="force", ROCM_AUTOPATCH_RUNGS=str(store)))
    assert "  remembered rungs: 1 graph (" in summary.stdout, summary.stdout
    assert f"      {store}\n" in summary.stdout, summary.stdout

    further, _ = _run(torch_venv, store, 400)  # past 1.25 times the remembered rung: one
    assert further["checked_because"]["values"] == 1, further
    assert largest * 1.25 < further["values"]["largest_checked"] < 400
    assert _stored(store) == {position: further["values"]["largest_checked"]}


@pytest.mark.heavy(15)
def test_a_graph_found_wrong_keeps_no_rung_and_a_damaged_store_warns_once(
        torch_venv: Venv, tmp_path: Path) -> None:
    store = tmp_path / "rungs.json"
    store.write_text("{not json")
    g, stderr = _run(torch_venv, store, 300, bug=True)
    assert g["status"] == "failed" and g["found_because"] == "values", g
    assert g["found_at_call"] + 15 <= 1.25 * 100, g  # position = call + 15; by 1.25p
    assert stderr.count(f"ROCM_AUTOPATCH_RUNGS: {store} could not be read") == 1, stderr
    # the graph found wrong removed its key: the damaged file is written anew, empty
    assert json.loads(store.read_text())["graphs"] == {}

    off, _ = _run(torch_venv, tmp_path / "unused.json", 300, ROCM_AUTOPATCH_RUNGS="off")
    assert off["values"]["remembered"] == {} and not (tmp_path / "unused.json").exists()
    assert off["rungs"] == "off (ROCM_AUTOPATCH_RUNGS=off)", off


# ---- the key and the store (in this process) ------------------------------------------

@pytest.fixture
def traced() -> tuple:
    gm = torch.fx.symbolic_trace(lambda x, pos: torch.nn.functional.silu(x + pos / 100))
    return gm, [torch.ones(4, 8), torch.tensor(16)]


@pytest.mark.fast
def test_the_key_follows_the_compile_the_graph_and_its_inputs_not_the_process(
        traced: tuple) -> None:
    from rocm_autopatch.sentinel.scheduling import rungs

    gm, flat = traced
    part = rungs._compile_part({}, None)
    assert part is not None and part == rungs._compile_part({}, None)
    key = rungs._key(part, gm, flat, [])
    assert key == rungs._key(part, gm, list(flat), [])
    assert rungs._key(part, gm, [torch.ones(4, 9), flat[1]], []) != key  # another shape
    # a dynamic input: one key for all its shapes
    assert rungs._key(part, gm, [torch.ones(4, 9), flat[1]], [0]) == rungs._key(
        part, gm, flat, [0])
    assert rungs._compile_part({}, {"change": {"kind": "skip"}}) != part  # a fix
    assert rungs._compile_part({"max_fusion_size": 7}, None) != part  # torch.compile options
    with torch.no_grad():
        assert rungs._compile_part({}, None) != part  # an inference compile
    assert rungs._compile_part({"compile_threads": 1}, None) == part  # how, not what
    with torch.autocast("cpu"):
        assert rungs._compile_part({}, None) != part
    precision = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium" if precision != "medium" else "high")
        assert rungs._compile_part({}, None) != part
    finally:
        torch.set_float32_matmul_precision(precision)
    torch.use_deterministic_algorithms(True)
    try:
        assert rungs._compile_part({}, None) != part
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.fast
def test_no_key_where_kernels_are_tuned_caches_are_off_or_a_pass_cannot_be_named() -> None:
    from torch._inductor import config

    from rocm_autopatch.sentinel.scheduling import rungs

    for name in [n for n in rungs.TUNED if hasattr(config, n)]:  # (2.4 lacks some)
        why: list = []
        assert rungs._compile_part({name: True}, None, why) is None, name
        assert why == [f"none kept: kernels are tuned ({name})"]  # what the record says
    why = []
    assert rungs._compile_part({"force_disable_caches": True}, None, why) is None
    assert why == ["none kept: Inductor's caches are off"]
    # a pass without torch's uuid
    assert rungs._compile_part({"post_grad_custom_post_pass": lambda g: None}, None) is None
    custom = pytest.importorskip("torch._inductor.custom_graph_pass")

    class Named(custom.CustomGraphPass):
        def __call__(self, graph: object) -> None:
            return None

        def uuid(self) -> str:
            return "named"

    named = rungs._compile_part({"post_grad_custom_post_pass": Named()}, None)
    assert named is not None and named != rungs._compile_part({}, None)


class _Graph:
    """What ``rungs.keep`` reads of a watched graph at exit: its record's status, a
    deferred verdict that differed unconfirmed (``confirm``; a near tie's confirm counts
    ``untied``), one still unread. (The deferred paths that set them, on the CPU's stand-in
    for a device: ``test_deferred.py``.)"""

    def __init__(self, status: str, confirm: int = 0, untied: int = 0) -> None:
        from rocm_autopatch.sentinel.scheduling.schedule import Schedule

        self.entry, self.confirm, self.pending = {"status": status}, confirm, None
        self.untied, self.schedule = untied, Schedule(1, 0.01, [])


# A graph with no integer input (an image model's step, its inputs all floating): no rung.
FIXED = r'''
import json, torch
w = torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) / 8
f = torch.compile(lambda x: torch.nn.functional.silu(x) @ w, dynamic=False)
x = torch.rand(4, 64, generator=torch.Generator().manual_seed(0))
import rocm_autopatch
for i in range(100):
    f(x)
(g,) = rocm_autopatch.report().verify["graphs"]
print(json.dumps(g))
'''


@pytest.mark.heavy(20)
def test_a_graph_without_integers_remembers_its_checks_cost_and_is_not_checked_to_time_one(
        torch_venv: Venv, tmp_path: Path) -> None:
    """A graph with no integer input has no rung, but its check's cost is kept: a later
    process sets its period from it, and does not check call 33 only to time a check (on
    an H200, 0.3 s of a 200-step Llama training loop's 5 s: BENCHMARKS.md)."""
    store = tmp_path / "rungs.json"
    env = {"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_VERIFY": "check",
           "ROCM_AUTOPATCH_RUNGS": str(store)}
    runs, stored = [], []
    for _ in range(2):
        proc = torch_venv.run(FIXED, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        (entry,) = json.loads(store.read_text())["graphs"].values()
        stored.append(entry)
    first, again = runs
    assert first["rungs"] == "none stored yet" and first["values"]["remembered"] == {}, first
    assert 1 + CALIBRATE_AFTER in first["sampled_calls"], first  # it timed one there
    assert stored[0]["integers"] == {} and len(stored[0]["check_seconds"]) == 1, stored
    cost = stored[0]["check_seconds"][0]  # the first process's
    # the second's own timed checks, if its period brought any (a loaded machine), follow
    assert stored[1]["check_seconds"][0] == cost, stored
    assert again["rungs"] == ("read: its sampled checks' period from a check's cost then "
                              f"({1e3 * cost:.2f} ms)"), again
    assert 1 + CALIBRATE_AFTER not in again["sampled_calls"], again
    assert again["status"] == "passed" and again["checked_because"]["first"] == 1, again
    # the period it set there, unchecked, is in its record (a power of two, as the first's)
    assert again["period"] > 0 and again["period"] & (again["period"] - 1) == 0, again


@pytest.mark.fast
def test_only_passing_verdicts_raise_a_rung_and_a_graph_found_wrong_removes_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rocm_autopatch.sentinel.scheduling import rungs

    store = tmp_path / "rungs.json"
    monkeypatch.setenv("ROCM_AUTOPATCH_RUNGS", str(store))
    monkeypatch.setattr(rungs, "_KEPT", [])

    def kept(graph: _Graph, key: str) -> rungs.Kept:
        graph.rungs = rungs.Kept(graph, {})
        graph.rungs.key, graph.rungs.integer = key, frozenset({2})
        rungs._KEPT.append(graph.rungs)
        return graph

    healthy, wrong = kept(_Graph("passed"), "k1"), kept(_Graph("failed"), "k1")
    unread, checked = kept(_Graph("passed", confirm=40), "k2"), kept(_Graph("passed"), "k3")
    launched = kept(_Graph("passed"), "k4")  # its checks launched, no verdict read
    # graphs without integer inputs (an image model's): kept for their checks' cost alone,
    # where timed, or read (its entry's time renewed, so that it is not the first to go)
    timed, untimed = kept(_Graph("passed"), "k6"), kept(_Graph("passed"), "k7")
    read = kept(_Graph("passed"), "k9")
    timed.rungs.integer = untimed.rungs.integer = read.rungs.integer = frozenset()
    read.schedule.remembered = 0.25
    tied = kept(_Graph("passed", confirm=41, untied=1), "k5")  # a near tie: no difference
    captured = kept(_Graph("passed"), "k8")  # its one warm check captured its references
    for graph in (healthy, wrong, unread, checked, tied, captured):
        rungs.passed(graph, {2: 120.0, 0: 5.0})  # 0: not an integer input
    rungs.passed(checked, {2: 90.0})
    assert launched.rungs.passed == {} and checked.rungs.passed == {2: 120.0}

    def checks(graph: _Graph, *costs: float, capturing: int = -1) -> None:
        for k, cost in enumerate(costs):  # warm checks; the one at ``capturing`` captured
            graph.schedule.capturing = k == capturing
            graph.schedule.checked("sampled", [torch.ones(2)], {}, True, 0.0, cost, [])

    checks(checked, 4e-3, 9e-3, 5e-3)  # its warm checks' costs: the period's
    checks(tied, 2e-3)
    checks(timed, 0.39, 0.3, 0.32, capturing=0)  # a capture is paid once: left out
    checks(captured, 0.4, capturing=0)
    assert timed.schedule.warm == [0.39, 0.3, 0.32] and not timed.schedule.capturing
    store.write_text(json.dumps({"version": rungs.STORE_VERSION, "graphs": {
        "k1": {"integers": {"2": 50.0}}, "k2": {"integers": {"2": 60.0}},
        # costs as first written (one number) or a list, with what no cost can be in it
        "k3": {"integers": {"2": 200.0}, "check_seconds": 0.007},
        "k5": {"integers": {}, "check_seconds": [0.003, "0.004", None, -1, 1e400, True]},
        "k8": {"integers": {"2": 100.0}, "check_seconds": [0.3]},
        "k9": {"integers": {}, "check_seconds": [0.25], "when": "2020-01-01T00:00:00"}}}))
    assert rungs.keep() == 5
    graphs = json.loads(store.read_text())["graphs"]
    # k1 had a graph found wrong, k2 a verdict that differed unconfirmed: removed; k3 keeps
    # its largest (a value only rises), k5 rises to 120; k4 passed nothing; k6 has no
    # integer, only its cost; k7 neither a rung nor a timed check nor a cost read
    assert set(graphs) == {"k3", "k5", "k6", "k8", "k9"}
    assert graphs["k3"]["integers"] == {"2": 200.0}
    assert graphs["k6"]["integers"] == {} and graphs["k6"]["check_seconds"] == [0.3]
    assert graphs["k8"] == {"integers": {"2": 120.0}, "check_seconds": [0.3],
                            "when": graphs["k8"]["when"]}  # no capture's cost added
    assert graphs["k9"]["check_seconds"] == [0.25] and graphs["k9"]["when"] > "2026"
    assert graphs["k5"]["integers"] == {"2": 120.0}
    # each process's check cost (the lower median of its warm checks) follows the ones
    # stored, the last eight kept; what is not a cost is dropped, not fatal
    assert graphs["k3"]["check_seconds"] == [0.007, 0.005]
    assert graphs["k5"]["check_seconds"] == [0.003, 0.002]
    # a later process starts from their lower median: one inflated cost does not set it
    assert rungs._costs(graphs["k3"]["check_seconds"] + [0.08]) == [0.007, 0.005, 0.08]
    assert rungs.lower_median([0.007, 0.005, 0.08]) == 0.007


@pytest.mark.fast
def test_a_rank_of_several_is_told_by_world_size_else_by_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rocm_autopatch.sentinel.scheduling import rungs

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not rungs.one_of_several_ranks()
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert rungs.one_of_several_ranks()
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")  # a one-process launch (torchrun --nproc-per-node 1)
    assert not rungs.one_of_several_ranks()
    monkeypatch.delenv("WORLD_SIZE")
    assert rungs.one_of_several_ranks()  # a launcher that sets the rank alone
