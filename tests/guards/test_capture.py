"""Compiles inside graph capture on torch 2.13 (CPU): the capture policy, and torch's own
behaviour with ROCM_AUTOPATCH_COMPILE_IN_CAPTURE=1 (RNG fix, clear error).

A CPU has no graph capture, so "capturing" is reproduced with named STAND-INS for
``torch.cuda.is_initialized``/``is_available``/``is_current_stream_capturing`` (and
``get_rng_state``/``set_rng_state`` as a capturing pre-2.10 build behaves:
scripts/capture_repro.py); the compiles are the real torch.compile and Inductor
(scripts/capture_policy_repro.py). The real GPU run is tests/gpu/gpu_checks.py (TESTING.md).
"""

from __future__ import annotations

import json
import types

import pytest
from conftest import ROOT, Venv

from rocm_autopatch import torch_releases

INSTALLED = """
import json, torch, torch._dynamo.convert_frame as cf, rocm_autopatch
f = torch.compile(lambda x: torch.cos(x) + x)   # Dynamo's own global-state check runs here
torch.manual_seed(0)  # a fixed input: random ones once fell where cos(x) + x is 0, past atol
x = torch.randn(8)
ok = bool(torch.allclose(f(x), torch.cos(x) + x))
r = rocm_autopatch.report()
begin = torch.cuda.graphs.CUDAGraph.capture_begin
print(json.dumps({"ok": ok, "marked": getattr(cf._compile, "__rocm_autopatch__", False),
                  "counted": getattr(begin, "__rocm_autopatch__", False),
                  "owner": cf._compile.__module__,
                  "fixes": r.fixes, "errors": r.errors}))
"""


def test_one_hook_is_installed_on_the_real_convert_frame_and_compiles_pass(
        torch_venv: Venv) -> None:
    out = torch_venv.json(INSTALLED, env={"ROCM_AUTOPATCH": "force"})
    assert out["ok"] is True and out["marked"] is True and out["errors"] == []
    assert out["owner"] == "rocm_autopatch.guards.compile_frame"
    assert out["counted"] is False  # 2.13 needs no end hook: counted for the sentinel only
    assert out["fixes"]["capture_policy"]["status"] == "applied"
    assert "apply_to_code=False" in out["fixes"]["capture_policy"]["reason"]  # 2.13's form
    assert "pytorch#185074" in out["fixes"]["capture_policy"]["ref"]
    # Nothing compiles inside capture under the policy: the RNG fix is not needed.
    assert out["fixes"]["capture_rng"]["status"] == "not needed"
    torch_way = torch_venv.json(INSTALLED, env={"ROCM_AUTOPATCH": "force",
                                                "ROCM_AUTOPATCH_COMPILE_IN_CAPTURE": "1"})
    assert torch_way["fixes"]["capture_policy"]["status"] == "skipped"
    assert torch_way["fixes"]["capture_rng"]["status"] == "not needed"  # 2.13 >= 2.10
    assert "PR 162505" in torch_way["fixes"]["capture_rng"]["ref"]
    assert torch_way["fixes"]["capture_error"]["status"] == "applied"


