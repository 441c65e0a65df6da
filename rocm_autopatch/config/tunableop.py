"""TunableOp under the ``perf`` profile: the environment rung of AMD's tuning notes, applied
to unchanged scripts.

With ``PYTORCH_TUNABLEOP_ENABLED=1`` every ATen GEMM (Inductor's ATen GEMMs included) picks
the fastest rocBLAS or hipBLASLt solution for its shape, once, and torch writes what it
found to a CSV file when the process ends (``aten/src/ATen/cuda/tunable/README.md``,
``torch/cuda/tunable.py``). What keeps users from turning it on, and what this module does
about each:

- **The results are lost with the container.** They go under ``ROCM_AUTOPATCH_CACHE``, in
  a directory per torch, Triton, GPU architecture (``caches.key``) and HIP version, so a
  restart or another rank starts tuned. Without ``ROCM_AUTOPATCH_CACHE`` it stays off.
- **One file per GPU ordinal, rewritten whole at exit.** torch reads the file named by
  ``PYTORCH_TUNABLEOP_FILENAME`` with the device ordinal put in for ``%d``
  (``TuningContext::SetFilename``) at its first GEMM and writes everything it knows back to
  it at exit. Two processes on one ordinal (two jobs, or ranks that each see one GPU as
  device 0) would write the same file. So each process gets files of its own
  (``run-<time>-<pid>-<ordinal>.csv``), seeded from the shared ``results.csv``; at the next
  start the runs' files are merged into ``results.csv`` under a directory lock and through
  a rename (``files``): no reader sees a partial file and no result is lost. A line torch
  left unfinished (a process killed while writing) is never merged.
- **Validator lines reject a whole file on a version mismatch.** A run whose validators
  (torch, ROCm, rocBLAS, hipBLASLt versions) differ from the merged file's replaces it
  when it is newer: the stack that runs now is the one that counts.
- **Tuning time.** torch bounds each solution's profiling (``PYTORCH_TUNABLEOP_MAX_TUNING_
  DURATION_MS``, 30 ms by default); that bound is kept.

A user's own ``PYTORCH_TUNABLEOP_*`` variable leaves TunableOp to them entirely. The
variables are read by torch once, at its first GEMM; they are set at ``import torch``, and
not at all where HIP is already initialised (said in the record).
"""

from __future__ import annotations

import glob
import os
import time
from types import ModuleType
from typing import Dict, List, Optional, Tuple

from rocm_autopatch import files, log, probe, record, settings
from rocm_autopatch.config import caches

NAME = "tunableop"  # its entry in report().fixes
PREFIX = "PYTORCH_TUNABLEOP_"
ENABLED, FILENAME = PREFIX + "ENABLED", PREFIX + "FILENAME"
REF = ("aten/src/ATen/cuda/tunable/README.md and torch/cuda/tunable.py (torch 2.13); "
       "ordinal in the filename: aten/src/ATen/cuda/tunable/Tunable.cpp "
       "TuningContext::SetFilename")
MERGED = "results.csv"
RUNS = "run-*.csv"
KEEP_RUNS = 256  # the newest runs' files kept, at most
RUN_LIFE = 24 * 3600.0  # seconds a run's file is kept after its last write
# A run's file with nothing that is not merged (a seed torch never rewrote: an ordinal the
# process did not use, or a run that found nothing new) goes after an hour, by which time
# its process has read it (torch reads at its first GEMM).
SEED_LIFE = 3600.0
SEEDS = 8  # ordinals seeded where the topology does not say how many GPUs there are

Results = Tuple[List[str], Dict[Tuple[str, str], str]]  # validator lines, (op, params) -> line


def directory(torch: ModuleType, root: str) -> str:
    """Where this torch, Triton, GPU and HIP version keep their TunableOp results."""
    hip = getattr(getattr(torch, "version", None), "hip", None) or "none"
    return os.path.join(caches.directory(torch, root), "tunableop",
                        f"hip-{hip}".replace(os.sep, "_"))


def install(torch: ModuleType) -> None:
    """At activation under ``perf``: TunableOp on, its results under ``ROCM_AUTOPATCH_CACHE``.
    Never raises."""
    try:
        _install(torch)
    except Exception as exc:  # noqa: BLE001 - the program goes on, untuned
        log.hook_failed("torch", "rocm_autopatch.config.tunableop.install", exc)


