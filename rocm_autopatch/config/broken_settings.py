"""Settings a profile leaves out where the running torch and Triton carry code that fails
with them: each failure found by reading the two code paths it needs in the installed files
(nothing is imported), so that a release that fixes either side gets the setting back.

``applier`` asks ``why(name)`` for a ``Setting`` whose ``broken_by`` names a failure here; a
non-empty answer skips the setting, with the answer as the record's reason.
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import Callable, Dict, Optional

from rocm_autopatch import probe


def _torch_file(relative: str) -> Optional[str]:
    """A file of the installed torch, found from its distribution (torch is not imported)."""
    try:
        path = str(metadata.distribution("torch").locate_file(relative))
    except metadata.PackageNotFoundError:
        return None
    return path if os.path.isfile(path) else None


def _triton_file(relative: str) -> Optional[str]:
    for dist in probe.TRITON_DISTS:
        try:
            path = str(metadata.distribution(dist).locate_file(relative))
        except metadata.PackageNotFoundError:
            continue
        if os.path.isfile(path):
            return path
    return None


def _has(path: Optional[str], text: str) -> bool:
    if path is None:
        return False
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return text in fh.read()
    except OSError:
        return False


def multi_kernel_warm_start(torch_file: Callable[[str], Optional[str]] = _torch_file,
                            triton_file: Callable[[str], Optional[str]] = _triton_file) -> str:
    """Inductor's multi-kernel reductions fail on a warm start: a graph with one, loaded from
    the FX graph cache, rebuilds its ``MultiKernelCall``, whose ``cache_file_path`` reads
    each kernel's ``fn.cache_key`` (``torch/_inductor/codegen/multi_kernel.py``); Triton's
    ``cache_key`` takes ``fn._hash_lock`` (``triton/runtime/jit.py``, triton-lang/triton PR
    7974), which torch sets to None to pickle a kernel into the cache
    (``torch/_inductor/runtime/triton_heuristics.py`` ``prepare_for_pickle``). Measured
    (NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, 2026-11-27): the second run of a
    program compiled with ``TORCHINDUCTOR_MULTI_KERNEL=1`` raised ``BackendCompilerFailed``
    (``TypeError: 'NoneType' object does not support the context manager protocol``), with
    and without rocm-autopatch; no public report found."""
    if not _has(torch_file("torch/_inductor/codegen/multi_kernel.py"), "fn.cache_key"):
        return ""
    if not _has(triton_file("triton/runtime/jit.py"), "_hash_lock"):
        return ""
    return ("a program compiled with it fails at its next start, where a graph comes from "
            "Inductor's FX graph cache: MultiKernelCall.cache_file_path "
            "(torch/_inductor/codegen/multi_kernel.py) reads fn.cache_key, which takes the "
            "_hash_lock that torch's cache left None (triton/runtime/jit.py, triton-lang/triton "
            "PR 7974); measured on torch 2.11 with Triton 3.6, no public report found")


FAILURES: Dict[str, Callable[[], str]] = {
    "multi_kernel_warm_start": multi_kernel_warm_start,
}


def why(name: str) -> str:
    """Why the failure ``name`` can happen here ("" where it cannot). Never raises."""
    try:
        return FAILURES[name]()
    except Exception:  # noqa: BLE001 - a check that cannot read its files finds nothing
        return ""
