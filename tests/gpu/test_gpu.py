"""The GPU run (tests/gpu/gpu_checks.py) as tests; skipped where no CUDA/HIP device is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.fixture(scope="module")
def results() -> dict:
    """``gpu_checks.py``'s results: run now, or read from the file a run of it wrote
    (``ROCM_AUTOPATCH_GPU_RESULTS``: one run, judged by these tests, on a lent GPU)."""
    written = os.environ.get("ROCM_AUTOPATCH_GPU_RESULTS")
    if written:
        return json.loads(Path(written).read_text().strip().splitlines()[-1])
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_checks.py"))],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_reduce_overhead_makes_no_inductor_cuda_graph(results: dict) -> None:
    assert results["reduce_overhead_patched"]["captures"] == 0
    assert results["reduce_overhead_patched"]["trees_imported"] is False
    assert results["reduce_overhead_patched"]["max_abs_diff"] < 1e-2
    assert results["reduce_overhead_plain"]["captures"] > 0  # without us torch does


def test_warm_up_then_capture_replays_compiled_kernels(results: dict) -> None:
    manual = results["manual_capture"]
    assert manual["replays"] == 5 and manual["max_abs_diff"] < 1e-2
    assert manual["compiled_during_capture"] == 0 and manual["eager_in_capture"] == {}
    assert manual["graphs_compiled"] >= 1


@pytest.mark.parametrize("name", ["recompile_in_capture", "first_call_in_capture"])
def test_capture_policy_runs_eager_then_compiles_after(results: dict, name: str) -> None:
    out = results[name]
    assert out["ok"] is True and out["max_abs_diff"] < 1e-2 and out["after_ok"] is True
    assert out["compiled_during_capture"] == 0 and out["compiled_after_capture"] == 1
    assert sum(out["eager_in_capture"].values()) == 1


def test_compile_in_capture_gives_torch_behaviour(results: dict) -> None:
    for name in ("recompile_in_capture_torch", "recompile_in_capture_plain"):
        out = results[name]
        assert out["ok"] is True and out["max_abs_diff"] < 1e-2, name
        assert out["compiled_during_capture"] == 1 and out["compiled_after_capture"] == 0


def test_pre_210_rng_failure_and_fix(results: dict) -> None:
    assert "current_seed" in results["old_rng_without_fix"]["error"]
    assert results["old_rng_with_fix"]["ok"] is True


def test_first_compile_in_capture(results: dict) -> None:
    assert results["first_compile_in_capture_patched"]["raised"][0] == \
        "CompiledDuringCaptureError"
    assert "CompiledDuringCaptureError" not in \
        results["first_compile_in_capture_plain"]["raised"]
    policy = results["first_compile_in_capture_policy"]
    assert policy["raised"] == [] and policy["max_abs_diff"] < 1e-2


def test_the_pingpong_variable_reaches_every_compile_worker(results: dict) -> None:
    found = results["pingpong_reaches_workers"]
    assert found["parent"] == "0" and found["fix"]["status"] == "applied"
    assert found["workers"] and set(found["workers"]) == {"0"}, found


def test_a_checks_memory_estimate_is_above_what_it_takes_and_near_it(results: dict) -> None:
    found = results["check_memory_estimate"]
    (estimate,) = found["estimate"]
    assert found["extra"] <= estimate <= 2 * found["extra"], found


def test_perf_leaves_multi_kernel_out_where_a_warm_start_fails(results: dict) -> None:
    """Where torch's multi-kernel reductions fail when their graph comes from the FX graph
    cache (the counterfactual, rocm-autopatch off), perf leaves the setting out, saying why;
    either way both of perf's runs compile."""
    found = results["perf_warm_start"]
    plain = found["torch_multi_kernel"]
    assert plain[0]["raised"] == "", plain
    for run in found["perf"]:
        assert run["raised"] == "", run
    if plain[1]["raised"]:
        assert plain[1]["raised"].startswith("BackendCompilerFailed"), plain
        for run in found["perf"]:
            (entry,) = run["entry"]
            assert run["multi_kernel"] == 0 and entry["status"] == "skipped", run
            assert "FX graph cache" in entry["reason"], entry


