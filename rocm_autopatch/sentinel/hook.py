"""The numerics sentinel's hook: the one owner of ``torch._inductor.compile_fx.compile_fx``.

A compiled kernel that computes wrong numbers raises no error: on AMD GPUs it has shown
as a model that scores 0 on an eval (vllm-project/vllm#28268), NaN (ROCm/pytorch#3150) or
a bf16 miscompile on gfx950 (pytorch#187401). ``ROCM_AUTOPATCH_VERIFY`` watches every
graph Inductor compiles:

- ``check`` (also ``1``): a call that is due (``schedule``: the first
  ``ROCM_AUTOPATCH_VERIFY_CALLS`` calls, each new shape, inputs beyond the magnitudes
  checked, calls sampled within ``ROCM_AUTOPATCH_VERIFY_BUDGET`` of the graph's time) is
  also run eagerly on the same inputs and in float64 (``numerics``) and judged
  (``judge``); one warning names a graph that fails, the call, and how many calls ran
  unchecked since its last good check. The program's results are the
  compiled ones, unchanged. A graph that communicates, calls a custom op or calls random
  ops is not run again (reported, with the reason); nor is one whose runs would not fit.
- ``fallback``: the same; a graph that fails returns eager's result for that call and runs
  eagerly from then on. Other graphs stay compiled.

Every Inductor compile passes through ``compile_fx`` (``torch/__init__.py``
``_TorchCompileInductorWrapper.__call__`` imports it at call time, torch 2.1-2.15; torch's
``inductor`` backend calls it too). Other backends are not touched. Unset or ``0``, this
module is not even imported. What is checked, skipped (and why), passed or failed is in
``report().verify``, the compile report, the doctor, and one line at exit.
"""

from __future__ import annotations

import atexit
import functools
import threading
import time
import types
from typing import Any, Dict, List, Optional, Tuple

from rocm_autopatch import compile_frame, frames, log, patching, record, settings
from rocm_autopatch.sentinel import background, fixes, judge, numerics, repro, schedule
from rocm_autopatch.sentinel.status import (
    ALL,
    FAILED,
    FELL_BACK,
    NAME,
    PASSED,
    PENDING,
    REF,
    SKIPPED,
)

ENV = settings.VERIFY
# A check's extra memory (the float64 reference of the outputs and what torch's criterion
# allocates to compare them; for the backward, float64 copies of the differentiable inputs
# and the gradients) must fit in this share of the device's free memory.
MEMORY_SHARE = 0.5

# Where a graph holds its module's tensors itself (numerics.held), why its compiled
# code cannot be run again on copies of them for a backward check.
HELD = ("the graph holds its module's parameters and buffers itself "
        "(torch._dynamo.config.inline_inbuilt_nn_modules off, the default on torch 2.4), so "
        "its compiled code cannot be run on copies of them")

_lock = threading.RLock()
_busy = threading.local()  # compile_fx calls itself (config patches): wrap the outermost


def mode() -> str:
    """``ROCM_AUTOPATCH_VERIFY`` -> "off", "check" or "fallback" (a bad value warns)."""
    return log.setting(settings.VERIFY)


def calls() -> int:
    """``ROCM_AUTOPATCH_VERIFY_CALLS``: how many first calls of each graph are checked."""
    return log.setting(settings.VERIFY_CALLS)


def budget() -> float:
    """``ROCM_AUTOPATCH_VERIFY_BUDGET``: the share of a graph's time its sampled checks
    may take."""
    return log.setting(settings.VERIFY_BUDGET)


def section() -> Dict[str, Any]:
    """``report().verify``, created on first use: mode, calls, graphs and totals."""
    with record.LOCK:
        found = record.REPORT.verify
        if not found:
            found.update({"mode": "off", "calls": 0, "graphs": [],
                          "totals": dict.fromkeys(ALL, 0)})
        return found


