"""The sentinel follows shapes, values and time (issue 25), through the installed wheel:
miscompiles that appear only at a later shape, with larger values or after many calls are
caught when they appear (or within the sampling bound), a healthy dynamic graph raises no
alarm over many shapes, and the coverage is in the report and the doctor. Each miscompile
is made in what Inductor compiles (a patched decomposition), as in test_verify."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import Venv, clean_env, named_in_cache_key

from rocm_autopatch.sentinel.scheduling.schedule import CALIBRATE_AFTER

# Inductor's caches stay on: each injected bug is named in their keys (named_in_cache_key).
FORCE = {"ROCM_AUTOPATCH": "force"}

# BUG is the body of a wrong silu; the loop runs CALLS calls of INPUT(i) and stops at the
# first call whose graph is no longer "passed".
JOB = r'''
import json, sys, torch
from torch._inductor import decomposition as d
def bad_silu(x):
    return BUG
d.decompositions[torch.ops.aten.silu.default] = bad_silu
NAMED
w = torch.randn(128, 128, generator=torch.Generator().manual_seed(1)) / 12
f = torch.compile(lambda x: torch.nn.functional.silu(x) @ w + x, dynamic=DYNAMIC)
gen = torch.Generator().manual_seed(0)
import rocm_autopatch
results = []
for i in range(1, CALLS + 1):
    x = INPUT
    y = f(x)
    with torch.no_grad():
        right = torch.nn.functional.silu(x) @ w + x
    results.append(bool(torch.allclose(y, right, atol=1e-3, rtol=1e-3)))
    (g,) = rocm_autopatch.report().verify["graphs"]
    if g["status"] not in ("passed", "pending"):
        break
print(json.dumps({**g, "results": results}))
'''


def _job(venv: Venv, bug: str, input_: str, calls: int, dynamic: bool = False,
         **env: str) -> tuple:
    code = (JOB.replace("NAMED", named_in_cache_key(bug)).replace("BUG", bug)
            .replace("INPUT", input_).replace("CALLS", str(calls))
            .replace("DYNAMIC", str(dynamic)))
    proc = venv.run(code, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": "check", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_miscompile_at_a_later_shape_is_caught_at_its_first_call(torch_venv: Venv) -> None:
    """Wrong past element 2^13 (ROCm/triton#944's copy kernel, scaled down), under
    dynamic=True: one graph serves every size; before, only its first call was checked."""
    bug = ("x * torch.sigmoid(x) * torch.where("
           "torch.arange(x.numel()).view(x.shape) >= 8192, 1.5, 1.0)")
    sizes = "[8, 16, 24, 32, 40, 16, 8, 72, 40][i - 1]"
    g, err = _job(torch_venv, bug, f"torch.randn({sizes}, 128, generator=gen)", 9,
                  dynamic=True)
    assert g["status"] == "failed" and g["found_at_call"] == 8, g  # 72 x 128 > 8192
    assert g["found_because"] == "shape" and g["results"][-1] is False
    assert g["shapes"] == {"dynamic": True, "seen": 6, "checked": 6}, g["shapes"]
    assert g["calls_checked"] == 6 and g["checked_because"]["shape"] == 5
    assert "found at call 8 (a new shape)" in err


def test_larger_magnitudes_after_100_ordinary_calls_are_caught_when_they_come(
        torch_venv: Venv) -> None:
    """Wrong only for activations beyond 50 (as an overflow is); calls 1-100 are ordinary,
    call 101 on have 100 times larger inputs. Magnitudes are read every ``values_stride``-th
    call (its cost kept within 0.25% of the graph's time; ``found_stride``: the stride of the
    read that found it): found by the first read from call 101 on. Under fallback, the
    warning says how many calls ran unchecked (those from 101 returned wrong numbers), and
    the call where it is found returns eager's result."""
    bug = "x * torch.sigmoid(x) * torch.where(x.abs() > 50, 1.5, 1.0)"
    input_ = "torch.randn(32, 128, generator=gen) * (1 if i <= 100 else 100)"
    g, err = _job(torch_venv, bug, input_, 1200, ROCM_AUTOPATCH_VERIFY="fallback")
    # The stride in force at the read that found it (it adapts to measured costs later).
    found, stride = g["found_at_call"], g["found_stride"]
    assert g["status"] == "fell back" and g["found_because"] == "values", g
    assert found % stride == 0 and 101 <= found < 101 + stride, g
    # The last check that passed: a sampled one (the first calibrates, CALIBRATE_AFTER calls
    # after the first call; later ones keep within the budget of the program's time).
    good = max(c for c in g["sampled_calls"] if c < found)
    assert g["sampled_calls"][0] == 1 + CALIBRATE_AFTER and good <= 100, g
    assert g["unverified_calls"] == found - 1 - good, g
    results = g["results"]
    assert results[:100] == [True] * 100 and results[-1] is True  # eager's, at the finding
    assert not any(results[100:-1])  # the miscompile is real: unchecked calls were wrong
    assert f"found at call {found:,} (" in err
    assert f"; {found - 1 - good:,} earlier call(s) ran unchecked" in err


@pytest.mark.heavy(22)
def test_values_that_stay_in_range_are_caught_by_sampling_within_the_bound(
        torch_venv: Venv) -> None:
    """Wrong for activations above 2.5 only: calls 1-100 have values in [-3, 1], later ones
    in [-1, 3], the same magnitudes. Only a sampled call can find it: within one period
    (ROCM_AUTOPATCH_VERIFY_BUDGET=0.5 keeps the period short on the CPU)."""
    bug = "x * torch.sigmoid(x) * torch.where(x > 2.5, 1.5, 1.0)"
    input_ = "torch.rand(32, 128, generator=gen) * 4 - (3 if i <= 100 else 1)"
    g, _ = _job(torch_venv, bug, input_, 3000, ROCM_AUTOPATCH_VERIFY_BUDGET="0.5")
    assert g["status"] == "failed" and g["found_because"] == "sampled", g
    # The first sampled call after the bug appears finds it: by 100 + the period.
    found, earlier = g["found_at_call"], g["sampled_calls"][:-1]
    assert g["sampled_calls"][-1] == found and all(c <= 100 for c in earlier), g
    assert 101 <= found <= 100 + g["found_period"] and found % g["found_period"] == 0, g
    assert g["unverified_calls"] >= g["found_at_call"] - 101 >= 0
    # Without sampling (budget 0), only the first call is checked: missed.
    off, _ = _job(torch_venv, bug, input_, 300, ROCM_AUTOPATCH_VERIFY_BUDGET="0")
    assert off["status"] == "passed" and off["calls_checked"] == 1, off
    assert off["results"][150] is False  # the miscompile is real


HEALTHY = r'''
import json, torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 64), torch.nn.GELU())
def step(x):
    return torch.softmax(m(x) @ x.transpose(-1, -2), -1).sum(-1)
f = torch.compile(step, dynamic=True)
with torch.no_grad():
    for i in range(60):
        f(torch.randn(2 + (i * 7) % 40, 64) * (1 + i % 3))  # 40 sizes, none 0 or 1
import rocm_autopatch
print(json.dumps(rocm_autopatch.report().verify["graphs"]))
'''


def test_a_healthy_dynamic_graph_over_many_shapes_raises_no_alarm_and_reports_coverage(
        torch_venv: Venv, tmp_path: Path) -> None:
    """40 sizes, 60 calls: 16 shapes checked (the cap), the rest counted; nothing said but
    the verdict; the doctor's job view gives the graph's coverage in one line."""
    report = tmp_path / "r.json"
    proc = torch_venv.run(HEALTHY, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": "check",
                                        "ROCM_AUTOPATCH_REPORT": str(report)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (g,) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert g["status"] == "passed" and "WARNING" not in proc.stderr, proc.stderr
    assert g["calls"] == 60 and g["shapes"]["seen"] == 40, g
    assert 16 <= g["shapes"]["checked"] <= 40 and g["calls_checked"] >= 16, g
    assert g["values"]["inputs_followed"] == 1 and g["values"]["largest_checked"] > 3
    doctor = subprocess.run([str(torch_venv.path / "bin" / "rocm-autopatch"), "doctor",
                             "--report", str(report)], capture_output=True, text=True,
                            env=clean_env(), timeout=120)
    line = (f"graph 0/0: 40 shapes, {g['shapes']['checked']} checked; 60 calls, "
            f"{g['calls_checked']} checked ({g['checked_because']['sampled']} sampled); passed")
    assert f"  {line}\n" in doctor.stdout, doctor.stdout
    assert max(len(s) for s in doctor.stdout.splitlines() if "step" not in s) <= 80


LOOP = r'''
import json, statistics, sys, time, torch
# One thread: on a loaded machine an OpenMP team waits on a descheduled thread, and one
# iteration of the busy work below ran for milliseconds (the graph's share measured 0.04).
torch.set_num_threads(1)
from torch._inductor import decomposition as d
def bad_silu(x):
    return BUG
d.decompositions[torch.ops.aten.silu.default] = bad_silu
NAMED
w = torch.randn(128, 128, generator=torch.Generator().manual_seed(1)) / 12
f = torch.compile(lambda x, pos: torch.nn.functional.silu(x + pos / 100) @ w, dynamic=False)
gen = torch.Generator().manual_seed(0)
other = torch.randn(32, 128, generator=gen)
import rocm_autopatch
wrong, took, loops = [], [], []
for i in range(1, CALLS + 1):
    x, pos = INPUTS
    begun = time.perf_counter()
    y = f(x, pos)
    took.append(time.perf_counter() - begun)
    with torch.no_grad():
        right = torch.nn.functional.silu(x + pos / 100) @ w
    # The rest of the program's loop: OTHER times the graph's own call (the median of its
    # last 50 warm calls: the first, which compiles, would make call 2's busy work seconds)
    recent = sorted(took[1:][-50:])
    busy = time.perf_counter() + OTHER * recent[len(recent) // 2] if i > 1 else 0.0
    while time.perf_counter() < busy:
        other = torch.tanh(other[:1] @ w)
    if not torch.allclose(y, right, atol=1e-3, rtol=1e-3):
        wrong.append(i)
    loops.append(time.perf_counter() - begun)
(g,) = rocm_autopatch.report().verify["graphs"]
# The graph's share of the loop: its median warm call against the median warm iteration
# (medians, so that neither the sentinel's checks nor the machine's load move it)
share = statistics.median(took[1:]) / statistics.median(loops[1:])
print(json.dumps({**g, "wrong": wrong[:3], "graph_share": share}))
'''


def _loop(venv: Venv, bug: str, inputs: str, calls: int, other: int, **env: str) -> dict:
    code = (LOOP.replace("NAMED", named_in_cache_key(bug)).replace("BUG", bug)
            .replace("INPUTS", inputs).replace("CALLS", str(calls))
            .replace("OTHER", str(other)))
    proc = venv.run(code, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": "check", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.heavy(25)
def test_a_cheap_graph_in_a_loop_is_followed_against_the_programs_time(
        torch_venv: Venv) -> None:
    """The budget is the program's wall time: a graph that is about a fifth of its loop,
    wrong for activations beyond 50 from call 100 on, is found by its magnitudes before call
    300 at the default budget (issue 32's bound; against the graph's own time its values
    were read every 1,024th call)."""
    bug = "x * torch.sigmoid(x) * torch.where(x.abs() > 50, 1.5, 1.0)"
    inputs = ("torch.randn(32, 128, generator=gen) * (1 if i < 100 else 100), "
              "torch.zeros((), dtype=torch.int64)")
    g = _loop(torch_venv, bug, inputs, 600, 2)
    # The set-up: the graph is a part of the loop, about a fifth (0.21-0.22 measured, idle
    # and with three busy processes on two cores)
    assert 0.1 < g["graph_share"] < 0.4, g
    assert g["status"] == "failed" and g["found_because"] == "values", g
    assert g["wrong"][0] == 100 and 100 <= g["found_at_call"] < 300, g


@pytest.mark.heavy(25)
def test_a_bug_that_starts_at_a_position_is_found_by_a_quarter_past_that_position(
        torch_venv: Venv) -> None:
    """A decode loop's position (an integer tensor input, as transformers' cache_position)
    from 1 to 600, the graph a sixth of the loop (a decode step is one part of a serving
    loop); the graph is wrong once its activations pass 1, from position 100 on.
    An integer that grows is checked each time it passes 1.25 times the largest checked:
    found by position 125, on the values alone (sampling off: budget 0)."""
    bug = "x * torch.sigmoid(x) * torch.where(x > 1.0, 1.5, 1.0)"
    inputs = ("torch.randn(4, 128, generator=gen) * 0.001, "
              "torch.tensor(i, dtype=torch.int64)")
    g = _loop(torch_venv, bug, inputs, 600, 5, ROCM_AUTOPATCH_VERIFY_BUDGET="0")
    assert g["status"] == "failed" and g["found_because"] == "values", g
    assert 99 <= g["wrong"][0] <= 101 and g["found_at_call"] <= 1.25 * g["wrong"][0], g


# A graph of microseconds (about 25 us a call on this CPU) whose position grows by one a call
# from 16, as benchmarks/cheap_graph_ladder.py runs it: a check costs many of its calls.
CHEAP = r'''
import json, torch
w = torch.randn(64, 64)
step = torch.compile(lambda x, pos: torch.tanh(x @ w) + pos.to(x.dtype) * 1e-3)
x, pos = torch.randn(8, 64), torch.zeros(1, dtype=torch.int64)
for n in range(303):
    pos.fill_(0 if n < 3 else 13 + n)
    x = step(x, pos)
import rocm_autopatch
(g,) = rocm_autopatch.report().verify["graphs"]
print(json.dumps(g))
'''


def test_a_graph_whose_check_costs_many_calls_starts_its_ladder_at_the_floor(
        torch_venv: Venv, tmp_path: Path) -> None:
    """Positions 16 to 315: with no budget every rung of 1.25x is checked (13); with a
    budget the first rung's check sets the floor (a check of this graph costs tens of its
    calls, so the floor is past 315) and no further rung is forced. The budget is 0.1%, a
    tenth of the default: the floor is ten times a check's cost in calls at the default
    (about 40 on an idle 2-core CPU, the floor past 400), and the program's pace, which
    CI's three workers on two cores make several times slower, took it under 100 there
    (every rung checked): a tenth of the budget keeps the floor past 315 under that load."""
    rungs = {}
    for budget in ("0", "0.001"):
        report = tmp_path / f"{budget}.json"
        proc = torch_venv.run(CHEAP, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": "check",
                                          "ROCM_AUTOPATCH_VERIFY_BUDGET": budget,
                                          "ROCM_AUTOPATCH_RUNGS": "off",
                                          "ROCM_AUTOPATCH_REPORT": str(report)})
        assert proc.returncode == 0, proc.stderr[-3000:]
        g = json.loads(proc.stdout.strip().splitlines()[-1])
        assert g["status"] == "passed", g
        rungs[budget] = (g["checked_because"]["values"], g["values"]["largest_checked"],
                         g["values"]["ladder_floor"])
    assert rungs["0"][0] >= 12 and rungs["0"][1] * 1.25 > 315, rungs  # 268: the last rung
    assert rungs["0"][2] == 0, rungs  # no budget, no floor
    assert rungs["0.001"][0] <= 2 and rungs["0.001"][1] < 300, rungs
    assert rungs["0.001"][2] > 1.25 * rungs["0.001"][1], rungs  # the report says why
    # and the job view says it in words, where there is a floor (40 times the budget)
    for budget, floor in (("0", None), ("0.001", rungs["0.001"][2])):
        view = subprocess.run([str(torch_venv.path / "bin" / "rocm-autopatch"), "doctor",
                               "--report", str(tmp_path / f"{budget}.json")],
                              capture_output=True, text=True, env=clean_env(),
                              timeout=120).stdout
        assert "Numerics coverage" in view, view
        assert (f"no rung forced below {floor:,.0f} (there a check costs over 4% of the "
                in " ".join(view.split()) if floor else "no rung forced below" not in view), view