def test_references_are_replayed_as_a_device_graph_and_still_catch_a_bug(
        results: dict) -> None:
    got = results["replayed_references"]
    healthy, wrong = got["healthy"], got["wrong"]
    hows = [c["how"] for c in healthy["checks"]]
    assert hows[0].startswith("run op by op") and hows[-1].startswith("replayed")
    assert "its first replay judged" in hows[0]  # the first check's verdict is a replay's
    # the weight that moved: run op by op, captured again at the next check, replayed
    assert "moved" in hows[8] and "captured" in hows[9] and hows[10].startswith("replayed")
    assert sum(h.startswith("replayed") for h in hows) >= 13
    # a replay computes what the same references run op by op compute
    assert max(c["max_difference"] for c in healthy["checks"]) == 0
    assert healthy["status"] == "passed" and healthy["rng_unchanged"]
    assert wrong["status"] == "fell back" and wrong["found_at_call"] == 13
    assert wrong["checks"][-1]["how"].startswith("replayed") and wrong["rng_unchanged"]


def test_a_capture_never_replayed_gives_way_to_one_that_is(results: dict) -> None:
    got = results["capture_gives_way"]
    seen = got["seen"]
    assert got["first_held"] > 0 and got["status"] == ["passed", "passed"], got
    # the prompt's shape captured at its first check
    assert seen[0]["references"][0].startswith("run op by op and captured"), seen[0]
    assert seen[0]["live"] == [got["first_held"]], seen[0]
    # the step's capture takes its place: one capture held, the step's, then replayed
    assert seen[1]["references"][1].startswith("run op by op and captured"), seen[1]
    assert len(seen[1]["live"]) == 1 and seen[1]["held"] < 1.5 * got["first_held"], seen[1]
    assert seen[2]["references"][1].startswith("replayed"), seen[2]
    # the prompt again: op by op (its record says so from its next check); the step's
    # capture, replayed, stays
    assert seen[3]["references"][0].startswith("run op by op: a capture would hold"), seen[3]
    assert len(seen[3]["live"]) == 1, seen[3]
    assert seen[4]["references"][1].startswith("replayed"), seen[4]


def test_a_deferred_check_reads_its_verdict_later_and_changes_nothing(results: dict) -> None:
    got, fallback = results["deferred_verdicts"], results["deferred_fallback"]["healthy"]
    healthy, written, refilled, wrong = (got[k] for k in ("healthy", "written", "refilled",
                                                           "wrong"))
    # every call checked; captured at the first check, from the second on the verdict read
    # at a later call (the last one when the loop is over: at exit)
    assert healthy["status"] == "passed" and healthy["calls_checked"] == 16, healthy
    assert healthy["calls_checked_before_the_last_verdict"] == 15
    # the judge's statistics captured at the first check (left out of the budget), with
    # the references; every deferred verdict replays them
    assert healthy["judge_captured_at"] == [0] == refilled["judge_captured_at"], healthy
    assert healthy["checks_read_later"] == 15, healthy
    assert fallback["status"] == "passed" and fallback["checks_read_later"] == 0
    # the program's numbers are the same as where every check is judged at the call
    assert healthy["outputs"] == fallback["outputs"]
    # a weight (a parameter, read in place) written in place after the deferred check of
    # call 10: that check void, no false alarm, captured again at call 11 with the weight
    # copied, deferred again from call 12
    assert written["status"] == "passed" and written["checks_skipped"] == 1, written
    assert "wrote inputs" in written["skipped_reason"]
    assert written["checks_read_later"] == 13 and written["calls_checked"] == 15, written
    # a static input buffer refilled before every call: copied at each launch, nothing void
    assert refilled["status"] == "passed" and refilled["checks_skipped"] == 0, refilled
    assert refilled["checks_read_later"] == 15 and refilled["calls_checked"] == 16
    # a bug from call 13: call 13's deferred verdict differs, call 14 (checked at the call)
    # confirms it and raises the alarm
    assert wrong["status"] == "failed" and wrong["found_at_call"] == 14, wrong
    assert wrong["checks_read_later"] == 12
    assert wrong["skipped_reason"].startswith("call 13's check, its verdict read later")
    for calls in (3, 4):  # a verdict still unread at exit is read then, and reported
        ended = got["exit"][str(calls)]
        assert ended["returncode"] == 0
        at_exit = {k: ended["report_at_exit"].get(k) for k in ("status", "calls_checked",
                                                                "checks_read_later")}
        assert at_exit == {"status": "passed", "calls_checked": calls,
                           "checks_read_later": calls - 1}, ended
        assert ended["before_exit"]["calls_checked"] == calls - 1  # one not read yet
        assert "1 passed" in ended["verdict_line"][0]


