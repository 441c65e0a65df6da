"""What `perf` is worth against `safe`, in interleaved rounds (issue 45).

    python benchmarks/perf_rounds.py [--rounds 5] [--start 1] [--iters 20] [--tokens 64]
                                     [--steps 10] [--caches DIR] [--arms safe,perf]
                                     [--json PATH]

Each round runs `safe`, then `perf`, each in a process of its own (ROCm behaviour forced),
on transformers' Llama at TinyLlama's 1.1B configuration (22 layers, random weights, bf16;
``common.LLAMA_1B``), and measures in that process:

- prefill: a 1 x 512 forward, ``torch.compile(model)``, under ``no_grad``: the median of
  ``--iters`` calls after 5 warm-ups (CUDA events);
- decode: greedy ``generate`` of ``--tokens`` new tokens after a 16-token prompt, static KV
  cache, ``model.forward`` compiled once: tokens/s over three ``generate`` calls after one;
- a training step: forward, cross-entropy loss, backward and AdamW on a 1 x 512 batch,
  ``torch.compile(model)`` in train mode: the median of ``--steps`` steps after 3.

Where TunableOp is on (`perf` with a cache directory), prefill and decode are measured again
with it switched off in the same process (``torch.cuda.tunable.enable(False)``): what it is
worth on this GPU. Each arm keeps its compile caches across rounds in its own
``ROCM_AUTOPATCH_CACHE`` (``--caches``, default a temporary directory): the first round
compiles cold, the later ones start warm, as a user with the cache does; coordinate
descent's benchmarks counted per round say whether a warm start reused its picks.
``--start`` numbers the rounds of a run that goes on from an earlier one (the same
``--caches``). Prints one JSON line per process, then per round `perf` / `safe`, and the
median and spread of each arm over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Any, Dict, List

from common import LLAMA_1B, TOKENS_PER_S, meta, run_arm

CHILD = LLAMA_1B + r"""
import json, statistics, sys, time
from torch._dynamo.utils import counters
iters, tokens, steps = (int(a) for a in sys.argv[1:4])
tunable = torch.cuda.tunable
out = {"tunable_enabled": tunable.is_enabled()}

def timed(call, n):
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); call(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return round(statistics.median(times), 3)

def first_call(call):
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return round(time.perf_counter() - start, 2)

def with_and_without_tunableop(name, measure):
    out[name] = measure()
    if tunable.is_enabled():  # the same compiled code, TunableOp switched off
        tunable.enable(False)
        out[name + "_tunableop_off"] = measure()
        tunable.enable(True)

def coordesc():
    return int(counters["inductor"]["coordesc_tuning_bench"])

with torch.no_grad():
    fn = torch.compile(model)
    out["prefill_first_s"] = first_call(lambda: fn(input_ids=ids))
    for _ in range(5):
        fn(input_ids=ids)
    with_and_without_tunableop("prefill_ms", lambda: timed(lambda: fn(input_ids=ids), iters))
out["coordesc_prefill"] = coordesc()

model.generation_config.cache_implementation = "static"
model.generation_config.disable_compile = True  # compiled once, below, as a user would
forward = model.forward
model.forward = torch.compile(forward)
prompt = ids[:, :16]
def generate():
    return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                          do_sample=False, pad_token_id=0)
""" + TOKENS_PER_S + r"""
with torch.no_grad():
    out["decode_first_s"] = first_call(generate)
    with_and_without_tunableop("decode_tokens_per_s", tokens_per_s)
out["coordesc_decode"] = coordesc() - out["coordesc_prefill"]
model.forward = forward

model.train()
train = torch.compile(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
labels = torch.roll(ids, -1, 1)
def step():
    logits = train(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
out["train_first_s"] = first_call(step)
for _ in range(2):
    step()
out["train_step_ms"] = timed(step, steps)
out["coordesc_total"] = coordesc()
out["fx_cache_hit"] = int(counters["inductor"]["fxgraph_cache_hit"])
out["fx_cache_miss"] = int(counters["inductor"]["fxgraph_cache_miss"])
print(json.dumps(out))
"""

MEASURES = ("prefill_ms", "decode_tokens_per_s", "train_step_ms")
LOWER_IS_BETTER = {"prefill_ms": True, "decode_tokens_per_s": False, "train_step_ms": True}


def speedup(measure: str, safe: float, perf: float) -> float:
    """How many times faster `perf` is than `safe` on ``measure`` (above 1: perf wins)."""
    return round(safe / perf if LOWER_IS_BETTER[measure] else perf / safe, 3)


def summary(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per round perf's speedup over safe; per arm the median, min and max of each measure."""
    rounds: Dict[int, Dict[str, Any]] = {}
    for r in results:
        rounds.setdefault(r["round"], {})[r["arm"]] = r
    per_round = []
    for number, arms in sorted(rounds.items()):
        if "error" in arms.get("safe", {"error": 1}) or "error" in arms.get("perf",
                                                                               {"error": 1}):
            continue
        per_round.append({"round": number, **{m: speedup(m, arms["safe"][m], arms["perf"][m])
                                              for m in MEASURES}})
    spread: Dict[str, Any] = {}
    for arm in ("safe", "perf"):
        for m in MEASURES + ("prefill_ms_tunableop_off", "decode_tokens_per_s_tunableop_off"):
            values = [r[m] for r in results if r["arm"] == arm and r.get(m) is not None]
            if values:
                spread[f"{arm}.{m}"] = {"median": round(statistics.median(values), 3),
                                        "min": min(values), "max": max(values),
                                        "rounds": len(values)}
    return {"per_round": per_round, "spread": spread}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--start", type=int, default=1)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--caches", help="where each arm keeps its caches across rounds")
    parser.add_argument("--arms", default="safe,perf", help="which arms, in this order")
    parser.add_argument("--json")
    args = parser.parse_args()
    caches = args.caches or tempfile.mkdtemp(prefix="perf-rounds-")
    results = []
    argv = [str(args.iters), str(args.tokens), str(args.steps)]
    for number in range(args.start, args.start + args.rounds):
        for arm in args.arms.split(","):
            env = {"ROCM_AUTOPATCH_PROFILE": arm,
                   "ROCM_AUTOPATCH_CACHE": os.path.join(caches, arm)}
            got = run_arm(CHILD, argv, env, timeout=900, fresh_cache=False)
            results.append({"round": number, "arm": arm, **got})
            print(json.dumps(results[-1]), flush=True)
    found = summary(results)
    print(json.dumps(found))
    if args.json:
        import torch

        with open(args.json, "w") as fh:
            json.dump({**meta(torch, **{**vars(args), "caches": caches}), "results": results,
                       **found}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
