"""The numerics sentinel's watch: the one owner of ``torch._inductor.compile_fx.compile_fx``.

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

Here: the wrapper and its install, the settings it reads, the verdict at exit. A graph under
watch is ``graph.Graph``; one checked call, ``check.Check``; a graph found wrong,
``alarm``.
"""

from __future__ import annotations

import atexit
import os
import threading
import types
import weakref
from typing import Any, Dict, List, Tuple

from rocm_autopatch import frames, log, patching, record, settings, torch_releases
from rocm_autopatch.guards import compile_frame
from rocm_autopatch.sentinel import check, pending
from rocm_autopatch.sentinel.healing import alarm, background, fixes, repro
from rocm_autopatch.sentinel.judging.graph_record import section
from rocm_autopatch.sentinel.judging.status import (
    FAILED,
    FELL_BACK,
    NAME,
    PASSED,
    PENDING,
    REF,
    SKIPPED,
)
from rocm_autopatch.sentinel.runs import memory, numerics
from rocm_autopatch.sentinel.runs.graph import Graph, busy, label
from rocm_autopatch.sentinel.scheduling import rungs

ENV = settings.VERIFY
_lock = threading.RLock()


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


def wrap_compile_fx(original: Any, how: str, checks: int, share: float) -> Any:
    def compile_fx(model_: Any, example_inputs_: Any, *args: Any, **kwargs: Any) -> Any:
        # A compile during a check is the sentinel's own (torch compiles a hashing kernel
        # for a repro's inputs on releases without stable_hash): not the program's graph.
        if getattr(busy, "compiling", False) or getattr(busy, "checking", False):
            return original(model_, example_inputs_, *args, **kwargs)
        try:
            gm = numerics.copy_graph(model_)
        except Exception:  # noqa: BLE001 - not a graph we can copy: compile, unwatched
            return original(model_, example_inputs_, *args, **kwargs)
        fix = fixes.lookup(repro.fingerprint(gm))
        healed = ""
        busy.compiling = True
        try:
            if fix is not None:
                compiled, healed = _compile_healed(original, fix, model_, example_inputs_,
                                                   *args, **kwargs)
            else:
                compiled = original(model_, example_inputs_, *args, **kwargs)
        finally:
            busy.compiling = False
        if not callable(compiled):  # AOTInductor: a path to a package, not a function
            return compiled
        graph_id = torch_releases.compile_id() or "?"
        where, shown = _where()
        graph = Graph(gm, compiled, graph_id, where, how, checks, share)
        graph.shown = shown
        _number_pieces(graph_id, graph)
        if healed:
            graph.healed = fix
            graph.note(healed=healed)
        rungs.at_compile(graph, kwargs.get("config_patches"))
        talks = numerics.communicates(gm)
        if talks:  # decided from the graph alone: the same on every rank
            graph.finish(SKIPPED, numerics.not_compared(talks))

        def run(*call_args: Any, **call_kwargs: Any) -> Any:
            fast = graph.fast
            if fast is not None and not call_kwargs:
                return fast(*call_args)
            return check.call(graph, call_args, call_kwargs)

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
                      f"applied ({type(exc).__name__}: {memory.first_line(exc)}); it compiles as "
                      "before")
        return original(model_, example_inputs_, *args, **kwargs), ""


def _where() -> Tuple[str, str]:
    """The frame being compiled, named after the user's nearest line: where the frame is a
    library's (transformers' forward, a decorator's wrapper), the user's own line that
    called into it comes first. The record's form (whole paths), and a warning's (short
    paths; a library's frame by its package alone)."""
    where = compile_frame.current()
    if not where:
        return "<unknown frame>", "<unknown frame>"
    file, line, name = where
    site = frames.user_site(libraries=True) if frames.in_library(file) else None
    if site is None:
        return frames.label(*where), frames.label(frames.short(file), line, name)
    package = frames.short(file).split(os.sep, 1)[0]
    owner = package + ("'" if package.endswith("s") else "'s")
    return (f"{site[0]}:{site[1]} (into {frames.label(*where)})",
            f"{frames.short(site[0])}:{site[1]} (into {owner} {name})")


# The graphs compiled under one Dynamo compile id. Dynamo's DDPOptimizer splits a frame's
# graph into pieces, one compile each under the frame's id: each is then named by its index.
_pieces: Dict[str, List[Any]] = {}


def _number_pieces(graph_id: str, graph: Graph) -> None:
    if graph_id == "?":
        return
    with _lock:
        pieces = _pieces.setdefault(graph_id, [])
        pieces.append(weakref.ref(graph))
        if len(pieces) < 2:
            return
        for index, piece in enumerate(ref() for ref in pieces):
            if piece is not None:
                piece.note(graph=f"{graph_id} piece {index}")


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
            alarm.bisect_limit()  # read now: a bad value is said at start, not at exit
        if patching.wrap(module, "compile_fx",
                         lambda original: wrap_compile_fx(original, how, checks, share),
                         like_original=True) is None:
            record.fix(NAME, record.SKIPPED, "torch._inductor.compile_fx has no compile_fx "
                       "here: nothing checked", REF)
            return
        info.update(mode=how, calls=checks, budget=share)
        import torch

        from rocm_autopatch.guards import capture

        capture.count_captures(torch)  # so that quiet calls need not ask the runtime
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
        bugs: Dict[str, List[Dict[str, Any]]] = {}  # the graphs of each bug (one repro)
        for g in wrong:
            bugs.setdefault(g.get("repro") or label(g), []).append(g)
        text += "; wrong: " + "; ".join(
            label(graphs[0]) if len(graphs) == 1 else label({
                **graphs[0], "graph": f"{graphs[0]['graph']} ({len(graphs)} shapes)"})
            for graphs in list(bugs.values())[:3])
    elif totals[SKIPPED]:
        text += " (`rocm-autopatch doctor --report` or report().verify says why)"
    return text


def say_verdict() -> None:
    """At exit: the verdict line (a process that compiled nothing says nothing), under
    ``fallback`` the background bisection of the graphs that fell back, then the rungs the
    graphs' checks passed, for the next process (``scheduling.rungs``)."""
    try:
        pending.settle_all()  # the verdicts still pending first (also run by the report)
        if sum(section()["totals"].values()):
            log.notice(verdict())
        info, limit = section(), alarm.bisect_limit()
        if info["mode"] == "fallback" and limit:
            for entry in list(info["graphs"]):
                if entry["status"] == FELL_BACK and entry.get("repro"):
                    entry["bisect"] = background.start(entry["repro"], limit)
    except Exception:  # noqa: BLE001 - never at exit
        pass
    rungs.keep()  # last: the rungs of the graphs that passed, for the next process

