"""``rocm-autopatch bisect DIR``: which compiler step makes a repro's graph wrong.

``DIR`` is a repro directory the sentinel wrote (``repro``): its ``repro.py`` exits 1 while
the compiled graph differs from eager and 0 when it matches. Every step below runs it in an
interpreter of its own without rocm-autopatch (``steps``: fresh, or for a CPU graph forked
from one that has imported torch), under a time limit, with torch's graph-level caches off
(their keys know neither the bisector's state nor a change it tries) and one kernel cache of
the bisection's own shared by its steps (kernels are cached by their source, so a step
builds only the kernels no earlier step built):

1. the repro as it is: it must reproduce, or there is nothing to look for;
2. torch's ``CompilerBisector`` (``torch/_inductor/compiler_bisector.py``, torch >= 2.6;
   pytorch PR #131936): the graph with more and more of the compiler on (Dynamo's eager
   backend, aot_eager, aot_eager with Inductor's decompositions, Inductor), then, in the
   first stage that differs, each subsystem off in turn (decompositions, pre-grad,
   joint-graph and post-grad passes, CUDA graphs, lowerings, settings such as
   ``emulate_precision_casts``), then a binary search over the applications of the one whose
   absence makes it match, down to the one decomposition, lowering or pass (a question
   whose compile would be step 1's again is answered from it, not run: ``_known_wrong``);
3. where the running build has them, the knobs behind public reports of wrong results on
   AMD GPUs (``KNOBS``), one run each.

The answer is one plain line, written with every step to ``DIR/bisect.json`` (and torch's
own output to ``DIR/bisect.log``). The change that made the graph match eager is remembered
(``fixes``) for the next run of the program. The exit status: 0 when a change was found, 1
when none was, 2 when it could not run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import typing
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from rocm_autopatch import files, torch_releases
from rocm_autopatch.sentinel.healing import fixes
from rocm_autopatch.sentinel.healing.steps import OutOfTime, Runner

RESULT = "bisect.json"
LOG = "bisect.log"
LOCK = "bisect.lock"


class Knob(NamedTuple):
    name: str
    change: Dict[str, Any]  # a fixes change
    applies: Callable[[Dict[str, Any], str], str]  # (env.json, repro text) -> why not, or ""
    ref: str


def _on_gpu(env: Dict[str, Any], text: str) -> bool:
    """Whether the graph ran on a GPU: env.json's device, else the repro's inputs."""
    if env.get("device"):
        return env["device"] == "cuda"
    return "type='cuda'" in text or "device='cuda" in text


def _amd(env: Dict[str, Any], text: str) -> str:
    if not env.get("hip"):
        return "applies to AMD GPUs only (this graph was found on a build without HIP)"
    return "" if _on_gpu(env, text) else "the graph runs on the CPU (no Triton GPU kernel)"


def _gpu(env: Dict[str, Any], text: str) -> str:
    if not _on_gpu(env, text):
        return "the graph runs on the CPU (its C++ kernels index in 64 bits already)"
    try:
        from torch._inductor.codegen.simd import SIMDScheduling
    except Exception:  # noqa: BLE001
        return "this torch has no torch._inductor.codegen.simd.SIMDScheduling"
    return "" if "can_use_32bit_indexing" in SIMDScheduling.__dict__ else \
        "this torch has no SIMDScheduling.can_use_32bit_indexing"


def _tuned(env: Dict[str, Any], text: str) -> str:
    if re.search(r"max_autotune(_gemm)? = True", text):
        return ""
    return "autotuning is off in this graph's configuration: its GEMMs already run on ATen"


def _strict(env: Dict[str, Any], text: str, config: Any = None) -> str:
    """Inductor's strict numerics where the running torch has the form that reaches
    pointwise math (2.15: ``numerics`` of "default", "strict_pointwise",
    "strict_reduction", "strict", strict implying eager's division rounding, no flush to
    zero and precision casts); 2.14's "strict" orders NVIDIA CUDA sums only."""
    if config is None:
        import torch._inductor.config as config
    modes = typing.get_args(getattr(torch_releases.config_entry(config, "numerics"),
                                    "value_type", None))
    if not modes:
        return "this torch has no strict numerics (torch 2.15+: numerics='strict')"
    if "strict_pointwise" not in modes:
        return ("this torch's strict numerics orders NVIDIA CUDA sums only (torch 2.14); "
                "torch 2.15's reaches pointwise math")
    return ""