def test_torchs_attention_kernels_are_checked_with_a_narrower_reference(results: dict) -> None:
    """issue 43, item 5: op_db's attention kernels (no float64 kernel) were every sample's
    one skip on an H200; now each is checked, its reference running the kernel in float32
    (efficient) or in the sample's own dtype (flash), and none judged wrong; a miscompile
    around each is caught, the healthy graph passes."""
    got = results["narrowed_attention"]
    samples = got["samples"]
    assert samples and all(s["status"] == "passed" for s in samples), samples
    for s in samples:
        narrowed = "float32" if s["op"] == "_efficient_attention_forward" else s["dtype"]
        assert s["precision"].endswith(f"in {narrowed} (its float64 call failed)"), s
        assert s["op"] in s["precision"], s
    around = got["around"]
    for name in ("efficient_float32", "flash_bfloat16"):
        assert [g["status"] for g in around[f"{name}_healthy"]] == ["passed"], around
        assert [g["status"] for g in around[f"{name}_wrong"]] == ["failed"], around


def test_small_integer_inputs_are_read_every_call_without_a_synchronisation(
        results: dict) -> None:
    got = results["integers_every_call"]
    assert got.get("crashed") is None, got  # a synchronisation raises under the debug mode
    assert got["stopped"] == "" and got["wrong"] == [], got
    # a call whose slots were all in flight is not copied: most are, and read to the end
    assert got["reads"] >= 1000 and got["last_read"] >= 2900, got
    assert got["oldest_read_calls"] <= 4, got  # none older than the ring of slots


def test_the_magnitudes_warm_up_synchronises_nothing_and_changes_no_read(
        results: dict) -> None:
    got = results["magnitudes_warmed"]
    assert got.get("crashed") is None, got  # a synchronisation raises under the debug mode
    assert got["state_after_warm"] == [True, 0, [], True], got
    assert got["stopped"] == ["", ""] and got["reads"] >= 5 and got["same"], got


def test_the_judges_statistics_replayed_are_those_computed_op_by_op(results: dict) -> None:
    got = results["judge_replayed"]
    assert got.get("crashed") is None and got["failed"] == "", got
    assert got["captured_layouts"] == 1, got
    for call in got["calls"]:  # float64 sums in another order at most (index_add_'s atomics)
        assert call["largest_relative_difference"] < 1e-9, got
    assert got["calls"][-1]["nonfinite"] == 1, got


def test_a_capture_that_fails_leaves_the_programs_random_numbers_as_they_were(
        results: dict) -> None:
    """issue 43: references that cannot be captured (cholesky synchronises) run op by op;
    the program's random ops after it draw what they draw without the sentinel (before,
    each raised: the failed capture left the generator marked as captured), and the
    failure prints nothing (before: torch's traceback of the graph's line, 30 lines)."""
    watched, unwatched = results["capture_fails"], results["capture_fails_unwatched"]
    assert watched["errors"] == [] and unwatched["errors"] == [], watched
    assert unwatched["graphs"] == [] and watched["drawn"] == unwatched["drawn"], unwatched
    assert watched["traceback_printed"] is False, watched
    (graph,) = watched["graphs"]
    assert graph["status"] == "passed" and graph["checked"] == 3, graph
    assert "capturing them failed" in graph["references"], graph


def test_a_capture_that_fails_gives_back_what_its_references_allocated(results: dict) -> None:
    """issue 43: torch releases a capture's memory pool only after a capture that succeeded
    (``CUDAGraph::reset``); the sentinel's failed captures gave nothing back before (what
    its references had allocated stayed reserved). Its own capture now does, again and
    again, and a program whose graph cannot be captured keeps what it keeps without it."""
    got, off = results["capture_fails_memory"], results["capture_fails_memory_unwatched"]
    assert got["fixed_mib"] <= 8 and got["fixed_again_mib"] <= 8, got
    # the sentinel keeps one check's values (32 MiB: the graph's float64 result), no more
    assert got["program_mib"] <= off["program_mib"] + 64, (got, off)
    assert got["randn_ok"], got


def test_a_watched_graph_in_the_programs_capture_is_not_counted_and_quiet_calls_ask_nothing(
        results: dict) -> None:
    """issue 43: with the captures begun through ``torch.cuda.CUDAGraph`` counted, a
    watched graph's quiet calls (all but a few of 400 on an H200) do not ask the runtime
    whether the stream captures; its two calls inside the program's capture are neither
    counted nor checked, and the capture replays the compiled kernels right."""
    got = results["watched_capture"]
    assert got["warm_calls"] == 400 and got["warm_runtime_questions"] <= 40, got  # 7 seen
    assert got["calls_in_capture"] == 0 and got["none_open_inside"] is False, got
    assert got["calls_in_accelerator_capture"] in (0, None), got  # None: no such class
    assert got["none_open_after"] is True and got["replay_error"] < 1e-4, got
    assert got["status"] == "passed" and got["calls"] == 50 + 400 + 1 + 10, got
