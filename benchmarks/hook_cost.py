"""What the hooks cost when a program imports torch's compiler modules.

    python benchmarks/hook_cost.py [--runs 10]

Needs rocm-autopatch installed in this Python. Two measures, each in fresh processes:
- the time spent inside our hooks (``rocm_autopatch.startup.post_import.timings``: our modules'
  imports, the config writes and read-backs, the guard), under ROCM_AUTOPATCH=force,
  while the program runs ``import torch, torch._dynamo, torch._inductor.config``;
- the wall time of that import line, force vs ROCM_AUTOPATCH=0, paired and alternated.
Target: hooks under 5 ms in total. Prints medians, then one JSON line.
The children run in an empty directory (``common.child_cwd``) and must load the package
from site-packages: timed from the checkout, the first version of this script measured
the uncompiled source tree (18.6 ms on CPU where the installed wheel took 8.6 ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from common import child_cwd, child_env

CHILD = """
import json, time
start = time.perf_counter()
import torch, torch._dynamo, torch._inductor.config
wall = time.perf_counter() - start
timings, where = {}, None
try:
    from rocm_autopatch.startup import post_import
    timings, where = dict(post_import.timings), post_import.__file__
except ImportError:
    pass
print(json.dumps({"wall_ms": wall * 1e3, "hooks_ms": {k: v * 1e3 for k, v in timings.items()},
                  "from": where}))
"""


def once(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         env=child_env(ROCM_AUTOPATCH=mode), check=True, cwd=child_cwd())
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if mode != "0" and "site-packages" not in (result["from"] or ""):
        sys.exit(f"rocm-autopatch not loaded from an installed wheel: {result['from']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    forced, off = [], []
    for i in range(args.runs):
        forced.append(once("force"))
        off.append(once("0"))
        print(f"run {i + 1}/{args.runs}: hooks {sum(forced[-1]['hooks_ms'].values()):.2f} ms, "
              f"import {forced[-1]['wall_ms']:.0f} vs {off[-1]['wall_ms']:.0f} ms",
              file=sys.stderr, flush=True)
    per_hook = {k: statistics.median(r["hooks_ms"].get(k, 0.0) for r in forced)
                for k in forced[0]["hooks_ms"]}
    total = statistics.median(sum(r["hooks_ms"].values()) for r in forced)
    wall_force = statistics.median(r["wall_ms"] for r in forced)
    wall_off = statistics.median(r["wall_ms"] for r in off)
    for name, ms in per_hook.items():
        print(f"{name:<45}{ms:>8.2f} ms")
    print(f"{'hooks total (median of runs)':<45}{total:>8.2f} ms  (target < 5 ms)")
    print(f"import torch, torch._dynamo, torch._inductor.config: {wall_force:.0f} ms forced vs "
          f"{wall_off:.0f} ms off, ratio {wall_force / wall_off:.3f}")
    print(json.dumps({"runs": args.runs, "hooks_ms": per_hook, "hooks_total_ms": total,
                      "import_wall_ms": {"force": wall_force, "off": wall_off}}))


if __name__ == "__main__":
    main()