KNOBS = (
    Knob("Triton's block ping-pong scheduling off",
         {"kind": "env", "name": "TRITON_HIP_USE_BLOCK_PINGPONG", "value": "0"}, _amd,
         "triton-lang/triton#11696"),
    Knob("AMDGCN buffer ops off",
         {"kind": "env", "name": "AMDGCN_USE_BUFFER_OPS", "value": "0"}, _amd,
         "ROCm/triton#944"),
    Knob("GEMMs on ATen (no Triton/CK templates)",
         {"kind": "config", "module": "inductor", "key": "max_autotune_gemm_backends",
          "value": "ATEN"}, _tuned, "torch/_inductor/config.py max_autotune_gemm_backends"),
    Knob("64-bit indexing in every kernel", {"kind": "index64"}, _gpu,
         "torch/_inductor/codegen/simd.py SIMDScheduling.can_use_32bit_indexing"),
    # No Inductor key bounds num_stages: its ROCm template configs take Triton's AMD
    # default (torch/_inductor/template_heuristics/triton.py ROCmConfigHeuristic).
    Knob("Triton software pipelining off (num_stages=1 in Inductor's templates)",
         {"kind": "stages1"}, _amd,
         "triton-lang/triton#9815, ROCm/aiter PR 4163; torch/_inductor/utils.py "
         "get_backend_num_stages"),
    # Last: the broadest change, eager's numerics in every kernel of the graph, still
    # compiled (a fix remembered instead of running the graph eagerly).
    Knob("Inductor's strict numerics (eager's pointwise math and reduction order)",
         {"kind": "config", "module": "inductor", "key": "numerics", "value": "strict"},
         _strict, "pytorch PR 195640; torch/_inductor/config.py numerics (2.15.0)"),
)

def _subsystem(backend: str, name: str) -> Any:
    """torch's subsystem object of that name in ``backend``'s list; None where it has none."""
    from torch._inductor import compiler_bisector as cb

    return next((s for s in cb.BACKENDS.get(backend, []) if s.name == name), None)


def _where_now(bisector: Any) -> str:
    """The bisector's state in words, for the progress line."""
    backend = bisector.get_backend() or "?"
    subsystem = bisector.get_subsystem()
    if not subsystem:
        return f"is the {backend} stage already wrong?"
    state = bisector.get_run_state(backend, subsystem)
    if state == "bisect":
        low, high = bisector.get_bisect_range(backend, subsystem)
        return f"{backend}: {subsystem}, applications {low}-{high}"
    if state == "find_max_bounds":
        return f"{backend}: {subsystem}, counting its applications"
    from torch._inductor import compiler_bisector as cb

    system = _subsystem(backend, subsystem)
    if isinstance(system, cb.ConfigChange):
        return f"{backend}: does {system.config_field}={system.config_value!r} make it match?"
    return f"{backend}: does turning {subsystem} off make it match?"


def _known_wrong(bisector: Any, on_gpu: bool) -> str:
    """Why the bisector's next question is the repro as step 1 ran it (so its answer is
    known: wrong), or "" where it must run. Three of torch's questions are that compile
    again: the inductor stage with nothing off; CUDA graphs off, for a graph on the CPU; and
    ``fallback_random=True``, for a graph without random ops (the sentinel compares none that
    has them, so it writes no repro of one). On the README demo's graph: 3 of 23 (20 run)."""
    from torch._inductor import compiler_bisector as cb

    backend, subsystem = bisector.get_backend(), bisector.get_subsystem()
    if backend != "inductor":
        return ""
    if not subsystem:
        return "the compile step 1 ran"
    if bisector.get_run_state(backend, subsystem) != "test_disable":
        return ""
    if subsystem == "cudagraphs" and not on_gpu:
        return "a graph on the CPU has no CUDA graph to leave out"
    system = _subsystem(backend, subsystem)
    if isinstance(system, cb.ConfigChange) and system.config_field == "fallback_random":
        return "a repro's graph calls no random op"
    return ""


