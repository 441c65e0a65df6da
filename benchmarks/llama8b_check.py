"""The sentinel at 8B (issue 43, item 6): a Llama of Llama-3-8B's shape (32 layers, width
4096, MLP 14336, 32 heads, 8 KV heads, vocabulary 128256; random weights, bf16) on one
GPU, its forward compiled, transformers' static-cache ``generate``: a ``--prompt``-token
prompt and ``--tokens`` new tokens, once to warm up and ``--rounds`` times timed.

    python benchmarks/llama8b_check.py [--arms off,check,check_op_by_op] [--prompt 2048]
                                       [--tokens 256] [--rounds 2] [--rungs shared]
                                       [--json PATH]

Each arm its own process (ROCm behaviour forced, an empty Inductor cache of its own).
Reported per arm: tokens/s of the timed generations (prefill included), torch's own peak
of allocated memory over the whole run, the sentinel's share of the wall time, and each
graph's verdict, checks and how its references ran (or why it was not checked), and each
check's cost to the program beyond its call (``check_costs_ms``: what the ledger counts,
the first of each graph outside the budget). ``check_op_by_op``: the references never
captured as a device graph. ``--rungs shared``: the arms' processes share one store of
remembered rungs (``--arms check,check``: a first process, then one that follows it).
"""

from __future__ import annotations

import argparse
import json
import sys

from common import RUNGS_HELP, meta, run_arm, rungs_store

CHILD = r"""
import json, sys, time, torch, transformers as t
prompt_len, tokens, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if sys.argv[4:] == ["op_by_op"]:  # the references never captured nor replayed
    from rocm_autopatch.sentinel.runs import replay
    replay.Replays.replayed = lambda self, *a, **k: None
from rocm_autopatch.sentinel.scheduling import schedule
costs = []  # each check's cost to the program beyond its call (ms): what the ledger counts
checked = schedule.Schedule.checked
def counted(self, why, flat, values, passed, call_seconds, check_seconds, outputs):
    costs.append((why, round((check_seconds - call_seconds) * 1e3, 2)))
    return checked(self, why, flat, values, passed, call_seconds, check_seconds, outputs)
schedule.Schedule.checked = counted
parts = {"reads": 0.0, "crossing_reads": 0.0, "verdicts_read_later": 0.0}
def spent_by(part, fn):  # what the ledger gains inside fn, by part
    def wrapped(*a, **k):
        before = schedule.LEDGER.spent
        try:
            return fn(*a, **k)
        finally:
            parts[part] += schedule.LEDGER.spent - before
    return wrapped
schedule.Schedule._costs = spent_by("reads", schedule.Schedule._costs)
schedule.crossed = spent_by("crossing_reads", schedule.crossed)  # due() calls it by name
schedule.charge = spent_by("verdicts_read_later", schedule.charge)
torch.manual_seed(0)
cfg = t.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    max_position_embeddings=prompt_len + tokens + 64)
with torch.device("cuda"):
    model = t.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
model.generation_config.cache_implementation = "static"
model.generation_config.disable_compile = True
model.forward = torch.compile(model.forward)
prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), device="cuda")
def generate():
    return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                          do_sample=False, pad_token_id=0)
weights = torch.cuda.memory_allocated()
with torch.no_grad():
    generate()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(rounds):
        generate()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
import rocm_autopatch
v = rocm_autopatch.report().verify or {}
keep = ("graph", "status", "reason", "calls", "calls_checked", "checked_because",
        "checks_skipped", "skipped_reason", "references", "seconds", "period",
        "values_stride", "budget_spent", "checks_read_later")
print(json.dumps({"tokens_per_s": round(rounds * tokens / seconds, 2),
                  "weights_gib": round(weights / 2**30, 2),
                  "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                  "sentinel_share": schedule.LEDGER.spent_share() if v else 0.0,
                  "ledger_spent_s": round(schedule.LEDGER.spent, 4),
                  "ledger_wrapper_s": round(schedule.LEDGER.wrapper, 4),  # in the share too
                  "check_costs_ms": costs,
                  "ledger_parts_s": {k: round(x, 4) for k, x in parts.items()},
                  "graphs": [{k: g.get(k) for k in keep} for g in v.get("graphs", [])]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arms", default="off,check")
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rungs", default="", help=RUNGS_HELP)
    parser.add_argument("--json")
    args = parser.parse_args()
    rungs = rungs_store(args.rungs)
    results = []
    for arm in args.arms.split(","):
        verify = {"off": "", "check_op_by_op": "check"}.get(arm, arm)
        extra = ["op_by_op"] if arm == "check_op_by_op" else []
        got = run_arm(CHILD, [str(args.prompt), str(args.tokens), str(args.rounds), *extra],
                      {"ROCM_AUTOPATCH_VERIFY": verify, "ROCM_AUTOPATCH_VERIFY_DIR": "off",
                       **rungs},
                      timeout=1200)
        results.append({"arm": arm, **got})
        print(json.dumps(results[-1]), flush=True)
    if args.json:
        import torch

        with open(args.json, "w") as fh:
            json.dump({**meta(torch, prompt=args.prompt, tokens=args.tokens,
                              rounds=args.rounds), "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
