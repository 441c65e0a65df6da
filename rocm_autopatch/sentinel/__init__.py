"""The numerics sentinel (``ROCM_AUTOPATCH_VERIFY``): compiled graphs run again eagerly and
in float64, and judged, while the program runs.

The rest of the package enters here only; what is behind the door is laid out by concern:

- ``watch``: the one owner of Inductor's ``compile_fx``: each compiled graph put under watch
  and each of its calls routed; ``check``: one checked call, its steps in order;
  ``compare``: its references and the judge's verdict on them; ``pending``: the verdicts
  read at a later call (``check`` on a GPU) and at exit;
- ``scheduling/``: when a call is checked (first calls, new shapes, magnitudes, positions,
  samples within the budget; the rungs a later process starts from);
- ``runs/``: what a check runs: the graph's analysis, its eager and float64 references, the
  state it writes, the backward pass, memory, the graph's record;
- ``judging/``: the verdict: compiled and eager against float64, the allowance of the math
  functions, the verdicts' words;
- ``healing/``: a graph found wrong: the alarm, its repro, the bisection and the fix
  remembered for the next run;
- ``report_part``: the sentinel's section of the compile report, as the job view shows it
  (``view_part()`` hands it over).

Nothing behind the door is imported while the sentinel is off: the functions here load
what they need when called (the door itself needs neither torch nor the sentinel's wings).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from rocm_autopatch.sentinel.judging.status import NAME, REF

__all__ = ["NAME", "REF", "install", "view_part", "bisect", "bisect_lines", "fixes_path",
           "forget", "remembered"]


def install(compile_fx_module: Any) -> None:
    """Put every graph Inductor compiles under watch (``torch._inductor.compile_fx``)."""
    from rocm_autopatch.sentinel import watch

    watch.install(compile_fx_module)


def view_part() -> Any:
    """The sentinel's section of the compile report, for ``reporting.view.register``."""
    from rocm_autopatch.sentinel.report_part import PART

    return PART


def bisect(folder: str, limit: float, progress: Callable[[str], None],
           remember: bool = True) -> Dict[str, Any]:
    """``rocm-autopatch bisect DIR``: the compiler step that makes a repro wrong."""
    from rocm_autopatch.sentinel.healing import bisect as bisection

    return bisection.run(folder, limit, progress, remember)


def bisect_lines(result: Dict[str, Any]) -> List[str]:
    from rocm_autopatch.sentinel.healing import bisect as bisection

    return bisection.lines(result)


def fixes_path() -> Optional[str]:
    """Where remembered fixes are kept (None: ``ROCM_AUTOPATCH_FIXES=off``)."""
    from rocm_autopatch.sentinel.healing import fixes

    return fixes.path()


def forget(fingerprint: Optional[str]) -> int:
    """Forget the fixes remembered for one graph (None: all); how many were forgotten."""
    from rocm_autopatch.sentinel.healing import fixes

    return fixes.forget(fingerprint)


def rungs_kept() -> Dict[str, Any]:
    """The store of rungs remembered across processes (``scheduling.rungs``): its file
    (None: ``ROCM_AUTOPATCH_RUNGS=off``) and how many graphs it holds."""
    from rocm_autopatch.sentinel.scheduling import rungs

    return rungs.held()


def remembered() -> Dict[str, Any]:
    """The remembered fixes (``rocm-autopatch bisect``), each said in words, and whether it
    applies to the torch, Triton and GPU here (the doctor's list)."""
    from rocm_autopatch.sentinel.healing import fixes

    where = fixes.path()
    try:
        now = fixes.here()
    except Exception:  # noqa: BLE001 - no torch: nothing can apply
        now = None
    listed = []
    for fix in fixes.load(where):
        listed.append({**fix, "what": fixes.describe(fix["change"]),
                       "stale": fixes.stale(fix, now) if now else "torch is not importable"})
    return {"store": where, "fixes": listed}