def _torch_bisect(runner: Runner, on_gpu: bool) -> Dict[str, Any]:
    """torch's CompilerBisector over the repro; its result as data."""
    from torch._inductor.compiler_bisector import CompilerBisector

    # This process writes the bisector's state to files there; the children read it.
    state = os.path.join(runner.state, "torch")
    os.makedirs(state, exist_ok=True)
    CompilerBisector.in_process_cache = state

    def test() -> bool:
        what = _where_now(CompilerBisector)
        known = _known_wrong(CompilerBisector, on_gpu)
        if known:
            runner.known(what, f"the repro as it is ({known}): wrong, as in step 1")
            return False
        return runner.good(what, bisector=state)

    with contextlib.redirect_stdout(runner.log):  # torch prints as it goes
        result = CompilerBisector.do_bisect(test)
    runner.log.flush()
    if result is None:
        return {"stage": None}
    found = {"stage": result.backend, "subsystem": result.subsystem,
             "application": result.bisect_number, "target": result.debug_info}
    with open(runner.log.name) as fh:
        bounds = re.findall(r"Upper bound of (\d+) found", fh.read())
    if bounds and result.subsystem and result.bisect_number is not None:
        found["of"] = int(bounds[-1])
    if result.subsystem and result.bisect_number is not None and not result.debug_info:
        # torch keeps what the application was in the child's memory on some releases
        # (torch 2.11): one more run names it.
        where = os.path.join(runner.state, "named.txt")
        runner.good(f"naming {result.subsystem} application {result.bisect_number}",
                    name={"backend": result.backend, "subsystem": result.subsystem,
                          "number": result.bisect_number, "out": where})
        with contextlib.suppress(OSError), open(where) as fh:
            found["target"] = fh.read() or None
    return found


STAGES = {
    "eager": "not the compiler: Dynamo's graph run by its eager backend already differs "
             "from eager (the captured graph, or a result that is not deterministic)",
    "aot_eager": "not Inductor: aot_eager already differs (AOTAutograd's tracing and "
                 "functionalization)",
    "aot_eager_decomp_partition": "in AOTAutograd with Inductor's decompositions and "
                                  "partitioner, before Inductor generates code",
    "aot_eager_decomp_partition_crossref": "in AOTAutograd with fake-tensor cross-checks",
    "inductor": "in Inductor",
}


PASSES = {"pre_grad_passes": "pre-grad pass", "joint_graph_passes": "joint-graph pass",
          "post_grad_passes": "post-grad pass", "pre_grad_graph": "pre-grad graph pass"}


def _answer(found: Dict[str, Any]) -> str:
    stage, subsystem = found.get("stage"), found.get("subsystem")
    where = STAGES.get(stage, f"in the {stage} stage")
    if not subsystem:
        return where + (": no single subsystem alone; turning each off did not make it match"
                        if stage in ("aot_eager_decomp_partition", "inductor") else "")
    n, of = found.get("application"), found.get("of")
    target = fixes.op_name(found.get("target"))
    count = f" (application {n} of {of})" if of else f" (application {n})" if n else ""
    change = _change(found) or {}
    if change.get("kind") == "config":
        return f"{where}: {fixes.describe(change)} makes it match"
    if subsystem == "decomposition":
        return f"the decomposition of {target}{count}, {where}"
    if subsystem == "lowerings":
        return f"Inductor's lowering of node {target}{count}"
    if subsystem in PASSES:
        return f"Inductor's {PASSES[subsystem]} {target}{count}"
    if subsystem == "cudagraphs":
        return "Inductor's CUDA/HIP graph wrapping of the compiled graph"
    return f"{where}: {subsystem} {target or ''}".strip()


