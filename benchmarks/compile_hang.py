"""Runaway GEMM autotuning: compile time of a model with many distinct GEMM shapes.

    python benchmarks/compile_hang.py [--shapes 32] [--limit 240] [--json out.json]

Needs a GPU and rocm-autopatch installed in this Python. Each arm runs in a fresh
subprocess with its own empty Inductor cache (nothing is reused between arms) and is
killed at --limit seconds, recorded as "did not finish":
  clean              - no TORCHINDUCTOR_* set, package off (ROCM_AUTOPATCH=0)
  autotune           - TORCHINDUCTOR_MAX_AUTOTUNE=1, package off (what many images ship)
  autotune+package   - TORCHINDUCTOR_MAX_AUTOTUNE=1, ROCM_AUTOPATCH=force (safe profile)
  clean+package      - package on, nothing set
  max-autotune       - torch.compile(mode="max-autotune") in code, package off
  max-autotune+safe  - the same call, package on, safe profile (runs as "default")
  max-autotune+perf  - the same call, package on, perf profile (keeps tuning, no graphs)
Targets: autotune+package and max-autotune+safe within 1.1x of clean. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import RUNAWAY_MODEL, child_cwd, child_env, meta, save

CHILD = r"""
import json, sys, time, torch
shapes = int(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
torch.manual_seed(0)
""" + RUNAWAY_MODEL + r"""
x = torch.randn(512, widths[0], device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    ref = model(x)
    compiled = torch.compile(model, mode=mode)
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = compiled(x)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
import torch._inductor.config as ic
report = {}
try:
    import rocm_autopatch
    r = rocm_autopatch.report()
    report = {"active": r.active, "profile": r.profile}
except ImportError:
    pass
print(json.dumps({"compile_s": seconds, "max_abs_diff": (out - ref).abs().max().item(),
                  "gemm_shapes": len(set(zip(widths, widths[1:]))),
                  "max_autotune": ic.max_autotune, "backends": ic.max_autotune_gemm_backends,
                  "package": report}))
"""

ARMS = {
    "clean": {"ROCM_AUTOPATCH": "0"},
    "autotune": {"ROCM_AUTOPATCH": "0", "TORCHINDUCTOR_MAX_AUTOTUNE": "1"},
    "autotune+package": {"ROCM_AUTOPATCH": "force", "TORCHINDUCTOR_MAX_AUTOTUNE": "1"},
    "clean+package": {"ROCM_AUTOPATCH": "force"},
    "max-autotune": {"ROCM_AUTOPATCH": "0"},
    "max-autotune+safe": {"ROCM_AUTOPATCH": "force"},
    "max-autotune+perf": {"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_PROFILE": "perf"},
}
MODE = {name: "max-autotune" for name in ARMS if name.startswith("max-autotune")}


def run_arm(name: str, shapes: int, limit: float) -> dict:
    env = child_env(**ARMS[name])
    with tempfile.TemporaryDirectory() as cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache  # a cold cache for every arm
        env["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD, str(shapes),
                                   MODE.get(name, "")], env=env,
                                  capture_output=True, text=True, timeout=limit, cwd=child_cwd())
        except subprocess.TimeoutExpired:
            return {"arm": name, "status": "did not finish", "wall_s": limit}
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"arm": name, "status": "failed", "wall_s": wall, "error": proc.stderr[-600:]}
    return {"arm": name, "status": "ok", "wall_s": wall,
            **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", type=int, default=32)
    parser.add_argument("--limit", type=float, default=240.0, help="seconds per arm")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    import torch

    results = [run_arm(name, args.shapes, args.limit) for name in args.arms.split(",")]
    clean = next((r for r in results if r["arm"] == "clean" and r["status"] == "ok"), None)
    for r in results:
        if clean and r["status"] == "ok":
            r["vs_clean"] = r["compile_s"] / clean["compile_s"]
    save(args.json, meta(torch, shapes=args.shapes, limit_s=args.limit), results)
    print(f"{'arm':<20}{'status':<16}{'compile s':>10}{'vs clean':>10}{'autotune':>10}"
          f"{'backends':>20}")
    for r in results:
        compile_s = f"{r['compile_s']:.1f}" if "compile_s" in r else f">{r['wall_s']:.0f}"
        ratio = f"{r['vs_clean']:.2f}x" if "vs_clean" in r else "-"
        print(f"{r['arm']:<20}{r['status']:<16}{compile_s:>10}{ratio:>10}"
              f"{str(r.get('max_autotune', '-')):>10}{str(r.get('backends', '-')):>20}")


if __name__ == "__main__":
    main()
