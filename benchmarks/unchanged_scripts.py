"""Runs the unchanged example scripts under ROCM_AUTOPATCH=force and checks them.

    python benchmarks/unchanged_scripts.py [--json out.json]

Each script in examples/ runs as users run it (the driver only reads its output and, by
running it through runpy in the same process, ``rocm_autopatch.report()`` afterwards).
torchrun's ranks are checked from their own output and log lines. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import child_cwd, child_env

ROOT = Path(__file__).resolve().parent.parent
REPORTED = (
    "import json, runpy, sys; sys.argv = [sys.argv[1]]; "
    "runpy.run_path(sys.argv[0], run_name='__main__'); import rocm_autopatch; "
    "r = rocm_autopatch.report(); "
    "print('REPORT ' + json.dumps({'active': r.active, 'rewrites': [[w.before, w.after, w.count] "
    "for w in r.compile_rewrites], 'fixes': {k: v['status'] for k, v in r.fixes.items()}}))"
)


def run_reported(script: str) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", REPORTED, str(ROOT / script)],
                          capture_output=True, text=True,
                          env=child_env(ROCM_AUTOPATCH="force"), timeout=900, cwd=child_cwd())
    lines = proc.stdout.splitlines()
    report = next((json.loads(line[7:]) for line in lines if line.startswith("REPORT ")), None)
    return {"script": script, "rc": proc.returncode, "wall_s": time.perf_counter() - start,
            "equal": any(line.endswith(("same tokens: True", "equal to eager: True"))
                         for line in lines),
            "output": [line for line in lines if not line.startswith("REPORT ")][-3:],
            "report": report, "stderr": proc.stderr[-1500:] if proc.returncode else ""}


def run_torchrun(nproc: int) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run",
                           f"--nproc-per-node={nproc}", str(ROOT / "examples/torchrun_compile.py")],
                          capture_output=True, text=True, timeout=900, cwd=child_cwd(),
                          env=child_env(ROCM_AUTOPATCH="force", ROCM_AUTOPATCH_LOG="info"))
    lines = proc.stdout.splitlines()
    return {"script": f"examples/torchrun_compile.py (torchrun x{nproc})", "rc": proc.returncode,
            "wall_s": time.perf_counter() - start,
            "equal": any(line.endswith("equal to eager: True") for line in lines),
            "output": lines[-2:],
            "rewrite_warnings": proc.stderr.count("reduce-overhead"),
            "summary_lines": proc.stderr.count("config, safe profile"),
            "stderr": proc.stderr[-1500:] if proc.returncode else ""}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    results = [run_reported("examples/hf_generate.py"),
               run_reported("examples/manual_cuda_graph.py"),
               run_torchrun(min(2, torch.cuda.device_count()))]
    meta = {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "results": results}, fh, indent=2)
    print(json.dumps(meta))
    for r in results:
        print(json.dumps(r))
    print(f"{'script':<48}{'rc':>4}{'equal':>7}{'wall s':>8}")
    for r in results:
        print(f"{r['script']:<48}{r['rc']:>4}{str(r['equal']):>7}{r['wall_s']:>8.1f}")


if __name__ == "__main__":
    main()
