"""What following a graph for the whole run costs (issue 25): the sentinel's per-call
bookkeeping (shape signature, the queued magnitude reduction) and its sampled checks.

    python benchmarks/sentinel_sampling.py [--device cuda|cpu] [--calls 1000] [--json PATH]

Arms, each its own process with its own empty Inductor cache, ROCm behaviour forced:
``off`` (ROCM_AUTOPATCH_VERIFY unset); ``first`` (check with
ROCM_AUTOPATCH_VERIFY_BUDGET=0: the first call only, as before issue 25); ``check`` (the
default budget). GPU: transformers' Llama with a 1.1B configuration (TinyLlama's), random
weights, bf16, inference; two graphs: prefill (1 x 512 tokens) and a 1-token forward
standing in for decode (no KV cache: a cheap graph). CPU: the same model at 2 layers and
width 256. Per graph and arm, after the first call: the total time of ``--calls`` calls
(synchronised at the end: checks included), the median call (CUDA events: the steady
state, bookkeeping only), the checks run, their period and what they took.
"""

from __future__ import annotations

import argparse
import json
import sys

from common import run_arm

CHILD = r"""
import json, statistics, sys, time, torch, transformers as t
device, calls = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
if device == "cuda":
    cfg = t.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                        num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4)
    dtype, prefill = torch.bfloat16, 512
else:
    cfg = t.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    dtype, prefill = torch.float32, 64
with torch.device(device):
    model = t.LlamaForCausalLM(cfg).to(dtype).eval()

def sync():
    if device == "cuda":
        torch.cuda.synchronize()

out = {}
for name, length in (("prefill", prefill), ("decode", 1)):
    torch._dynamo.reset()
    f = torch.compile(lambda ids: model(input_ids=ids).logits)
    ids = torch.randint(0, cfg.vocab_size, (1, length), device=device)
    import rocm_autopatch
    with torch.no_grad():
        f(ids); sync()
        graphs = rocm_autopatch.report().verify.get("graphs", [])
        before = graphs[-1]["seconds"] if graphs else 0.0  # the first call's check
        per = []
        sync(); start = time.perf_counter()
        for _ in range(calls):
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); f(ids); b.record()
                per.append((a, b))
            else:
                s = time.perf_counter(); f(ids); per.append(time.perf_counter() - s)
        sync(); total = time.perf_counter() - start
    ms = [a.elapsed_time(b) for a, b in per] if device == "cuda" else [p * 1e3 for p in per]
    graphs = rocm_autopatch.report().verify.get("graphs", [])
    g = graphs[-1] if graphs else {}
    out[name] = {"total_s": round(total, 4), "median_ms": round(statistics.median(ms), 4),
                 "calls": calls, "checks": g.get("calls_checked"),
                 "checked_because": g.get("checked_because"), "period": g.get("period"),
                 "check_seconds": g.get("seconds"), "status": g.get("status")}
    if g:
        # In this process: the share of the run the checks took (their own clock), and the
        # bookkeeping of one unchecked call (the schedule's decision and the queued
        # magnitude reduction, on this graph's inputs: the ids and the parameters).
        from rocm_autopatch.sentinel.scheduling import schedule as sch
        flat = [ids] + list(model.parameters())
        plan = sch.Schedule(1, 0.01, [])
        plan.magnitudes = sch.Magnitudes(sch.watched_inputs(flat, len(flat), frozenset()))
        plan.call_seconds, plan.period = 1.0, 1 << 30
        for _ in range(50):
            plan.due(flat)
        sync(); s0 = time.perf_counter()
        for _ in range(1000):
            plan.due(flat)
        sync()
        out[name]["bookkeeping_us"] = round((time.perf_counter() - s0) * 1e3, 2)
        out[name]["check_share"] = round(((g.get("seconds") or 0) - before) / total, 4)
print(json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--json")
    args = parser.parse_args()
    arms = {"off": {"ROCM_AUTOPATCH_VERIFY": ""},
            "first": {"ROCM_AUTOPATCH_VERIFY": "check", "ROCM_AUTOPATCH_VERIFY_BUDGET": "0"},
            "check": {"ROCM_AUTOPATCH_VERIFY": "check"}}
    results = {}
    for arm, extra in arms.items():
        results[arm] = run_arm(CHILD, [args.device, str(args.calls)], extra, timeout=1200)
        print(arm, json.dumps(results[arm]), flush=True)
    summary = {}
    if all("error" not in r for r in results.values()):
        for graph in ("prefill", "decode"):
            off = results["off"][graph]
            line = {}
            for arm in ("first", "check"):
                r = results[arm][graph]
                line[arm] = {"total_ratio": round(r["total_s"] / off["total_s"], 4),
                             "median_ratio": round(r["median_ms"] / off["median_ms"], 4)}
            summary[graph] = line
            c = results["check"][graph]
            print(f"{graph}: {off['median_ms']} ms a call off; {args.calls} calls: total "
                  f"x{line['check']['total_ratio']} with sampling ({c['checks']} checks, "
                  f"period {c['period']}), x{line['first']['total_ratio']} first call only; "
                  f"median call x{line['check']['median_ratio']} (bookkeeping)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"arms": results, "summary": summary}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
