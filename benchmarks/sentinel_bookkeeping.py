"""The sentinel's per-call bookkeeping alone (issue 25): the schedule's decision for a call
that is not checked, on a graph's inputs, without compiling anything.

    python benchmarks/sentinel_bookkeeping.py [--device cuda|cpu] [--json PATH]

Inputs as a 1.1B Llama's graph gets them under Dynamo (the ids, and 201 parameters, which
are not followed), plus arms with one and four floating data inputs. Per arm: microseconds
per call (mean of 5 x 2,000 calls, synchronised at the end of each round).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from rocm_autopatch.sentinel.scheduling import magnitudes, schedule


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json")
    args = parser.parse_args()
    dev = torch.device(args.device)
    params = [torch.nn.Parameter(torch.empty(2048, device=dev)) for _ in range(201)]
    ids = torch.randint(0, 32000, (1, 1), device=dev)
    hidden = [torch.randn(1, 1, 2048, device=dev, dtype=torch.bfloat16) for _ in range(4)]
    arms = {"parameters only": params, "ids": [ids, *params],
            "ids + 1 hidden state": [ids, hidden[0], *params],
            "ids + 4 hidden states": [ids, *hidden, *params]}
    out = {}
    for name, flat in arms.items():
        plan = schedule.Schedule(1, 0.01, [])
        plan.magnitudes = magnitudes.Magnitudes(
            magnitudes.watched_inputs(flat, len(flat), frozenset()))
        plan.call_seconds, plan.period = 1.0, 1 << 30
        for _ in range(200):
            plan.due(flat)
        rounds = []
        for _ in range(5):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(2000):
                plan.due(flat)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            rounds.append((time.perf_counter() - start) / 2000 * 1e6)
        out[name] = {"us_per_call": round(sum(rounds) / len(rounds), 2),
                     "rounds": [round(r, 2) for r in rounds],
                     "followed": len(plan.magnitudes.watch)}
        print(f"{name:<24} {out[name]['us_per_call']:>7.2f} us a call "
              f"({out[name]['followed']} inputs followed)", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": str(dev), "torch": torch.__version__, "arms": out}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
