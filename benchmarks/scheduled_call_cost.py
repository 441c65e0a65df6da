"""What the sentinel costs each call of a graph it is still scheduling (issue 43, item 4):
a decode-like step whose position input grows, called through the sentinel's ``check.call``
under ``check``, against the same graph called directly; with the calls that have nothing
due skipping the schedule (``sentinel/scheduling/quiet.py``) and without (every call runs
it, as before).

    python benchmarks/scheduled_call_cost.py [--calls 20000] [--device cpu|cuda] [--json PATH]

In one process (the installed package, ROCM_AUTOPATCH=force): Dynamo's graph of
``x * 2 + pos`` (x: 4 floats), warmed up for 300 calls; then the three arms interleaved,
each timed in blocks of 100 calls, ``--calls`` calls an arm per round, 5 rounds, the
position growing throughout (so the ladder still forces a check now and then: blocks with
one are slow, and the median block leaves them out). The graph's budget is 0 (its first
call and its values' checks only: no sampled check every period, which would land in many
blocks). Prints each arm's median us per call and the wrapper's cost over the direct
call.
"""

from __future__ import annotations

import argparse
import json

from common import meta, run_arm, save

CHILD = r"""
import json, statistics, sys, time, torch
calls, device = int(sys.argv[1]), sys.argv[2]
from rocm_autopatch.sentinel import check
from rocm_autopatch.sentinel.runs.graph import Graph
from rocm_autopatch.sentinel.scheduling import quiet
found = []
def keep(gm, example):
    found.append(gm)
    return gm.forward
def step(x, pos):
    return x * 2 + pos
x = torch.ones(4, device=device)
torch.compile(step, backend=keep, fullgraph=True)(x, torch.tensor([16], device=device))
gm = found[0]
graph = Graph(gm, gm, "0/0", "bench", "check", 1, 0.0)  # no sampled checks: see above
until = quiet.until
position = [16]
def direct():
    position[0] += 1
    return gm(x, torch.tensor([position[0]], device=device))
def through():
    position[0] += 1
    return check.call(graph, (x, torch.tensor([position[0]], device=device)), {})
def blocks(run, n):
    found = []
    for _ in range(n // 100):
        began = time.perf_counter()
        for _ in range(100):
            run()
        found.append((time.perf_counter() - began) / 100 * 1e6)
    return statistics.median(found)
with torch.no_grad():
    for _ in range(300):
        through()
    arms = {"direct": [], "skipping": [], "every_call": []}
    for _ in range(5):
        quiet.until = until
        arms["direct"].append(blocks(direct, calls))
        arms["skipping"].append(blocks(through, calls))
        quiet.until = lambda plan, n, *rest: n + 1  # every call runs the schedule
        arms["every_call"].append(blocks(through, calls))
    quiet.until = until
print(json.dumps({"us_per_call": {k: round(statistics.median(v), 3) for k, v in arms.items()},
                  "calls": graph.schedule.calls, "checks": graph.entry["calls_checked"],
                  "status": graph.entry["status"]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json")
    args = parser.parse_args()
    got = run_arm(CHILD, [str(args.calls), args.device], {"ROCM_AUTOPATCH_VERIFY": "check"},
                  timeout=1800)
    import torch

    save(args.json, meta(torch, calls=args.calls), [got])
    per = got.get("us_per_call")
    if not per:
        print(json.dumps(got)[:2000])
        return 1
    for arm in ("skipping", "every_call"):
        print(f"{arm:<11} {per[arm]:8.2f} us/call, the wrapper {per[arm] - per['direct']:+.2f} "
              f"over the direct call ({per['direct']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
