"""Triton's own variables that keep a known issue away from Inductor's kernels, set in the
environment when Inductor's config is imported: before its compile workers start. Those
workers copy the environment once, when their pool starts (``python_subprocess_env`` in
``torch/_inductor/utils.py``), and each job forwards only the cache directories after that
(``torch/_inductor/async_compile.py``, torch 2.13 to 2.15), so a variable set later never
reaches them (pytorch PR 196673).

Today one: ``TRITON_HIP_USE_BLOCK_PINGPONG=0`` where Inductor's Triton GEMM templates are
autotuned (a user's override keeps them; both profiles keep GEMMs on ATen) on gfx942 with
a Triton before the fix (``known_issues``). A value the user set is theirs: kept, and the
doctor flags it where the issue can bite.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, List

from rocm_autopatch import log, probe, record, settings
from rocm_autopatch.config import known_issues

NAME = "triton_pingpong"


def templates_autotuned(config: Any) -> bool:
    """Does this Inductor config autotune Triton GEMM templates (torch/_inductor/utils.py
    ``_use_autotune_backend``: listed in ``max_autotune_gemm_backends``, autotuning on)?"""
    listed = [b.strip().upper() for b in str(getattr(config, "max_autotune_gemm_backends",
                                                     "")).split(",")]
    tuning = bool(getattr(config, "max_autotune", False)
                  or getattr(config, "max_autotune_gemm", False))
    return tuning and "TRITON" in listed


def install(config: ModuleType, warn: Callable[[Any, str], Any] = log.warn_once
            ) -> List[Dict[str, Any]]:
    """Set each known issue's variable where it can bite here and the user left it unset;
    record what became of it, warn once about what still can bite; the judgement."""
    archs, triton = probe.arch_names(), probe.triton_version()
    hip = record.REPORT.hip_version
    templates = templates_autotuned(config)
    found = known_issues.judge(triton, hip, archs, templates, settings.environment())
    for issue, row in zip(known_issues.ISSUES, found):
        if not issue.off_by:
            continue
        if row["status"] == "red" and settings.raw(issue.off_by) is None:
            settings.export(issue.off_by, "0")
            record.fix(NAME, record.APPLIED,
                       f"{issue.off_by}=0 set before Inductor's compile workers start: "
                       f"Inductor's Triton GEMM templates are autotuned here, on "
                       f"{', '.join(archs)} with Triton {triton}, and {issue.what} (set "
                       f"{issue.off_by}=1 yourself to keep the schedule)", issue.ref)
            warn((NAME, "set"), f"{issue.off_by}=0 set: {issue.name} on {', '.join(archs)} "
                 f"with Triton {triton} computes wrong GEMM tiles in Inductor's templates, "
                 f"which are autotuned here [{issue.ref}]; set {issue.off_by}=1 to keep it")
        elif row["status"] == "red":
            record.fix(NAME, record.SKIPPED, f"{issue.off_by}={settings.raw(issue.off_by)} "
                       f"kept as you set it; {row['reason']}", issue.ref)
        else:
            record.fix(NAME, record.NOT_NEEDED, row["reason"], issue.ref)
    found = known_issues.judge(triton, hip, archs, templates, settings.environment())
    known_issues.warn_about(found, warn)
    return found
