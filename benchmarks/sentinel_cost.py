"""What the sentinel's judge costs on a 1B-class Llama in bf16 (GPU).

    python benchmarks/sentinel_cost.py [--iters 50] [--json PATH]

Arms, each its own process with its own empty Inductor cache, ROCm behaviour forced:
``off`` (ROCM_AUTOPATCH_VERIFY unset) and ``check``. The model is transformers' Llama with
a 1.1B configuration (TinyLlama's: 22 layers, width 2048, 32 heads, 4 KV heads, MLP 5632,
vocabulary 32000), random weights, bf16, inference, batch 1 x 512 tokens (prefill). Per arm:
the first call (compile, plus the check), the peak GPU memory of the first call above the
model, the steady state (median of --iters calls after 5 warm-ups, CUDA events), and the
sentinel's verdict with both criteria and the errors against float64.
"""

from __future__ import annotations

import argparse
import json
import sys

from common import LLAMA_1B, run_arm

CHILD = LLAMA_1B + r"""
import json, statistics, sys, time
iters = int(sys.argv[1])
torch.cuda.synchronize()
base = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
f = torch.compile(model)
with torch.no_grad():
    start = time.perf_counter()
    out = f(input_ids=ids).logits
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - base
    for _ in range(5):
        f(input_ids=ids)
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(input_ids=ids); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    eager = model(input_ids=ids).logits
agree = float((out.argmax(-1) == eager.argmax(-1)).float().mean())
import rocm_autopatch
v = rocm_autopatch.report().verify
print(json.dumps({"first_call_s": round(first, 2), "peak_gib": round(peak / 2**30, 2),
                  "steady_ms": round(statistics.median(times), 3), "argmax_agree": agree,
                  "graphs": [{k: g.get(k) for k in ("status", "reason", "judge", "seconds")}
                             for g in v.get("graphs", [])]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {}
    for arm in ("off", "check"):
        results[arm] = run_arm(CHILD, [str(args.iters)],
                               {"ROCM_AUTOPATCH_VERIFY": "" if arm == "off" else arm},
                               timeout=900)
        print(arm, json.dumps(results[arm]), flush=True)
    if "error" not in results["off"] and "error" not in results["check"]:
        off, on = results["off"], results["check"]
        print(f"first call: {off['first_call_s']} s -> {on['first_call_s']} s; peak "
              f"{off['peak_gib']} -> {on['peak_gib']} GiB; steady {off['steady_ms']} -> "
              f"{on['steady_ms']} ms ({on['steady_ms'] / off['steady_ms']:.3f}x)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