class Graph:
    """One compiled graph under watch: its eager copy, its compiled function, its record."""

    def __init__(self, gm: Any, compiled: Any, graph_id: str, where: str, how: str,
                 checks: int, share: float) -> None:
        self.gm = gm
        self.compiled = compiled
        self.how = how
        self.fast: Any = None  # what every call runs once the graph is settled for good
        self.healed: Optional[Dict[str, Any]] = None  # the remembered fix it compiled with
        self.lock = threading.Lock()
        self.analyses: Dict[Any, Any] = {}  # by shape signature
        self.kept: Dict[Any, Any] = {}
        self.names = list(numerics.held(gm))  # tensors the graph holds itself (torch 2.4)
        self.schedule = schedule.Schedule(checks, share,
                                          schedule.dynamic_inputs(self.placeholders))
        self.entry: Dict[str, Any] = {"graph": graph_id, "where": where, "status": PENDING,
                                      "calls_checked": 0, "reason": "", "mismatch": None,
                                      "backward": "not checked yet", "seconds": 0.0,
                                      "unverified_calls": 0, "skipped_reason": "",
                                      "repro": "", "healed": "", "bisect": None,
                                      "found_at_call": None, "found_because": None,
                                      "found_period": None, "found_stride": None,
                                      **self.schedule.coverage()}
        with record.LOCK:
            found = section()
            found["graphs"].append(self.entry)
            found["totals"][PENDING] += 1

    # ---- state -------------------------------------------------------------------------

    def finish(self, status: str, reason: str = "") -> None:
        """Settle the graph for good: no call of it is checked again."""
        self.settle(status, reason)
        if status == SKIPPED:
            self.entry["backward"] = "not checked: the graph is not compared (see reason)"
        self.fast = self.eager_call if status == FELL_BACK else self.compiled
        self.gm = self.gm if status == FELL_BACK else None  # nothing kept once judged

    def settle(self, status: str, reason: str = "") -> None:
        with record.LOCK:
            totals = section()["totals"]
            totals[self.entry["status"]] -= 1
            totals[status] += 1
            self.entry["status"] = status
            if reason:
                self.entry["reason"] = reason

    def skip(self, reason: str) -> None:
        """This check could not run (memory, a shape that cannot be analysed): said, counted;
        later calls are still checked."""
        self.schedule.skipped += 1
        with record.LOCK:
            self.entry["skipped_reason"] = reason
            self.entry["checks_skipped"] = self.schedule.skipped
        if self.entry["status"] == PENDING:
            self.settle(SKIPPED, reason)

    def label(self) -> str:
        return f"graph {self.entry['graph']} of {self.entry['where']}"

    # ---- calls ---------------------------------------------------------------------------

    def inputs(self, args: Tuple[Any, ...]) -> Tuple[Optional[List[Any]], bool]:
        """The graph's inputs as a list, and whether the call was boxed (one list that the
        compiled function empties). The ``_boxed_call`` attribute is not trusted: torch's
        ``aot_module_simplified`` copies it onto an unboxed function."""
        count = len(self.placeholders)
        if len(args) == count:
            return list(args), False
        if len(args) == 1 and isinstance(args[0], list) and len(args[0]) == count:
            return list(args[0]), True
        return None, False

    @functools.cached_property
    def placeholders(self) -> List[Any]:
        return numerics.placeholders(self.gm)

    @functools.cached_property
    def eager_run(self) -> Any:
        """The graph run eagerly on its inputs followed by the tensors it holds itself."""
        return numerics.bind_state(self.gm, self.gm, self.names)

    @functools.cached_property
    def fp64_run(self) -> Any:
        """The same, as the float64 reference; the float64 values of the nodes in
        ``self.kept`` are kept there (the operands of argmax and comparisons)."""
        return numerics.bind_state(
            lambda *xs: numerics.run_fp64(self.gm, list(xs), self.kept), self.gm, self.names)

    @functools.cached_property
    def derived(self) -> Dict[int, Any]:
        return numerics.derived_outputs(self.gm)

    def eager_call(self, *args: Any) -> Any:
        flat, boxed = self.inputs(args)
        if flat is None:
            return self.compiled(*args)
        if boxed:
            args[0].clear()  # the convention: the callee releases the caller's list
        return self.gm(*flat)

    def call(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        import torch

        from rocm_autopatch import capture

        if kwargs or getattr(_busy, "checking", False) or capture.capturing(torch) or \
                not self.lock.acquire(blocking=False):
            # Inside graph capture nothing may synchronise; another thread is checking it.
            return self.compiled(*args, **kwargs)
        try:
            if self.fast is not None:
                return self.fast(*args)
            flat, boxed = self.inputs(args)
            if flat is None:
                self.finish(SKIPPED, "not checked: called with inputs that do not match the "
                                     "graph")
                return self.compiled(*args)
            plan = self.schedule
            seen = plan.shapes_seen
            try:
                why = plan.due(flat)
            except Exception:  # noqa: BLE001 - an input it cannot read: this call runs unchecked
                why = None
            self.entry["calls"] = plan.calls
            if plan.shapes_seen != seen or plan.stride != self.entry["values_stride"]:
                self.entry.update(plan.coverage())
            if why is None:
                res = self.compiled(*args)
                if plan.dynamic and self.large_output_is_new(res):
                    return self.timed(args, flat, boxed, schedule.SHAPE, res)
                return res
            return self.timed(args, flat, boxed, why, None)
        finally:
            self.lock.release()

    def large_output_is_new(self, res: Any) -> bool:
        """An output of 2^31 bytes or elements or more, where no checked call had one, from
        a graph that writes none of its inputs (so it can be checked after the call)."""
        if (self.schedule.large_output_checked or not self.analyses
                or any(a.mutated for a in self.analyses.values())):
            return False
        return schedule.large(numerics.leaves(res))

    def timed(self, args: Tuple[Any, ...], flat: List[Any], boxed: bool, why: str,
              res: Any) -> Any:
        _busy.checking = True
        start = time.perf_counter()
        try:
            return self.check(args, flat, boxed, why, res)
        finally:
            _busy.checking = False
            with record.LOCK:
                self.entry["seconds"] = round(self.entry["seconds"]
                                              + time.perf_counter() - start, 3)

    def check(self, args: Tuple[Any, ...], flat: List[Any], boxed: bool, why: str,
              res: Any) -> Any:
        """Run this call checked (``res``: the call already ran, and wrote nothing)."""
        import torch

        def unchecked() -> Any:  # this call's result, without a check
            return self.compiled(*args) if res is None else res

        count = len(flat)
        # From here, flat is the inputs followed by the tensors the graph holds itself.
        held = numerics.held(self.gm)
        flat += [held[name] for name in self.names]
        signature = self.schedule.signature(flat)
        analysis = self.analyses.get(signature)
        if analysis is None:
            analysis = numerics.analyse(self.eager_run, flat)
            if len(self.analyses) < schedule.SHAPE_CAP:
                self.analyses[signature] = analysis
        # The check's cost for the budget leaves out the analysis: it runs once per shape.
        work_start = time.perf_counter()
        if analysis.error:
            reason = (f"not checked: the graph could not be run on fake tensors to see "
                      f"what it writes ({analysis.error})")
            if self.schedule.checks:
                self.skip(reason)
            else:
                self.finish(SKIPPED, reason)
            return unchecked()
        if analysis.random:
            self.finish(SKIPPED, f"not compared: it calls random ops "
                                 f"({', '.join(analysis.random)}), whose compiled and eager "
                                 "results differ by design")
            return unchecked()
        if analysis.effects:
            self.finish(SKIPPED, f"not compared: it calls {', '.join(analysis.effects)}, "
                                 "which torch cannot tell free of side effects (a custom op may "
                                 "count, log or call a runtime): re-running it would do that "
                                 "twice")
            return unchecked()
        if self.schedule.magnitudes is None:
            self.schedule.magnitudes = schedule.Magnitudes(
                schedule.watched_inputs(flat, count, analysis.mutated))
        mutated = sorted(analysis.mutated)
        # The budget is decided before anything is copied, from what the fake run saw.
        need = numerics.reference_bytes(
            analysis, numerics.Snapshot.bytes_needed(flat, analysis.mutated))
        device = next((t.device for t in flat if isinstance(t, torch.Tensor)), None)
        room = _free_bytes(device) if device is not None else None
        if room is not None and need > room * MEMORY_SHARE:
            self.skip(f"not checked: its eager and float64 references would need about "
                      f"{need / 2**30:.2f} GiB, more than half of the {room / 2**30:.2f} GiB "
                      "free")
            return unchecked()
        try:
            values = self.schedule.magnitudes.now(flat)
            pre = numerics.Snapshot(flat, analysis.mutated)  # the state before this call
        except Exception as exc:  # noqa: BLE001 - out of memory, odd aliasing: not checked
            self.skip("not checked: the state it writes could not be copied "
                      f"({type(exc).__name__}: {_first(exc)})")
            _release()
            return unchecked()
        call_seconds = 0.0
        if res is None:
            before = numerics.versions(flat)
            _sync(device)
            began = time.perf_counter()
            res = self.compiled(*args)
            _sync(device)
            call_seconds = time.perf_counter() - began
            unforeseen = numerics.changed(flat, before) - analysis.mutated
            if unforeseen:
                self.finish(SKIPPED, "not checked: the compiled graph wrote inputs "
                                     f"{sorted(unforeseen)} that the analysis did not foresee")
                return res
        try:
            with numerics.quiet():
                bad, outputs = self.compare(flat, pre, res, mutated)
        except Exception as exc:  # noqa: BLE001 - out of memory, no float64 kernel (FP8)...
            self.skip("not checked: computing the eager or float64 reference "
                      f"failed ({type(exc).__name__}: {_first(exc)})")
            _release()
            return res
        grad = torch.is_grad_enabled()
        if not grad:
            self.entry["backward"] = "not applicable: gradients are off (inference)"
        elif not bad:
            self.entry["backward"] = self.check_backward(flat, pre, res, boxed)
        passed = not bad and not self.entry["backward"].startswith(FAILED)
        self.schedule.checked(why, flat, values, passed, call_seconds,
                              time.perf_counter() - work_start, numerics.leaves(res))
        with record.LOCK:
            self.entry["calls_checked"] += 1
            self.entry.update(self.schedule.coverage())
        if bad:
            if grad:
                self.entry["backward"] = "not checked: the forward pass already differs"
            return self.failed(bad[0], outputs, flat, pre, res, grad, "forward", why)
        if not passed:
            return self.failed(None, outputs, flat, pre, res, grad, "backward", why)
        if self.entry["status"] in (PENDING, SKIPPED):
            self.settle(PASSED)
        return res

    def compare(self, flat: List[Any], pre: Any, res: Any, mutated: List[int]
                ) -> Tuple[List[Any], int]:
        """(the values the judge rejects, how many of them are outputs). Eager and float64
        run on the same inputs: what they write goes to copies of the state before the call
        (overlapping views still overlap); what they only read is shared, never copied."""
        import torch

        made, made64 = pre.make(), pre.make(fp64=True)
        eager_inputs = [made.get(i, x) for i, x in enumerate(flat)]
        inputs64 = [made64.get(i, x) for i, x in enumerate(flat)]
        self.kept = {node: None for op in self.derived.values() for node in op[1]
                     if isinstance(node, torch.fx.Node)}
        with torch.no_grad():
            ref = self.eager_run(*eager_inputs)
            ref64 = self.fp64_run(*inputs64)
        derived = {i: judge.Derived(op, [self.kept.get(n, n) if isinstance(n, torch.fx.Node)
                                         else n for n in nodes], dtype, dim, keepdim)
                   for i, (op, nodes, dtype, dim, keepdim) in self.derived.items()}
        self.kept = {}
        outputs = len(numerics.leaves(ref))
        verdict = judge.compare(numerics.leaves(ref) + [eager_inputs[i] for i in mutated],
                                numerics.leaves(res) + [flat[i] for i in mutated],
                                numerics.leaves(ref64) + [inputs64[i] for i in mutated],
                                judge.TOL_FORWARD, derived)
        self.judged(verdict)
        return verdict.bad, outputs

    def judged(self, verdict: Any) -> None:
        """Both verdicts of the last check, and the errors against float64 (the report)."""
        with record.LOCK:
            self.entry["judge"] = {
                "ours": "failed" if verdict.bad else "passed",
                "torch_criterion": "failed" if verdict.torch_failed else "passed",
                **{k: round(v, 3) for k, v in verdict.stats.items()}}

    # ---- the backward pass ------------------------------------------------------------------

    def check_backward(self, flat: List[Any], pre: Any, res: Any,
                       boxed: bool) -> str:
        """Gradients of the compiled graph against eager's, with a float64 reference, for
        the same seeded random upstream gradients. Each runs the graph again on detached
        aliases of the inputs (no copy; no hook of the program's tensors fires; nothing
        accumulates into ``.grad``) and on copies of what it writes."""
        import torch

        outs = [o for o in numerics.leaves(res) if isinstance(o, torch.Tensor)]
        if not any(o.requires_grad for o in outs):
            return "not applicable: no output requires grad"
        count = len(self.placeholders)
        if any(i >= count for i in pre.indices):
            return f"not checked: {HELD}, and it updates some (they would advance twice)"
        held = any(x.requires_grad for x in flat[count:])
        wanted = [i for i, x in enumerate(flat[:count]) if isinstance(x, torch.Tensor)
                  and x.requires_grad and x.is_floating_point()]
        if not wanted:
            return f"not checked: {HELD}" if held else "not applicable: no input requires grad"
        need = sum(flat[i].numel() * (2 * flat[i].element_size() + 16) for i in wanted)
        room = _free_bytes(flat[wanted[0]].device)
        if room is not None and need > room * MEMORY_SHARE:
            return (f"not checked: the float64 reference gradients would need "
                    f"{need / 2**30:.1f} GiB, more than half of the {room / 2**30:.1f} GiB "
                    "free")

        def compiled(*inputs: Any) -> Any:
            inputs = inputs[:count]  # it reads what it holds itself
            return self.compiled(list(inputs)) if boxed else self.compiled(*inputs)

        try:
            with numerics.quiet():
                got, upstream = _grads(compiled, flat, pre, wanted, None, False)
                eager, _ = _grads(self.eager_run, flat, pre, wanted, upstream, False)
                eager64, _ = _grads(self.fp64_run, flat, pre, wanted, upstream, True)
        except Exception as exc:  # noqa: BLE001 - not checkable here: say so
            _release()
            return f"not checked: {type(exc).__name__}: {str(exc).strip()[:200]}"
        bad = judge.compare(eager, got, eager64, judge.TOL_BACKWARD, strict=False).bad
        if not bad:
            return f"passed ({len(wanted)} gradients" + (
                "; not those of the parameters the graph holds itself)" if held else ")")
        m = bad[0]
        return (f"{FAILED}: gradient {m.index} (shape {list(m.shape)}, {m.dtype}) differs "
                f"from eager by up to {m.max_abs_diff:.3g}")

    # ---- a graph that computes wrong numbers ---------------------------------------------

    def failed(self, m: Any, outputs: int, flat: List[Any], pre: Any, res: Any,
               grad: bool, which: str, why: str) -> Any:
        what = self.entry["backward"] if m is None else _describe(m, outputs, self.gm)
        plan = self.schedule
        # The calls between the last check that passed and this one ran unchecked.
        unverified = max(plan.calls - plan.last_good - 1, 0) if plan.last_good else 0
        with record.LOCK:
            self.entry["mismatch"] = None if m is None else {
                **m._asdict(), "what": ("output" if m.index < outputs else "written input"),
                "origin": numerics.origin(self.gm, m.index) if m.index < outputs else ""}
            self.entry["found_at_call"] = plan.calls
            self.entry["found_because"] = why
            if why == schedule.SAMPLED:
                self.entry["found_period"] = plan.sampled_period
            elif why == schedule.VALUES:  # the stride adapts to measured costs afterwards
                self.entry["found_stride"] = plan.values_read_stride
            self.entry["unverified_calls"] = unverified
        when = (f" Found at call {plan.calls:,} ({schedule.BECAUSE[why]})" +
                (f"; the {unverified:,} call(s) since its last good check (call "
                 f"{plan.last_good:,}) ran compiled and may have returned wrong numbers."
                 if unverified else ".")) if plan.calls > 1 else ""
        falling_back = self.how == "fallback"
        made = pre.make()  # the inputs as they were before the call, for the repro
        count = len(self.placeholders)
        folder = repro.write(self.gm, [made.get(i, x) for i, x in enumerate(flat[:count])],
                             {**self.entry, "status": FELL_BACK if falling_back else FAILED,
                              "reason": f"{which} differs from eager"})
        with record.LOCK:
            self.entry["repro"] = folder
        if falling_back:
            # This call gets eager's result, computed on the real inputs from their state
            # before the call (what the compiled call wrote is undone first).
            pre.restore(flat)
            with numerics.grad_mode(grad):
                res = self.gm(*flat[:len(self.placeholders)])
        healed = ""
        if self.healed is not None:
            # The remembered fix did not hold (another shape, other values): not used again.
            healed = (f", even compiled with the remembered fix ({self.entry.get('healed')}), "
                      "now forgotten")
            fixes.forget(self.healed.get("fingerprint"))
        self.finish(FELL_BACK if falling_back else FAILED, f"{which} differs from eager"
                    + (f" (at call {plan.calls:,}, {schedule.BECAUSE[why]})"
                       if plan.calls > 1 else "") + healed)
        then = (" This call returned eager's result and this graph runs eagerly from now on; "
                "other graphs stay compiled." if falling_back else
                f" Your results are the compiled ones, unchanged: set {ENV}=fallback to run "
                "this graph eagerly instead.")
        log.warn_once(("verify", id(self)),
                      f"numerics: {self.label()} computes wrong numbers when compiled: "
                      f"{what}.{when}{then} Compiled kernels that silently compute wrong numbers "
                      f"have been reported on AMD GPUs ({REF}); to report this one, "
                      + (f"attach {folder} (`python {folder}/repro.py` exits 1 while it "
                         "reproduces; env.json is the environment). "
                         + (f"A bisection starts in the background at exit to name the "
                            "compiler step and remember the fix for the next run "
                            f"({settings.VERIFY_BISECT}=0: not)." if falling_back
                            and bisect_limit() else
                            f"`rocm-autopatch bisect {folder}` names the compiler step and "
                            "remembers the fix for the next run.") if folder else
                         "TORCHDYNAMO_REPRO_AFTER=aot TORCHDYNAMO_REPRO_LEVEL=4 writes a "
                         "minimal repro, and `rocm-autopatch doctor --json` the environment."))
        return res


def _describe(m: Any, outputs: int, gm: Any) -> str:
    if m.index < outputs:
        where = numerics.origin(gm, m.index)
        what = f"output {m.index}" + (f" (made at {where})" if where else "")
    else:
        what = f"the input it writes (#{m.index - outputs})"
    text = (f"{what}, shape {list(m.shape)}, {m.dtype}, differs from eager by up to "
            f"{m.max_abs_diff:.3g}")
    text += f"; {m.rule}: {m.detail}"
    if m.compiled_rmse is not None and m.eager_rmse is not None:
        text += (f"; error against float64: compiled {m.compiled_rmse:.3g}, eager "
                 f"{m.eager_rmse:.3g} (RMSE)")
    if m.torch_ok:
        text += "; torch's own criterion alone would have passed it"
    return text


def _grads(run: Any, flat: List[Any], pre: Any, wanted: List[int],
           upstream: Optional[List[Any]], fp64: bool) -> Tuple[List[Any], List[Any]]:
    """(d(sum(out * g))/d(input) for the ``wanted`` inputs, the ``g`` used). ``g`` is drawn
    once, seeded, from a private generator (the program's random streams are untouched),
    in each output's dtype; the float64 run gets the same values."""
    import torch

    made = pre.make(fp64=fp64)
    inputs = []
    for i, x in enumerate(flat):
        if i in made:
            x = made[i]
        elif i in wanted:
            x = (numerics.to_fp64(x.detach()) if fp64 else x.detach()).requires_grad_()
        inputs.append(x)
    with torch.enable_grad():
        outs = [o for o in numerics.leaves(run(*inputs))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        if upstream is None:
            generator = torch.Generator(device=outs[0].device).manual_seed(0)
            upstream = [torch.randn(o.shape, generator=generator, device=o.device,
                                    dtype=torch.float32).to(o.dtype) for o in outs]
        if len(upstream) != len(outs):
            raise RuntimeError("the runs disagree on which outputs require grad")
        grads = torch.autograd.grad(outs, [inputs[i] for i in wanted],
                                    [numerics.to_fp64(g) if fp64 else g for g in upstream],
                                    allow_unused=True)
    return list(grads), upstream


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:160]


def _release() -> None:
    """After a check that failed for memory: give the cached blocks back, so that the
    program finds the memory it had (torch keeps freed blocks in its caching allocator)."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def _sync(device: Any) -> None:
    """Wait for ``device``'s queued work (a check times the compiled call alone)."""
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _free_bytes(device: Any) -> Optional[int]:
    """Free memory where ``device``'s tensors live; None when it cannot be read."""
    try:
        if device.type == "cuda":
            import torch

            return int(torch.cuda.mem_get_info(device)[0])
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except Exception:  # noqa: BLE001
        return None
    return None


def wrap_compile_fx(original: Any, how: str, checks: int, share: float) -> Any:
    def compile_fx(model_: Any, example_inputs_: Any, *args: Any, **kwargs: Any) -> Any:
        # A compile during a check is the sentinel's own (torch compiles a hashing kernel
        # for a repro's inputs on releases without stable_hash): not the program's graph.
        if getattr(_busy, "compiling", False) or getattr(_busy, "checking", False):
            return original(model_, example_inputs_, *args, **kwargs)
        try:
            gm = numerics.copy_graph(model_)
        except Exception:  # noqa: BLE001 - not a graph we can copy: compile, unwatched
            return original(model_, example_inputs_, *args, **kwargs)
        fix = fixes.lookup(repro.fingerprint(gm))
        healed = ""
        _busy.compiling = True
        try:
            if fix is not None:
                compiled, healed = _compile_healed(original, fix, model_, example_inputs_,
                                                   *args, **kwargs)
            else:
                compiled = original(model_, example_inputs_, *args, **kwargs)
        finally:
            _busy.compiling = False
        if not callable(compiled):  # AOTInductor: a path to a package, not a function
            return compiled
        graph = Graph(gm, compiled, compile_frame.compile_id() or "?", _where(), how, checks,
                      share)
        if healed:
            graph.healed = fix
            graph.entry["healed"] = healed
        talks = numerics.communicates(gm)
        if talks:  # decided from the graph alone: the same on every rank
            graph.finish(SKIPPED, f"not compared: it communicates ({', '.join(talks)}); "
                                  "running it again on one rank would pair its collectives "
                                  "with the wrong ones on the others")

        def run(*call_args: Any, **call_kwargs: Any) -> Any:
            fast = graph.fast
            if fast is not None and not call_kwargs:
                return fast(*call_args)
            return graph.call(call_args, call_kwargs)

        # Its attributes (Dynamo reads some), but not Dynamo's own bookkeeping: a returned
        # function that is already a disable() wrapper (torch 2.4-2.9) carries
        # _torchdynamo_orig_callable, which Dynamo follows to the function it wraps; copied,
        # it would send every call past this wrapper.
        run.__dict__.update({k: v for k, v in getattr(compiled, "__dict__", {}).items()
                             if not k.startswith("_torchdynamo")})
        run.__wrapped__ = compiled  # type: ignore[attr-defined]
        run.__name__ = run.__qualname__ = getattr(compiled, "__name__", "compiled_graph")
        return run

    return compile_fx


def _compile_healed(original: Any, fix: Dict[str, Any], model_: Any, example_inputs_: Any,
                    *args: Any, **kwargs: Any) -> Tuple[Any, str]:
    """Compile with the remembered fix; where that raises, without it (said in the report)."""
    what = fixes.describe(fix["change"])
    try:
        with fixes.applied(fix):
            return original(model_, example_inputs_, *args, **kwargs), what
    except Exception as exc:  # noqa: BLE001 - the fix must never cost the program its compile
        log.warn_once(("heal", fix.get("fingerprint")),
                      f"numerics: the remembered fix for a graph ({what}) could not be "
                      f"applied ({type(exc).__name__}: {_first(exc)}); it compiles as "
                      "before")
        return original(model_, example_inputs_, *args, **kwargs), ""


def _where() -> str:
    """The frame being compiled; where that is a library's (transformers' forward), the
    user's own line that called into it too."""
    where = compile_frame.current()
    if not where:
        return "<unknown frame>"
    label = frames.label(*where)
    if frames.in_library(where[0]):
        site = frames.user_site(libraries=True)
        if site is not None:
            label += f", called at {site[0]}:{site[1]}"
    return label


def install(module: types.ModuleType) -> None:
    """Wrap ``module.compile_fx`` once (``module`` is ``torch._inductor.compile_fx``)."""
    how = mode()
    with _lock:
        info = section()
        if how == "off":
            return
        if patching.ours(getattr(module, "compile_fx", None)):
            return
        checks, share = calls(), budget()
        if how == "fallback":
            bisect_limit()  # read now: a bad value is said at start, not at exit
        if patching.wrap(module, "compile_fx",
                         lambda original: wrap_compile_fx(original, how, checks, share),
                         like_original=True) is None:
            record.fix(NAME, record.SKIPPED, "torch._inductor.compile_fx has no compile_fx "
                       "here: nothing checked", REF)
            return
        info.update(mode=how, calls=checks, budget=share)
        atexit.register(say_verdict)
        then = ("returns eager's result and runs that graph eagerly from then on"
                if how == "fallback" else "warns; results stay the compiled ones")
        record.fix(NAME, record.APPLIED,
                   f"{ENV}={how}: the first {checks} call(s) of each Inductor graph, each new "
                   "shape, inputs beyond the magnitudes checked and calls sampled within "
                   f"{share:.1%} of the graph's time are compared with eager against a "
                   "float64 reference (torch's torch._dynamo.utils.same as the floor, and "
                   f"docs/rules.md's rules); a graph that differs {then}", REF)


def verdict() -> str:
    """One line: what the sentinel checked in this process, and its verdict."""
    with record.LOCK:
        info = section()
        totals = dict(info["totals"])
        wrong = [g for g in info["graphs"] if g["status"] in (FAILED, FELL_BACK)]
    graphs = sum(totals.values())
    healed = sum(1 for g in info["graphs"] if g.get("healed") and g["status"] == PASSED)
    cured = f" ({healed} healed by a remembered fix)" if healed else ""
    text = (f"{ENV}={info['mode']}: {graphs} graph{'s' if graphs != 1 else ''} compiled: "
            f"{totals[PASSED]} passed{cured}, {totals[FAILED] + totals[FELL_BACK]} wrong"
            f"{' (run eagerly)' if totals[FELL_BACK] else ''}, {totals[SKIPPED]} not compared"
            + (f", {totals[PENDING]} not called yet" if totals[PENDING] else ""))
    if wrong:
        text += "; wrong: " + "; ".join(f"graph {g['graph']} of {g['where']}"
                                        for g in wrong[:3])
    elif totals[SKIPPED]:
        text += " (`rocm-autopatch doctor --report` or report().verify says why)"
    return text


def bisect_limit() -> float:
    """``ROCM_AUTOPATCH_VERIFY_BISECT``: seconds a background bisection may take (0: off)."""
    return log.setting(settings.VERIFY_BISECT)


def say_verdict() -> None:
    """At exit: the verdict line (a process that compiled nothing says nothing), and under
    ``fallback`` the background bisection of the graphs that fell back."""
    try:
        if sum(section()["totals"].values()):
            log.notice(verdict())
        info, limit = section(), bisect_limit()
        if info["mode"] == "fallback" and limit:
            for entry in list(info["graphs"]):
                if entry["status"] == FELL_BACK and entry.get("repro"):
                    entry["bisect"] = background.start(entry["repro"], limit)
    except Exception:  # noqa: BLE001 - never at exit
        pass