def _install(torch: ModuleType) -> None:
    theirs = settings.names(prefix=PREFIX)
    if theirs:
        record.fix(NAME, record.SKIPPED, f"{theirs[0]}={settings.raw(theirs[0])} is set: "
                   "TunableOp is left to your PYTORCH_TUNABLEOP_* variables", REF)
        return
    root = log.setting(settings.CACHE).strip()
    if not root:
        record.fix(NAME, record.SKIPPED, f"off: set {settings.CACHE}=DIR (a mounted "
                   "directory) to tune GEMMs once and keep the results for every restart and "
                   "rank", REF)
        return
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        record.fix(NAME, record.SKIPPED, "not applied: HIP was already initialised when "
                   "torch was imported, and torch reads these variables once", REF)
        return
    where = directory(torch, root)
    try:
        os.makedirs(where, exist_ok=True)
        count = merge(where)
        run = seed(where, _ordinals())
    except OSError as exc:
        text = (f"TunableOp left off: cannot write to {where} ({exc.strerror or exc}); give "
                f"{settings.CACHE} a writable directory")
        record.fix(NAME, record.FAILED, text, REF)
        log.warn_once(("tunableop", "dir"), text)
        return
    settings.export(ENABLED, "1")
    settings.export(FILENAME, run)
    record.fix(NAME, record.APPLIED, f"TunableOp on (perf profile): {count} GEMM shapes "
               f"already tuned in {where}; this process tunes new ones into "
               f"{os.path.basename(run)} (merged at the next start). Tuned is not always "
               "faster: on the one GPU measured (an NVIDIA H200, cuBLAS) a prefill ran from "
               "25% faster to 12% slower than with it switched off in the same process "
               f"(BENCHMARKS.md); compare with torch.cuda.tunable.enable(False) on yours", REF)


def _ordinals() -> int:
    found = len(probe.gpu_archs())
    return found or SEEDS


def parse(text: str) -> Results:
    """torch's results file: its validator lines and its results by (operator, parameters).
    Only whole lines count (one a killed writer left unfinished is dropped), and only
    lines of torch's form (3 or 4 fields)."""
    validators: List[str] = []
    results: Dict[Tuple[str, str], str] = {}
    lines = text.split("\n")
    for line in lines[:-1]:  # the last piece has no newline after it: unfinished or empty
        fields = line.split(",")
        if fields[0] == "Validator" and len(fields) >= 3:
            validators.append(line)
        elif len(fields) in (3, 4) and all(fields[:3]):
            results.setdefault((fields[0], fields[1]), line)
    return validators, results


def _read(path: str) -> Optional[Results]:
    try:
        with open(path) as fh:
            return parse(fh.read())
    except (OSError, UnicodeDecodeError):
        return None


def _text(found: Results) -> str:
    validators, results = found
    return "".join(line + "\n" for line in validators + list(results.values()))


def merge(where: str, now: Optional[float] = None) -> int:
    """Fold the runs' files into ``results.csv`` (under the directory's lock, through a
    rename); drop runs' files past their life. The number of results merged."""
    now = time.time() if now is None else now
    target = os.path.join(where, MERGED)
    with files.directory_lock(where):
        merged = _read(target) or ([], {})
        stamp = _mtime(target)
        times = {path: _mtime(path) for path in glob.glob(os.path.join(where, RUNS))}
        runs = sorted(times, key=times.__getitem__)
        read = {path: _read(path) for path in runs}
        for path in runs:
            found = read[path]
            if found is None or not found[1]:
                continue
            if merged[0] and found[0] and found[0] != merged[0]:
                if times[path] >= stamp:  # another stack ran since: its results count
                    merged, stamp = found, times[path]
                continue
            merged = (merged[0] or found[0], {**found[1], **merged[1]})
        if runs or not os.path.exists(target):
            files.write_atomically(target, _text(merged))
        for index, path in enumerate(reversed(runs)):
            age, found = now - times[path], read[path]
            spent = found is None or (found[0] in ([], merged[0])
                                      and set(found[1]) <= set(merged[1]))
            if index >= KEEP_RUNS or age > RUN_LIFE or (spent and age > SEED_LIFE):
                try:
                    os.unlink(path)
                except OSError:
                    pass
    return len(merged[1])


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def seed(where: str, ordinals: int) -> str:
    """This process's file name for torch (``%d``: the ordinal), each ordinal's file a copy
    of ``results.csv`` for torch to read at its first GEMM."""
    stem = f"run-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-"
    try:
        with open(os.path.join(where, MERGED)) as fh:
            text = fh.read()
    except OSError:
        text = ""
    for ordinal in range(ordinals):
        files.write_atomically(os.path.join(where, f"{stem}{ordinal}.csv"), text)
    return os.path.join(where, stem + "%d.csv")