def _change(found: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The one change to remember for what torch's bisector found; None when it named none."""
    from torch._inductor import compiler_bisector as cb

    stage, subsystem = found.get("stage"), found.get("subsystem")
    if not subsystem or stage not in ("aot_eager_decomp_partition", "inductor"):
        return None
    system = _subsystem(stage, subsystem)
    if isinstance(system, cb.ConfigChange):
        return {"kind": "config", "module": system.config_name, "key": system.config_field,
                "value": system.config_value}
    exact = isinstance(system, cb.BisectSubsystem) and found.get("target") not in (None, "")
    return {"kind": "skip", "backend": stage, "subsystem": subsystem,
            "target": found.get("target") if exact else None}


def run(folder: str, limit: float, say: Callable[[str], None], remember: bool = True
        ) -> Dict[str, Any]:
    """Bisect the repro in ``folder`` within ``limit`` seconds; the result (also written to
    ``folder/bisect.json``)."""
    folder = os.path.abspath(folder)
    result: Dict[str, Any] = {"repro": folder, "status": "error", "answer": "", "tried": [],
                              "change": None, "remembered": ""}
    if not os.path.isfile(os.path.join(folder, "repro.py")):
        result["answer"] = f"{folder} has no repro.py: not a repro directory"
        return result
    env = _env_json(folder)
    with open(os.path.join(folder, "repro.py")) as fh:
        text = fh.read()
    with open(os.path.join(folder, LOG), "w") as log_file:
        runner = Runner(folder, limit, say, log_file, device=env.get("device"))
        try:
            _bisect(runner, env, text, result)
        except OutOfTime:
            result.update(status="not found", answer=(
                f"not found within the limit ({limit:.0f} s, {runner.steps} steps)"
                + (f"; so far: {result['so_far']}" if result.get("so_far") else "")))
        except Exception as exc:  # noqa: BLE001 - said, with torch's output in the log
            result.update(status="error", answer=f"the bisection failed: "
                                                 f"{type(exc).__name__}: {str(exc)[:300]}")
        finally:
            runner.close()
        result.update(steps=runner.steps, forked=runner.forked, known=runner.answered,
                      seconds=round(runner.elapsed(), 1))
    if remember and result["change"] is not None:
        result["remembered"] = _remember(folder, env, result)
    _write(folder, result)
    return result


def _bisect(runner: Runner, env: Dict[str, Any], text: str, result: Dict[str, Any]) -> None:
    if runner.good("the repro as it is (does it reproduce?)"):
        result.update(status="not reproduced", answer=(
            "not reproduced: the repro's compiled graph matches eager here (a failure that "
            "depends on values not saved, another GPU or another build?)"))
        return
    found = _torch_stage(runner, result, _on_gpu(env, text))
    if found is None:
        return
    if _knobs(runner, env, text, found, result):
        return
    if result["change"] is None:
        tried = any(not t["outcome"].startswith("not tried") for t in result["tried"])
        if isinstance(result["torch_bisector"], str):
            answer = f"torch's bisector {result['torch_bisector']}" + (
                "; no knob tried made it match" if tried else "; no knob applies here")
        else:
            answer = _answer(found) + (f"; but {result['fix_checked']}"
                                       if result.get("fix_checked") else "") + (
                "; no knob tried made it match" if tried else "")
        result.update(status="not found", answer=answer)


def _torch_stage(runner: Runner, result: Dict[str, Any], on_gpu: bool
                 ) -> Optional[Dict[str, Any]]:
    """torch's bisector over the repro, and its answer's change checked alone; None where
    every stage matched (the answer is given)."""
    try:
        from torch._inductor.compiler_bisector import CompilerBisector
    except ImportError:
        CompilerBisector = None  # noqa: N806
    if CompilerBisector is None or not hasattr(CompilerBisector, "in_process_cache"):
        import torch

        result["torch_bisector"] = (f"not run: torch {torch.__version__} has no "
                                    "torch._inductor.compiler_bisector.CompilerBisector "
                                    "(torch >= 2.6)")
        return {"stage": "inductor"}  # only the knobs can be tried
    found = _torch_bisect(runner, on_gpu)
    result["torch_bisector"] = found
    if found.get("stage") is None:
        result.update(status="not found", answer=(
            "not found: with the bisector on, every stage matched eager (a failure that "
            "does not reproduce every time?)"))
        return None
    result["so_far"] = _answer(found)
    change = _change(found)
    if change is not None:
        # What is remembered is checked first: the change alone, as the next run applies
        # it (torch's bisector names the first wrong application; the fix covers them all).
        what = f"the fix alone: {fixes.describe(change)}"
        matched = runner.good(what, change=change)
        if not matched and not runner.verdict:  # it crashed or timed out: not evidence
            matched = runner.good(what + " (again: the last run gave no verdict)",
                                  change=change)
        if matched:
            result.update(status="found", answer=_answer(found), change=change)
        else:
            result["fix_checked"] = (f"{fixes.describe(change)} alone does not make it "
                                     f"match: {runner.last}")
    return found


def _knobs(runner: Runner, env: Dict[str, Any], text: str, found: Dict[str, Any],
           result: Dict[str, Any]) -> bool:
    """The ROCm knobs, each where it applies; True when one makes the graph match."""
    for knob in KNOBS:
        why_not = knob.applies(env, text)
        if not why_not and found.get("stage") not in ("inductor",):
            why_not = "the graph is already wrong before Inductor generates code"
        if not why_not and result["change"] is not None:
            why_not = "not needed: torch's bisector named the step"
        entry = {"knob": knob.name, "change": knob.change, "ref": knob.ref}
        if why_not:
            result["tried"].append({**entry, "outcome": f"not tried: {why_not}"})
            continue
        fixed = runner.good(f"knob: {knob.name}", change=knob.change)
        result["tried"].append({**entry, "outcome": "makes it match" if fixed else
                                "still differs"})
        if fixed:
            result.update(status="found", change=knob.change,
                          answer=f"{knob.name} makes it match ({knob.ref})")
            return True
    return False


def _env_json(folder: str) -> Dict[str, Any]:
    return files.read_json(os.path.join(folder, "env.json")) or {}


def _remember(folder: str, env: Dict[str, Any], result: Dict[str, Any]) -> str:
    """Keep the change for the graph, for the environment the graph was found in."""
    now = fixes.here()
    found_in = {"torch": env.get("torch"), "triton": env.get("triton"),
                "arch": ",".join(sorted(set(env.get("gpu_archs") or []))) or "none"}
    if fixes.stale(found_in, now):
        result["not_remembered"] = (f"the repro was written with {fixes.stale(now, found_in)}"
                                    "; a fix found here is not remembered for it")
        return ""
    try:
        return fixes.remember({"fingerprint": os.path.basename(folder), **found_in,
                               "change": result["change"], "answer": result["answer"],
                               "repro": folder, "where": env.get("where", "")})
    except OSError as exc:
        result["not_remembered"] = f"the store could not be written: {exc}"
        return ""


def _write(folder: str, result: Dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        files.write_atomically(os.path.join(folder, RESULT),
                               json.dumps(result, indent=1, default=str))


def read(folder: str) -> Optional[Dict[str, Any]]:
    """A repro directory's bisection result, if one ran."""
    return files.read_json(os.path.join(folder, RESULT))


def lines(result: Dict[str, Any]) -> List[str]:
    """The result for a person: the answer, then what was tried."""
    out = [f"rocm-autopatch bisect: {result['answer']}"]
    if result.get("steps"):
        forked = (f" ({result['forked']} forked from an interpreter that had imported torch)"
                  if result.get("forked") else "")
        out.append(f"  {result['steps']} runs of repro.py{forked} in "
                   f"{result.get('seconds', 0):.0f} s; "
                   f"torch's output: {os.path.join(result['repro'], LOG)}")
    skipped: Dict[str, List[str]] = {}  # one line for the knobs left out for one reason
    for t in result["tried"]:
        if t["outcome"].startswith("not tried: "):
            skipped.setdefault(t["outcome"][len("not tried: "):], []).append(t["knob"])
        else:
            out.append(f"  knob {t['knob']} [{t['ref']}]: {t['outcome']}")
    for why, knobs in skipped.items():
        out.append(f"  {len(knobs)} knob{'s' if len(knobs) != 1 else ''} not tried ({why}): "
                   f"{', '.join(knobs)}")
    if result.get("remembered"):
        out.append(f"  remembered in {result['remembered']}: the next run compiles this graph "
                   f"with {fixes.describe(result['change'])}, checks it, and runs it compiled "
                   "if it matches (`rocm-autopatch forget` undoes it)")
    elif result.get("not_remembered"):
        out.append(f"  not remembered: {result['not_remembered']}")
    return out
