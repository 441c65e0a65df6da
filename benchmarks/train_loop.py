"""The sentinel in a Llama training loop (issue 43, item 4: "a Llama training loop at most
1%").

    python benchmarks/train_loop.py [--arms off,check] [--rounds 2] [--layers 8]
                                    [--steps 200] [--batch 1] [--seq 512]
                                    [--rungs shared] [--json PATH]

transformers' Llama at TinyLlama's widths (width 2048, 32 heads, 4 KV heads, MLP 5632,
vocabulary 32000) with ``--layers`` layers (22: TinyLlama's 1.1B), random weights, float32
master weights under bf16 autocast, ``torch.compile(model)`` as a user would, AdamW; each
step is a forward, a cross-entropy loss on the next token, a backward and the optimizer's
step. Arms, ``--rounds`` rounds interleaved, each its own process with its own empty
Inductor cache, ROCm behaviour forced: ``off`` (ROCM_AUTOPATCH_VERIFY unset) and ``check``
(the default budget). Per process: 3 warm-up steps (the compile, and under ``check`` the
first calls' checks, which the budget leaves out), then ``--steps`` timed steps.
Reported: steps/s, the median step (CUDA events), and under ``check`` the sentinel's own
measure of its share of the wall time since the first warm call (checks, reads, the
wrapper at every call: ``schedule.LEDGER``), with each graph's checks and verdicts.
``--rungs shared``: the processes share one store of remembered rungs and one Inductor
cache, so that each check process after the first reads the check's cost the one before
kept, as a user's next run of the same script on one machine does.
On a machine without a GPU it runs on the CPU (a smoke run; ``--layers 1 --seq 32``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from common import RUNGS_HELP, meta, run_arm, rungs_store, save

CHILD = r"""
import json, os, statistics, sys, time, torch, transformers as t
layers, steps, batch, seq = (int(v) for v in sys.argv[1:5])
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
small = device == "cpu"  # a smoke run: the same code, narrow
cfg = t.LlamaConfig(vocab_size=1024 if small else 32000, hidden_size=128 if small else 2048,
                    intermediate_size=256 if small else 5632, num_hidden_layers=layers,
                    num_attention_heads=4 if small else 32, num_key_value_heads=2 if small else 4)
with torch.device(device):
    model = t.LlamaForCausalLM(cfg).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
compiled = torch.compile(model)
ids = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)
def step():
    with torch.autocast(device, torch.bfloat16):
        logits = compiled(ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
watched = os.environ.get("ROCM_AUTOPATCH_VERIFY")
costs = []  # each check's cost to the program beyond its call (ms), and why it was made
if watched:
    import rocm_autopatch
    from rocm_autopatch.sentinel.scheduling import schedule
    checked = schedule.Schedule.checked
    def counted(self, why, flat, values, passed, call_seconds, check_seconds, outputs):
        costs.append([self.calls, why, round((check_seconds - call_seconds) * 1e3, 2)])
        return checked(self, why, flat, values, passed, call_seconds, check_seconds, outputs)
    schedule.Schedule.checked = counted
for _ in range(3):
    step()
sync()
if watched:
    before = schedule.LEDGER.spent + schedule.LEDGER.wrapper
times, losses = [], []
start = time.perf_counter()
for _ in range(steps):
    if device == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
    else:
        began = time.perf_counter()
    losses.append(step())
    if device == "cuda":
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    else:
        times.append((time.perf_counter() - began) * 1e3)
sync()
seconds = time.perf_counter() - start
out = {"steps_per_s": round(steps / seconds, 3), "median_step_ms": round(
       statistics.median(times), 3), "last_loss": round(float(losses[-1]), 4)}
if watched:
    out["checks_ms"] = costs
    out["ledger_spent_s"] = round(schedule.LEDGER.spent, 4)
    out["ledger_wrapper_s"] = round(schedule.LEDGER.wrapper, 4)
    # the ledger's share since the first warm call (warm-up steps included), and its
    # seconds over the timed steps alone
    out["sentinel_share"] = schedule.LEDGER.spent_share()
    out["sentinel_share_of_timed_steps"] = round(
        (schedule.LEDGER.spent + schedule.LEDGER.wrapper - before) / seconds, 5)
    keep = ("graph", "status", "calls", "calls_checked", "checked_because", "period",
            "values_stride", "reason", "references", "rungs")
    out["graphs"] = [{k: g.get(k) for k in keep}
                     for g in rocm_autopatch.report().verify.get("graphs", [])]
print(json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arms", default="off,check")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rungs", default="", help=RUNGS_HELP)
    parser.add_argument("--json")
    args = parser.parse_args()
    verify = {"off": "", "check": "check"}
    rungs = rungs_store(args.rungs)
    results = []
    for r in range(args.rounds):
        for arm in args.arms.split(","):
            got = run_arm(CHILD, [str(v) for v in (args.layers, args.steps, args.batch,
                                                   args.seq)],
                          {"ROCM_AUTOPATCH_VERIFY": verify[arm], **rungs}, timeout=900)
            results.append({"arm": arm, "round": r, **got})
            print(json.dumps(results[-1]), flush=True)
    for arm in args.arms.split(","):
        rates = [x["steps_per_s"] for x in results if x["arm"] == arm and "steps_per_s" in x]
        if rates:
            print(f"{arm}: steps/s {rates} (median {statistics.median(rates)})")
    import torch

    save(args.json, meta(torch, layers=args.layers, steps=args.steps, batch=args.batch,
                         seq=args.seq, rungs=args.rungs or "each its own",
                         python=sys.version.split()[0]), results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
