"""``rocm-autopatch selftest``: a bounded run on this machine's GPU that gives evidence of
what rocm-autopatch does here, as a verdict per check and a JSON to attach to an issue.

Each check runs in a child process of its own (its own environment, its own time limit),
with rocm-autopatch applied (``ROCM_AUTOPATCH=force`` where torch is not a ROCm build, and
said so):

- ``compile``: a small reference transformer block compiled under a hostile environment
  (``TORCHINDUCTOR_MAX_AUTOTUNE=1``, ``TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE=1``,
  ``mode="max-autotune"``) with the compile watchdog armed: it must finish, with
  autotuning off as torch reads it back, and equal eager;
- ``capture``: the capture policy: warm up, capture, replay (equal to eager); a new dtype
  first seen inside capture runs eagerly, replays correctly and compiles after;
- ``numerics``: the numerics sentinel on the block (no false alarm), then on a graph with
  a miscompile injected by torch's own fault injection (it must be caught and fallen
  back from).

Without a GPU it runs what a CPU can and says what it could not check. Exit status 0 when
every check that ran passed, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from _rocm_autopatch_start import say
from rocm_autopatch import settings

CHECKS = ("compile", "capture", "numerics")
LIMIT_S = 240  # per check: the whole run stays within a few minutes
HOSTILE = {"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE": "1"}


# ---- in the child process -------------------------------------------------------------------

def reference_block(device: str, dtype: Any) -> Any:
    """A pre-norm transformer block (attention + MLP), d=256, 4 heads."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self, d: int = 256, heads: int = 4) -> None:
            super().__init__()
            self.norm1 = torch.nn.LayerNorm(d)
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.proj = torch.nn.Linear(d, d)
            self.norm2 = torch.nn.LayerNorm(d)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                           torch.nn.Linear(4 * d, d))
            self.heads = heads

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                       for z in (q, k, v))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.norm2(x))

    torch.manual_seed(0)
    return Block().to(device, dtype).eval()


def _setup() -> Any:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return torch, device, dtype


def _diff(a: Any, b: Any) -> float:
    return float((a.double() - b.double()).abs().max())


def check_compile() -> Dict[str, Any]:
    torch, device, dtype = _setup()
    import torch._inductor.config as inductor

    model = reference_block(device, dtype)
    x = torch.randn(4, 64, 256, device=device, dtype=dtype)
    start = time.perf_counter()
    with torch.no_grad():
        got = torch.compile(model, mode="max-autotune")(x)
        want = model(x)
    seconds = time.perf_counter() - start
    tol = 0.05 if dtype != torch.float32 else 1e-4
    ok = not inductor.max_autotune and not inductor.max_autotune_pointwise and \
        _diff(got, want) < tol
    return {"ok": ok, "seconds": round(seconds, 1), "max_abs_diff": _diff(got, want),
            "max_autotune_read_back": inductor.max_autotune,
            "max_autotune_pointwise_read_back": inductor.max_autotune_pointwise}


def check_capture() -> Dict[str, Any]:
    torch, device, _ = _setup()
    if device != "cuda":
        return {"ok": None, "why": "no GPU: graph capture cannot run here"}
    import rocm_autopatch

    model = reference_block(device, torch.float16)
    compiled = torch.compile(model)
    x = torch.randn(4, 64, 256, device=device, dtype=torch.float16)
    out: Dict[str, Any] = {}
    with torch.no_grad():
        for _ in range(3):
            compiled(x)  # warm-up outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = compiled(x)
        graph.replay()
        torch.cuda.synchronize()
        out["warm_up_then_capture"] = _diff(y, model(x))
        model32 = reference_block(device, torch.float32)
        compiled32 = torch.compile(model32)
        x32 = x.float()
        graph2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph2):
            y32 = compiled32(x32)  # first seen inside capture: runs eagerly
        graph2.replay()
        torch.cuda.synchronize()
        out["first_call_in_capture"] = _diff(y32, model32(x32))
        out["after_capture"] = _diff(compiled32(x32), model32(x32))
    eager = rocm_autopatch.report().eager_in_capture
    out["eager_in_capture"] = sum(eager.values())
    out["ok"] = (out["warm_up_then_capture"] < 0.05 and out["first_call_in_capture"] < 1e-3
                 and out["after_capture"] < 1e-3 and out["eager_in_capture"] == 1)
    return out


def check_numerics() -> Dict[str, Any]:
    torch, device, dtype = _setup()
    import rocm_autopatch

    model = reference_block(device, dtype)
    x = torch.randn(4, 64, 256, device=device, dtype=dtype)
    with torch.no_grad():
        torch.compile(model)(x)
    healthy = dict(rocm_autopatch.report().verify["totals"])
    config = torch._inductor.config
    target = config.triton if device == "cuda" else config.cpp
    target.inject_relu_bug_TESTING_ONLY = "accuracy"  # torch's own fault injection
    try:
        relu = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 256)).to(device, dtype)
        with torch.no_grad():
            got = torch.compile(relu)(x)
            want = relu(x)
    finally:
        target.inject_relu_bug_TESTING_ONLY = None
    totals = rocm_autopatch.report().verify["totals"]
    caught = totals["fell back"] - healthy["fell back"]
    return {"ok": healthy["passed"] >= 1 and healthy["fell back"] == 0 and caught == 1
            and _diff(got, want) == 0.0,
            "healthy_block": healthy, "injected_miscompile_fell_back": caught,
            "result_after_fallback_max_abs_diff": _diff(got, want)}


