"""The numerics sentinel's cost per call once its checks are done, where it is largest: a
graph so small that a call is all Python overhead.

    python benchmarks/verify_overhead.py [--rounds 10] [--calls 20000] [--json out.json]

A compiled ``x + 1`` on a one-element CPU tensor, called --calls times after its checked
call and 200 warm-ups. Arms alternate in fresh processes, --rounds times each:
  compiled - ROCM_AUTOPATCH=force, ROCM_AUTOPATCH_VERIFY unset
  check    - ROCM_AUTOPATCH=force ROCM_AUTOPATCH_VERIFY=check (the checked call excluded)
Prints the median microseconds per call of each arm and their difference, and, inside each
``check`` process, the same compiled graph called through the sentinel's wrapper and
directly (interleaved loops: no process-to-process variance). That difference is what a
checked graph costs each later call; on a GPU the same Python runs and the kernels are
unchanged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from common import child_cwd, child_env, save

CHILD = r"""
import json, statistics, sys, time, torch
import torch._inductor.compile_fx as cfx
calls = int(sys.argv[1])
made = []
behind = cfx.compile_fx  # the sentinel's wrapper under check, torch's own otherwise
cfx.compile_fx = lambda *a, **k: made.append(behind(*a, **k)) or made[-1]
f = torch.compile(lambda x: x + 1)
x = torch.ones(1)
for _ in range(200):
    f(x)
def per_call(fn, n):
    start = time.perf_counter()
    for _ in range(n):
        fn(x)
    return (time.perf_counter() - start) / n * 1e6
through_dynamo = per_call(f, calls)
# In this process: the compiled graph called through the sentinel's wrapper and directly.
outer = made[0]
inner = getattr(outer, "__wrapped__", outer)
pairs = [(per_call(inner, calls), per_call(outer, calls)) for _ in range(5)]
import rocm_autopatch
print(json.dumps({"us_per_call": through_dynamo,
                  "direct_us": statistics.median(p[0] for p in pairs),
                  "wrapped_us": statistics.median(p[1] for p in pairs),
                  "verify": (rocm_autopatch.report().verify or {}).get("totals")}))
"""

ARMS = {"compiled": {}, "check": {"ROCM_AUTOPATCH_VERIFY": "check", "ROCM_AUTOPATCH_RUNGS": "off"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--json")
    args = parser.parse_args()
    runs = {arm: [] for arm in ARMS}
    for _ in range(args.rounds):
        for arm, extra in ARMS.items():
            proc = subprocess.run([sys.executable, "-c", CHILD, str(args.calls)],
                                  capture_output=True, text=True, cwd=child_cwd(),
                                  env=child_env(ROCM_AUTOPATCH="force", **extra), check=True)
            runs[arm].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    import torch

    medians = {arm: statistics.median(r["us_per_call"] for r in rs) for arm, rs in runs.items()}
    info = {"machine": "CPU", "torch": torch.__version__, "python": sys.version.split()[0],
            "rounds": args.rounds, "calls": args.calls, "date": time.strftime("%Y-%m-%d")}
    save(args.json, info, [{"arm": arm, "median_us": medians[arm], "runs": rs}
                           for arm, rs in runs.items()])
    for arm, rs in runs.items():
        spread = sorted(r["us_per_call"] for r in rs)
        print(f"{arm:<10} median {medians[arm]:7.2f} us/call  (min {spread[0]:.2f}, "
              f"max {spread[-1]:.2f}); verify {rs[-1]['verify']}")
    diff = medians["check"] - medians["compiled"]
    print(f"across processes, check - compiled: {diff:+.2f} us/call "
          f"({medians['check'] / medians['compiled']:.3f}x)")
    inside = [r["wrapped_us"] - r["direct_us"] for r in runs["check"]]
    print(f"in one process, the graph through the sentinel's wrapper minus called directly: "
          f"median {statistics.median(inside):+.3f} us/call over {len(inside)} processes "
          f"(each the median of 5 interleaved loops of {args.calls} calls)")


if __name__ == "__main__":
    main()
