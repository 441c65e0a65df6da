"""A repro directory for a graph the sentinel found wrong: what to attach upstream.

Under ``ROCM_AUTOPATCH_VERIFY_DIR`` (default: ``rocm-autopatch-repros`` beside the compile
report when ``ROCM_AUTOPATCH_REPORT`` is set, else ``$XDG_CACHE_HOME/rocm-autopatch/repros``,
``~/.cache`` without it; ``off`` writes none), one directory per graph, named by a hash of its
code:

- ``repro.py``: torch's own repro of the graph (``torch._dynamo.repro.after_aot``
  ``generate_compiler_repro_string``, as its minifier writes it: the graph as a module, the
  Inductor/Dynamo configuration that differs from torch's defaults, how to load the
  inputs), followed by a runner that compiles it with ``torch.compile``, runs it eagerly
  and in float64, prints the verdict and exits 1 when the failure reproduces, 0 when not.
  It needs torch only;
- ``inputs/``: the call's inputs (the state before the call for what it writes), saved
  when they total at most ``SAVE_BYTES``; larger ones are drawn again from their shapes,
  dtypes and strides with a seeded generator (``repro.py`` says so);
- ``env.json``: torch, Triton, HIP/CUDA versions, the GPU, the configuration rocm-autopatch
  applied, the sentinel's verdict and where the graph was compiled.

Writing never raises into the program: a directory that cannot be written is one warning.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional

import torch

from rocm_autopatch import log, probe, record, settings
from rocm_autopatch.sentinel.healing import repro_runner, steps
from rocm_autopatch.sentinel.judging import judge

SAVE_BYTES = 64 * 2**20  # inputs saved up to this total; above, regenerated from a seed

MARKER = "# ---- copied into repro.py from here"


def runner(value: Optional[int] = None) -> str:
    """The end of every repro.py: ``repro_runner``'s code, then its call with the judge's
    thresholds (a floor of half a rounding unit keeps float32 noise, where eager happens to
    round exactly, from reproducing) and the output the sentinel rejected (``value``), whose
    figure the repro prints as the warning did."""
    source = inspect.getsource(repro_runner)
    limits = {"min_elements": judge.MIN_ELEMENTS, "low_elements": judge.LOW_PRECISION_ELEMENTS,
              "floor": judge.SYSTEMATIC_FLOOR, "ratio": judge.SYSTEMATIC_RATIO,
              "ratio_low": judge.SYSTEMATIC_RATIO_LOW, "value": value}
    return ("\n\n# ---- rocm-autopatch: compiled, eager and float64 on these inputs; exit 1 "
            "if it reproduces\n" + source[source.index(MARKER):] +
            "\n\nif __name__ == \"__main__\":\n"
            f"    main(torch, mod, Repro, load_args, __file__, sys.argv[1:], {limits!r})\n")


def root() -> Optional[str]:
    """Where repro directories go; None when ``ROCM_AUTOPATCH_VERIFY_DIR=off``."""
    given = log.path_setting(settings.VERIFY_DIR)
    if given != "":
        return given
    report = (settings.raw(settings.REPORT) or "").strip()
    if report:
        return os.path.join(os.path.dirname(os.path.abspath(report)), "rocm-autopatch-repros")
    return settings.user_cache("repros")


def fingerprint(gm: Any) -> str:
    """A graph's name across its shapes: a hash of the ops that make its tensors, in order,
    with nothing of their sizes. Dynamo compiles a frame again for a new shape, first with
    sizes written into the graph, then with symbols and the ops that compute them: the
    shapes of one graph that fail the same way share this name, so one repro directory,
    one warning and one bisection (and the fix it remembers) serve them all. Two graphs
    that call the same ops in the same order share it too: a fix remembered for one is
    then tried on the other, which is checked like any graph and forgets a fix that does
    not hold."""
    from rocm_autopatch.sentinel.runs.numerics import node_name

    ops = [f"{n.op}:{node_name(n)}" for n in gm.graph.nodes
           if n.op in ("call_function", "call_method", "call_module")
           and not _size_like(n.meta.get("example_value", n.meta.get("val")))]
    return hashlib.sha256("\n".join(ops).encode()).hexdigest()[:16]


def _size_like(value: Any) -> bool:
    """A node that computes a size (an int, a SymInt, a tuple of them), not a tensor."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_size_like(v) for v in value)
    return isinstance(value, (int, torch.SymInt, torch.Size))


def _environment(entry: Dict[str, Any]) -> Dict[str, Any]:
    report = record.REPORT.to_dict()
    triton = probe.triton_version()
    return {"torch": torch.__version__, "hip": torch.version.hip, "cuda": torch.version.cuda,
            "triton": triton, "python": sys.version.split()[0],
            "gpu_archs": probe.arch_names(), "profile": report.get("profile"),
            "config_applied": [c for c in report.get("config", [])
                               if c.get("status") == "applied"],
            "graph": entry.get("graph"), "where": entry.get("where"),
            "verdict": {k: entry.get(k) for k in ("status", "reason", "mismatch", "judge",
                                                   "found_at_call", "found_because")}}


# The repro directories this process wrote, by fingerprint: the first shape of a bug keeps
# its directory (its warning names it); a directory an earlier run left is replaced.
_WRITTEN: Dict[str, str] = {}


