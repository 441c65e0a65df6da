"""A graph of microseconds with a growing integer input under ``check`` (issue 43: what the
ladder of ``sentinel/scheduling/crossings.py`` costs where one check takes many calls).

    python benchmarks/cheap_graph_ladder.py [--calls 300,3000,30000] [--rounds 2] [--json PATH]

The graph: ``tanh(x @ w) + pos * 1e-3`` on an 8x64 float32 input, ``pos`` a one-element
int64 position advanced by one each call from 16 (a decode loop's ``cache_position``), on
the CPU. Arms, each its own process with an empty Inductor cache and an empty store of
remembered rungs, ROCm behaviour forced: ``off`` (ROCM_AUTOPATCH_VERIFY unset) and
``check`` (the default budget). Per arm and number of calls, after three warm calls: the
loop's wall time, and under ``check`` the sentinel's own account of its share
(``budget_spent``: checks, reads and wrapper) and its checks by cause. Prints one line per
run and the wall-time ratio check/off (medians over ``--rounds``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from common import meta, run_arm, save

CHILD = r"""
import json, sys, time, torch
calls = int(sys.argv[1])
torch.manual_seed(0)
w = torch.randn(64, 64)
step = torch.compile(lambda x, pos: torch.tanh(x @ w) + pos.to(x.dtype) * 1e-3)
x, pos = torch.randn(8, 64), torch.zeros(1, dtype=torch.int64)
for _ in range(3):
    step(x, pos)
began = time.perf_counter()
for n in range(calls):
    pos.fill_(16 + n)
    x = step(x, pos)
out = {"calls": calls, "wall_s": time.perf_counter() - began}
import rocm_autopatch
graphs = rocm_autopatch.report().verify.get("graphs", [])
if graphs:
    g = graphs[0]
    out.update(budget_spent=g["budget_spent"], because=g["checked_because"],
               largest_checked=g["values"]["largest_checked"])
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="300,3000,30000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    runs, summary = [], {}
    for calls in [int(c) for c in args.calls.split(",")]:
        walls = {"off": [], "check": []}
        for _ in range(args.rounds):
            for arm, env in (("off", {}), ("check", {"ROCM_AUTOPATCH_VERIFY": "check"})):
                result = run_arm(CHILD, [str(calls)], {**env, "ROCM_AUTOPATCH_LOG": "error"},
                                 600)
                result["arm"] = arm
                runs.append(result)
                print(json.dumps(result), flush=True)
                if "wall_s" in result:
                    walls[arm].append(result["wall_s"])
        if walls["off"] and walls["check"]:
            ratio = statistics.median(walls["check"]) / statistics.median(walls["off"])
            summary[calls] = round(ratio, 3)
            print(f"{calls} calls: check/off wall time {ratio:.2f}x", flush=True)
    import torch

    save(args.json, meta(torch, check_over_off=summary), runs)


if __name__ == "__main__":
    sys.exit(main())