def _policy(venv: Venv, **env: str) -> dict:
    proc = venv.run(open(ROOT / "scripts" / "capture_policy_repro.py").read(),
                    env={"ROCM_AUTOPATCH": "force", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def test_capture_policy_runs_eager_once_and_compiles_after(torch_venv: Venv) -> None:
    out, stderr = _policy(torch_venv)
    steps = out["steps"]
    assert all(step["ok"] for step in steps.values())  # every call equals eager
    assert steps["warm_up"]["compiled"] == ["float32"]
    # Already compiled and valid: runs from the cache inside capture, nothing declined.
    assert steps["same_dtype_in_capture"]["compiled"] == []
    # A new dtype and a first call inside capture: eager, no compile...
    assert steps["new_dtype_in_capture"]["compiled"] == []
    assert steps["new_dtype_in_capture_again"]["compiled"] == []
    assert steps["first_call_in_capture"]["compiled"] == []
    # ...then compiled normally outside capture: not skipped for good.
    assert steps["new_dtype_after_capture"]["compiled"] == ["float64"]
    assert steps["new_dtype_cached"]["compiled"] == []
    assert steps["first_fn_after_capture"]["compiled"] == ["float32"]
    # Each declined call is counted (2.13's form asks again on each call inside capture);
    # the same-dtype call inside capture is not among them.
    counts = {k.split(" ")[0]: v for k, v in out["eager_in_capture"].items()}
    assert counts == {"fn": 2, "first_use": 1}
    warnings = [ln for ln in stderr.splitlines() if "being captured" in ln]
    assert len(warnings) == 2  # one per function
    assert "pytorch#185074" in warnings[0] and "warm it up" in warnings[0]
    assert "ROCM_AUTOPATCH_COMPILE_IN_CAPTURE=1" in warnings[0]
    assert out["form"].startswith("ConvertFrameReturn(apply_to_code=False)")
    assert out["capture_end_hooked"] is False  # only the legacy form needs it
    assert out["errors"] == []


# torch 2.14 refuses any trace during capture itself (PR 185410): its own message.
REFUSES = (2, 14)
TORCH_REFUSAL = "torch.compile cannot JIT compile during CUDA graph capture"


def test_compile_in_capture_gives_torch_behaviour(torch_venv: Venv) -> None:
    if torch_venv.torch["release"] >= REFUSES:
        proc = torch_venv.run(open(ROOT / "scripts" / "capture_policy_repro.py").read(),
                              env={"ROCM_AUTOPATCH": "force",
                                   "ROCM_AUTOPATCH_COMPILE_IN_CAPTURE": "1"})
        assert proc.returncode != 0 and TORCH_REFUSAL in proc.stderr  # torch's, untouched
        assert "CompiledDuringCaptureError" not in proc.stderr
        return
    out, stderr = _policy(torch_venv, ROCM_AUTOPATCH_COMPILE_IN_CAPTURE="1")
    steps = out["steps"]
    assert steps["new_dtype_in_capture"]["compiled"] == ["float64"]  # torch compiles in capture
    assert steps["first_call_in_capture"]["compiled"] == ["float32"]
    assert out["eager_in_capture"] == {} and "being captured" not in stderr


def test_not_installed_without_force_on_a_cpu_build(torch_venv: Venv) -> None:
    out = torch_venv.json(INSTALLED)
    assert out["ok"] is True and out["marked"] is False and out["fixes"] == {}


def test_rng_skipped_only_while_capturing_pre_210_reproduction(torch_venv: Venv) -> None:
    if torch_venv.torch["release"] >= REFUSES:
        pytest.skip("from torch 2.14 nothing compiles inside capture (torch refuses it, PR "
                    "185410), so there is no compile whose RNG step could fail there")
    for backend in ("aot_eager", "inductor"):
        proc = torch_venv.run(open(ROOT / "scripts" / "capture_repro.py").read(), backend,
                              env={"ROCM_AUTOPATCH": "force",
                                   "ROCM_AUTOPATCH_COMPILE_IN_CAPTURE": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.splitlines()[-1])
        assert out["installed_by_hook"] is True
        assert out["outside_capture_with_fix"] == "ok"
        assert out["rng_reads_outside_capture"] >= 1  # outside capture: torch's behaviour
        assert "Cannot call CUDAGeneratorImpl::current_seed" in out["capture_without_fix"]
        assert out["capture_with_fix"] == "ok"


def test_first_compile_inside_capture_gets_a_clear_error(torch_venv: Venv) -> None:
    code = """
import json, torch
torch.cuda.is_initialized = lambda: True                   # STAND-IN: a device in use
torch.cuda.is_available = lambda: True                     # STAND-IN: a device
torch.cuda.is_current_stream_capturing = lambda: True      # STAND-IN: capturing now
torch.cuda.get_rng_state = lambda device="cuda": torch.zeros(16, dtype=torch.uint8)  # 2.10+
torch.cuda.set_rng_state = lambda state, device="cuda": None                        # STAND-IN
def backend(gm, example_inputs):                           # what Inductor's lazy init hits
    raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture "
                       "unless the CPU tensor is pinned.")
f = torch.compile(lambda x: x + 1, backend=backend)
try:
    f(torch.ones(2)); raised = None
except Exception as exc:
    raised = [type(exc).__name__, str(exc)]
print(json.dumps({"raised": raised}))
"""
    patched = torch_venv.json(code, env={"ROCM_AUTOPATCH": "force",
                                         "ROCM_AUTOPATCH_COMPILE_IN_CAPTURE": "1"})
    name, message = patched["raised"]
    if torch_venv.torch["release"] >= REFUSES:  # torch says it clearly itself: left alone
        assert TORCH_REFUSAL in message and name != "CompiledDuringCaptureError"
        policy = torch_venv.json(code, env={"ROCM_AUTOPATCH": "force"})
        assert policy["raised"] is None  # the policy never lets it get there
        return
    assert name == "CompiledDuringCaptureError"
    assert "for the first time inside CUDA/HIP graph capture" in message
    assert "Warm the compiled function up" in message and "Cannot copy between" in message
    plain = torch_venv.json(code, env={"ROCM_AUTOPATCH": "0"})
    assert plain["raised"][0] != "CompiledDuringCaptureError"
    # Under the capture policy (the default) the backend is never reached: runs eagerly.
    policy = torch_venv.json(code, env={"ROCM_AUTOPATCH": "force"})
    assert policy["raised"] is None


@pytest.mark.parametrize("version, expected", [
    ("2.13.0+cpu", (2, 13)), ("2.11.0a0+git1234", (2, 11)), ("2.9.1+rocm6.4", (2, 9)),
    ("10.2rc1", (10, 2)), ("2", (0, 0)), ("", (0, 0)), ("v2.13", (0, 0)), ("2.x", (0, 0)),
])
@pytest.mark.fast
def test_torch_version_is_read_from_release_strings(version: str, expected: tuple) -> None:
    """Which builds need the RNG fix is decided from this (the fix is needed below 2.10)."""
    assert torch_releases.version(types.SimpleNamespace(__version__=version)) == expected


@pytest.mark.fast
def test_capturing_asks_the_runtime_only_whether_the_stream_captures() -> None:
    """``capturing`` is asked at every call of a graph the sentinel watches (12 us a call in
    an H200's decode loop, 7 without ``is_available``: BENCHMARKS.md). A runtime that is
    initialised has a device, so it asks ``is_initialized``, then the stream, and never
    initialises one. STAND-INS for ``torch.cuda`` (a CPU has no CUDA/HIP runtime)."""
    from rocm_autopatch.guards import capture

    asked: list = []

    def runtime(initialised: bool, capturing: bool) -> types.SimpleNamespace:
        def ask(name: str, answer: bool):  # noqa: ANN202
            return lambda: asked.append(name) or answer
        return types.SimpleNamespace(cuda=types.SimpleNamespace(
            is_initialized=ask("is_initialized", initialised),
            is_available=ask("is_available", True),
            is_current_stream_capturing=ask("is_current_stream_capturing", capturing)))

    assert capture.capturing(runtime(True, True)) is True
    assert asked == ["is_initialized", "is_current_stream_capturing"]
    asked.clear()
    assert capture.capturing(runtime(True, False)) is False
    assert capture.capturing(runtime(False, True)) is False  # never initialised by us
    assert asked == ["is_initialized", "is_current_stream_capturing", "is_initialized"]
    assert capture.capturing(types.SimpleNamespace()) is False  # no runtime at all


class StandInGraph:
    """STAND-IN for ``torch.cuda.graphs.CUDAGraph`` (a CPU build's cannot be made): begins
    and ends a capture on a stand-in runtime, or fails to, as told."""
    runtime: dict = {}

    def capture_begin(self, fail: bool = False) -> None:
        if fail:
            raise RuntimeError("capture_begin failed")
        self.runtime["capturing"] = True

    def capture_end(self, fail: bool = False) -> None:
        self.runtime["capturing"] = False
        if fail:
            raise RuntimeError("operation failed due to a previous error during capture")


@pytest.mark.fast
def test_captures_begun_through_either_graph_class_are_counted_until_they_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``count_captures`` wraps ``capture_begin``/``capture_end`` of torch.cuda's
    ``CUDAGraph`` and torch.accelerator's ``Graph`` so that ``none_open`` can answer a
    watched graph's quiet calls without the runtime: False from a capture's begin until
    its own graph's end returns (an end that raises leaves it counted; a stray end of
    another graph changes nothing; a begin that raises opens none), False where a capture
    was under way when the count started (until an end of a graph not counted), and False
    once a wrapper is taken out. STAND-INS for the runtime and the graph classes (a CPU
    has no graph capture)."""
    from rocm_autopatch import patching
    from rocm_autopatch.guards import capture

    runtime = {"capturing": False}
    cuda_graph = type("CUDAGraph", (StandInGraph,), {"runtime": runtime})
    any_graph = type("Graph", (StandInGraph,), {"runtime": runtime})
    torch_ = types.SimpleNamespace(
        cuda=types.SimpleNamespace(graphs=types.SimpleNamespace(CUDAGraph=cuda_graph),
                                   is_initialized=lambda: True,
                                   is_current_stream_capturing=lambda: runtime["capturing"]),
        accelerator=types.SimpleNamespace(graphs=types.SimpleNamespace(Graph=any_graph)))
    for name, value in (("_counted", ()), ("_open", {}), ("_reenable", False)):
        monkeypatch.setattr(capture, name, value)
    assert capture.none_open() is False  # not counted yet: the runtime is asked
    runtime["capturing"] = True  # a capture under way when the count starts
    try:
        assert capture.count_captures(torch_) is True
        assert capture.none_open() is False
        cuda_graph().capture_end()  # an end of a graph not counted: that capture's
        assert capture.none_open() is True
        for cls in (cuda_graph, any_graph):
            graph, other = cls(), cls()
            graph.capture_begin()
            assert capture.none_open() is False and runtime["capturing"]
            with pytest.raises(RuntimeError):
                other.capture_end(fail=True)  # a stray end: still open
            with pytest.raises(RuntimeError):
                graph.capture_end(fail=True)  # its own end raised: still counted
            assert capture.none_open() is False
            graph.capture_end()
            assert capture.none_open() is True
            with pytest.raises(RuntimeError):
                graph.capture_begin(fail=True)
            assert capture.none_open() is True
        assert capture.count_captures(torch_) is True and capture.none_open() is True
    finally:
        patching.unwrap(cuda_graph, "capture_begin")
        patching.unwrap(cuda_graph, "capture_end")
    assert capture.none_open() is False  # one taken out: the runtime is asked again
    patching.unwrap(any_graph, "capture_begin")
    patching.unwrap(any_graph, "capture_end")


@pytest.mark.fast
def test_the_graph_classes_counted_are_those_of_the_running_torch() -> None:
    """Looked up, not pinned: torch.cuda's ``CUDAGraph`` in every release, and
    ``torch.accelerator.Graph`` where the release has it (2.13 does)."""
    import torch

    from rocm_autopatch.guards import capture

    found = capture._graph_classes(torch)
    assert found[0] is torch.cuda.graphs.CUDAGraph
    accelerator = getattr(getattr(torch, "accelerator", None), "Graph", None)
    assert found[1:] == ([accelerator] if accelerator is not None else [])