def write(gm: Any, inputs: List[Any], entry: Dict[str, Any]) -> str:
    """Write the repro of ``gm`` called on ``inputs``; its directory, or "" (with the
    reason in the record) when none was written. Never raises."""
    try:
        base = root()
        if base is None:
            return ""
        name = fingerprint(gm)
        where = os.path.join(base, name)
        if _WRITTEN.get(name) == where:  # another shape of the same bug: the first kept
            return where
        # Written aside, then moved in whole: ranks that found the same graph wrong write the
        # same directory, and none may read another's half-written one.
        os.makedirs(base, exist_ok=True)
        work = tempfile.mkdtemp(prefix=f".{name}.", dir=base)
        try:
            _fill(work, gm, inputs, entry)
            _move_in(work, where)
            _WRITTEN[name] = where
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return where
    except Exception as exc:  # noqa: BLE001 - the program goes on
        log.warn_once(("repro", "write"),
                      f"{settings.VERIFY_DIR}: the repro of a wrong graph could not be "
                      f"written ({type(exc).__name__}: {str(exc).strip()[:200]}); set it "
                      "to a writable directory, or off")
        return ""


def _move_in(work: str, where: str) -> None:
    """``work`` becomes ``where``; an older repro there (an earlier run's) goes."""
    if os.path.isdir(where):
        old = f"{where}.old.{os.getpid()}"
        try:
            os.rename(where, old)
        except OSError:
            pass  # another rank moved it first
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(work, where)
    except OSError:
        if not os.path.isfile(os.path.join(where, "repro.py")):
            raise  # not another rank's copy of the same graph: a real failure


SAMPLE = 2**20  # elements read to estimate an unsaved input's scale


def _scale(x: Any) -> Optional[Dict[str, Any]]:
    """How an input not saved is drawn again: a float's mean and standard deviation, an
    integer's range, from at most ``SAMPLE`` evenly strided elements (memory stays bounded)."""
    if not isinstance(x, torch.Tensor) or x.numel() == 0 or not x.is_contiguous() \
            or x.dtype == torch.bool or x.is_complex():
        return None
    flat = x.detach().view(-1)[::max(1, x.numel() // SAMPLE)]
    if x.is_floating_point():
        std, mean = torch.std_mean(flat.float()) if flat.numel() > 1 else (
            torch.zeros(()), flat.float().mean())
        return {"kind": "float", "mean": float(mean), "std": float(std.nan_to_num(0.0))}
    return {"kind": "int", "low": int(flat.min()), "high": int(flat.max())}


def yielding(body: str) -> str:
    """``body`` (torch's repro, which pins the program's TORCH*, TRITON* and INDUCTOR*
    variables, its Inductor cache directory among them) with the pins of what a
    bisection's step sets itself (its own kernel cache, a knob's variable:
    ``steps.STEP_VARIABLES``) made defaults, which yield to a value already set."""
    names = "|".join(sorted(steps.STEP_VARIABLES))
    return re.sub(rf"^os\.environ\[(['\"])({names})\1\] = (.+)$",
                  r"os.environ.setdefault('\2', \3)", body, flags=re.MULTILINE)


def _fill(where: str, gm: Any, inputs: List[Any], entry: Dict[str, Any]) -> None:
    from torch._dynamo.repro.after_aot import generate_compiler_repro_string

    size = sum(x.untyped_storage().nbytes() for x in inputs if isinstance(x, torch.Tensor))
    save = size <= SAVE_BYTES
    options: Dict[str, Any] = {"save_dir": os.path.join(where, "inputs") if save else None}
    if "stable_hash" in inspect.signature(generate_compiler_repro_string).parameters:
        # Hash the saved inputs in Python: the default hashes them with a kernel that
        # torch.compile builds, a compile the program's report would count as its own.
        options["stable_hash"] = True
    body = generate_compiler_repro_string(gm, inputs, **options)
    body = yielding(body)
    note = ("" if save else
            f"# Inputs of {size / 2**20:.0f} MiB were not saved (over "
            f"{SAVE_BYTES // 2**20} MiB): they are drawn again with their shapes, dtypes "
            "and strides after torch.manual_seed(0), at each one's mean and standard "
            "deviation (integers: within their range; inputs.json), so a bug that depends "
            "on their exact values may not reproduce.\n")
    if not save:
        with open(os.path.join(where, "inputs.json"), "w") as fh:
            json.dump([_scale(x) for x in inputs], fh)
    header = (f'"""Repro of graph {entry.get("graph")} of {entry.get("where")}, found '
              "wrong by rocm-autopatch's numerics sentinel: python repro.py exits 1 when "
              'it reproduces (needs torch only). env.json: the environment."""\n')
    with open(os.path.join(where, "repro.py"), "w") as fh:
        mismatch = entry.get("mismatch") or {}
        fh.write(header + note + body + runner(
            mismatch.get("index") if mismatch.get("what") == "output" else None))
    device = next((x.device.type for x in inputs if isinstance(x, torch.Tensor)), None)
    with open(os.path.join(where, "env.json"), "w") as fh:
        json.dump({**_environment(entry), "device": device}, fh, indent=1, default=str)
