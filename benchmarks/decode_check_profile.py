"""Where a check of a decode step's graph spends its time (issue 32), on the GPU: the decode
loop of ``decode_loop.py`` (8-layer Llama, static KV cache, bf16), then one generation in
which every 32nd decode call is checked, each step of each check timed between two device
synchronisations (so the steps add up, and the total is above what an unsynchronised check
costs the program). Also the sentinel's own ledger of the first generations, by kind: the
checks the positions forced, the sampled ones, the magnitude reads and the crossings' reads.

    python benchmarks/decode_check_profile.py [--layers 8] [--checks 16] [--json PATH]
                                              [--alternate-no-grad] [--op-by-op]

``--op-by-op``: the references are never replayed as a captured device graph (``replay``):
they run op by op, as before issue 43, for the before/after on one machine.

``--alternate-no-grad``: every other check runs its eager and float64 references under
``no_grad`` instead of inference mode (the graph's ``inference_mode`` switched off for it),
so the two are compared on the same machine, interleaved.
"""

from __future__ import annotations

import argparse
import json
import sys

from common import DECODE_LLAMA, meta, run_arm

CHILD = r"""
import json, sys, time, torch, transformers as t
layers, checks, alternate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
op_by_op = sys.argv[4] == "1"
""" + DECODE_LLAMA + r"""
import rocm_autopatch
from rocm_autopatch.sentinel import check, compare, pending, regions
# every check judged at the call, each step between two synchronisations (a deferred check
# has no steps on the program's path to time apart: decode_loop.py measures it)
pending.launch = lambda check_: False
from rocm_autopatch.sentinel.judging import judge
from rocm_autopatch.sentinel.scheduling import magnitudes, schedule
from rocm_autopatch.sentinel.runs import replay, snapshot
if op_by_op:  # the references as before issue 43: never captured
    replay.Replays.replayed = lambda self, *a, **k: None
phases, ledger, state = {}, {}, {"sync": False, "force": 0, "n": 0}
def clocked(label, fn, *a, **k):
    # fn(*a, **k), timed between two synchronisations in the profiled generation
    if not state["sync"]:
        return fn(*a, **k)
    torch.cuda.synchronize()
    began = time.perf_counter()
    try:
        return fn(*a, **k)
    finally:
        torch.cuda.synchronize()
        phases.setdefault(label, []).append((time.perf_counter() - began) * 1e3)
def timed(owner, name, label):
    fn = getattr(owner, name)
    setattr(owner, name, lambda *a, **k: clocked(label, fn, *a, **k))
for step in ("not_copied", "wrote_unforeseen", "too_large", "compare", "verdict"):
    timed(check.Check, step, step)
timed(check, "timed", "whole check")
timed(regions, "written_regions", "written regions")
timed(judge, "compare", "judge")
timed(snapshot.Snapshot, "make", "copies for the references")
timed(magnitudes.Magnitudes, "now", "magnitudes read at once")
runs = getattr(compare, "reference_runs", None)  # (releases before it: not timed apart)
def reference_runs(graph, flat, pre, *shape):
    if alternate and state["sync"]:
        state["n"] += 1
        graph.inference_mode = state["n"] % 2 == 1
    label = "references (inference mode)" if graph.inference_mode else "references (no_grad)"
    out = clocked(label, runs, graph, flat, pre, *shape)
    if state["sync"]:
        how = graph.entry["references"]
        ledger[how] = ledger.get(how, 0) + 1
    return out
if runs is not None:
    compare.reference_runs = reference_runs
S = schedule.Schedule
costs, crossed, checked = S._costs, schedule.crossed, S.checked
def add(key, seconds):
    ledger[key] = ledger.get(key, 0.0) + seconds * 1e3
    ledger[key + " (count)"] = ledger.get(key + " (count)", 0) + 1
def _costs(self, seconds):
    add("magnitude reads, ms", seconds)
    return costs(self, seconds)
def _crossed(plan, n, flat):
    before = schedule.LEDGER.spent
    found = crossed(plan, n, flat)
    add("crossing reads, ms", schedule.LEDGER.spent - before)
    return found
def _checked(self, why, *a, **k):
    before = schedule.LEDGER.spent
    out = checked(self, why, *a, **k)
    add(f"checks ({why}), ms", schedule.LEDGER.spent - before)
    if state["force"]:
        self.period, self.owed = state["force"], 0
    return out
S._costs, S.checked = _costs, _checked
schedule.crossed = _crossed  # a module function: due() calls it by name
plans = set()
due = S.due
def _due(self, flat):
    plans.add(self)
    return due(self, flat)
S.due = _due
with torch.no_grad():
    for _ in range(4):  # warm-up and three generations, as decode_loop.py's share arm
        generate(1024)
    torch.cuda.synchronize()
    share = schedule.LEDGER.spent_share()
    state.update(sync=True, force=32)
    for plan in plans:
        plan.period, plan.owed, plan.quiet = 32, 0, 0  # quiet: no call skips past the period
    generate(32 * checks)
    torch.cuda.synchronize()
def median(v):
    return round(sorted(v)[len(v) // 2], 3)
print(json.dumps({"sentinel_share": share, "ledger": {k: round(v, 2) for k, v in ledger.items()},
                  "phases_ms": {k: {"n": len(v), "median": median(v), "min": round(min(v), 3)}
                                for k, v in phases.items()}}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--checks", type=int, default=16)
    parser.add_argument("--alternate-no-grad", action="store_true")
    parser.add_argument("--op-by-op", action="store_true",
                        help="never replay the references as a device graph (as before)")
    parser.add_argument("--json")
    args = parser.parse_args()
    got = run_arm(CHILD, [str(args.layers), str(args.checks),
                          "1" if args.alternate_no_grad else "0",
                          "1" if args.op_by_op else "0"],
                  {"ROCM_AUTOPATCH_VERIFY": "check"}, timeout=900)
    print(json.dumps(got, indent=1))
    for label, p in got.get("phases_ms", {}).items():
        print(f"{label:32s} n={p['n']:3d} median {p['median']:8.3f} ms  min {p['min']:8.3f} ms")
    if args.json:
        import torch

        with open(args.json, "w") as fh:
            json.dump({**meta(torch, layers=args.layers), **got}, fh, indent=1)
    return 0 if "error" not in got else 1


if __name__ == "__main__":
    sys.exit(main())