CHILD: Dict[str, Callable[[], Dict[str, Any]]] = {
    "compile": check_compile, "capture": check_capture, "numerics": check_numerics}
CHILD_ENV: Dict[str, Dict[str, str]] = {
    "compile": {**HOSTILE, "ROCM_AUTOPATCH_COMPILE_WATCHDOG": "60"},
    "capture": {},
    "numerics": {"ROCM_AUTOPATCH_VERIFY": "fallback"},
}


def child(name: str) -> None:
    """Run one check in this process; its last stdout line is JSON."""
    import rocm_autopatch

    try:
        result = CHILD[name]()
    except Exception as exc:  # noqa: BLE001 - a failed check is a verdict, not a crash
        result = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    report = rocm_autopatch.report()
    result["warnings"] = list(report.warnings)
    result["errors"] = list(report.errors)
    print(json.dumps(result, default=repr))


# ---- in the command's process ------------------------------------------------------------

def _machine() -> Dict[str, Any]:
    code = ("import json, torch; d = torch.cuda.is_available(); "
            "p = torch.cuda.get_device_properties(0) if d else None; "
            "print(json.dumps({'torch': torch.__version__, 'hip': torch.version.hip, "
            "'cuda': torch.version.cuda, 'gpu': p.name if p else None, "
            "'arch': getattr(p, 'gcnArchName', None) if p else None}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=LIMIT_S, env=_env({}))
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        found = {"error": proc.stderr.strip()[-500:]}
    return {"python": platform.python_version(), "platform": platform.platform(), **found}


def machine_line(m: Dict[str, Any]) -> str:
    """"  torch 2.11.0 (CUDA 12.8); GPU: NVIDIA H100 80GB HBM3", with the architecture in
    parentheses where it says more than the name (gfx942). On CUDA builds torch fills
    ``gcnArchName`` with the device's name: it is said once."""
    build = (f"HIP {m['hip']}" if m.get("hip") else f"CUDA {m['cuda']}" if m.get("cuda")
             else "CPU")
    arch = m.get("arch") if m.get("arch") and m.get("arch") != m.get("gpu") else ""
    return (f"  torch {m.get('torch')} ({build}); GPU: {m.get('gpu') or 'none'}"
            + (f" ({arch})" if arch else ""))


def _env(extra: Dict[str, str]) -> Dict[str, str]:
    # Applied whatever the build (on ROCm, force is what auto does): the JSON says so.
    return settings.environment(ROCM_AUTOPATCH="force", **extra)


def run_check(name: str) -> Dict[str, Any]:
    start = time.perf_counter()
    cmd = [sys.executable, "-c", f"from rocm_autopatch.cli.selftest import child; child({name!r})"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT_S,
                              env=_env(CHILD_ENV[name]))
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": f"did not finish in {LIMIT_S} s",
                "seconds": round(time.perf_counter() - start, 1)}
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"ok": False, "error": f"exit {proc.returncode}: "
                                        f"{proc.stderr.strip()[-800:]}"}
    result["seconds_total"] = round(time.perf_counter() - start, 1)
    return result


def _verdict(result: Dict[str, Any]) -> str:
    if result.get("ok") is None:
        return "not checked"
    return "pass" if result["ok"] else "FAIL"


def main(json_path: Optional[str], checks: List[str]) -> int:
    from rocm_autopatch import __version__

    path = os.path.abspath(json_path or "rocm-autopatch-selftest.json")
    if os.path.isdir(path):  # said before minutes of checks, not after
        say(f"rocm-autopatch selftest: --json {json_path}: that is a directory; give the "
            "path of a file to write (its directory is created if missing)\n")
        return 2
    print("rocm-autopatch selftest: each check in its own process, at most "
          f"{LIMIT_S} s each", flush=True)
    m = _machine()
    document: Dict[str, Any] = {
        "rocm_autopatch": __version__, "machine": m, "checks": {},
        "applied_with": "ROCM_AUTOPATCH=force" + ("" if m.get("hip") else
                                                  " (not a ROCm build: forced, as in tests)")}
    print(machine_line(m), flush=True)
    for name in checks:
        result = run_check(name)
        document["checks"][name] = result
        why = result.get("why") or result.get("error") or ""
        print(f"  {name:<10}{_verdict(result):<13}{result.get('seconds_total', 0):>6.1f} s"
              + (f"  {why}" if why else ""), flush=True)
    ran = [r for r in document["checks"].values() if r.get("ok") is not None]
    document["passed"] = bool(ran) and all(r["ok"] for r in ran)
    text = json.dumps(document, indent=1, default=repr)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text + "\n")
    except OSError as exc:  # the results are not lost: they go to stdout instead
        say(f"rocm-autopatch selftest: cannot write {path}: {exc.strerror or exc}; the "
            "results follow on stdout\n")
        print(text)
        path = "stdout"
    print(f"{'passed' if document['passed'] else 'FAILED'}; details: {path} (attach it to an "
          "issue, with `rocm-autopatch doctor --json`)")
    return 0 if document["passed"] else 1
