"""Steady-state inference speed of a real transformer: eager, compile, safe, perf.

    python benchmarks/steady_state.py [--iters 20] [--json out.json]

A Hugging Face Llama built from a config with random weights (no download), bf16 on the
GPU, a prefill forward of batch x seq tokens under ``torch.no_grad()``. Each arm is its own
subprocess (the package acts per process):
  eager             - no compile, package off
  compile           - torch.compile(model) default, package off (ROCM_AUTOPATCH=0)
  safe              - the same call, ROCM_AUTOPATCH=force (safe profile)
  perf              - ROCM_AUTOPATCH=force ROCM_AUTOPATCH_PROFILE=perf
Latency: CUDA events around each call, median and std over --iters calls after --warmup
calls. Also the first call's time (compile) and the max abs difference from eager logits
computed in the same process with the same weights.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from common import child_cwd, child_env, meta, save

CHILD = r"""
import json, statistics, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
arm, batch, seq, warmup, iters = sys.argv[1], *map(int, sys.argv[2:6])
torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     max_position_embeddings=4096)
with torch.device("cuda"):  # random init on the GPU: seconds, not minutes
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
with torch.no_grad():
    ref = model(input_ids=ids).logits.float()
    fn = model if arm == "eager" else torch.compile(model)
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn(input_ids=ids).logits.float()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    for _ in range(warmup):
        fn(input_ids=ids)
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(input_ids=ids); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
info = {}
try:
    import rocm_autopatch
    r = rocm_autopatch.report()
    info = {"active": r.active, "profile": r.profile if r.active else None,
            "applied": sum(c.status == "applied" for c in r.config)}
except ImportError:
    pass
print(json.dumps({"arm": arm, "median_ms": statistics.median(times),
                  "std_ms": statistics.stdev(times), "first_call_s": first,
                  "max_abs_diff": (out - ref).abs().max().item(),
                  "ref_max_abs": ref.abs().max().item(), "package": info}))
"""

ARMS = {
    "eager": {"ROCM_AUTOPATCH": "0"},
    "compile": {"ROCM_AUTOPATCH": "0"},
    "safe": {"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_PROFILE": "safe"},
    "perf": {"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_PROFILE": "perf"},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--timeout", type=float, default=240, help="seconds per arm")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    import torch

    results = []
    for arm in args.arms.split(","):
        env = child_env(**ARMS[arm])
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD, arm, str(args.batch),
                                   str(args.seq), str(args.warmup), str(args.iters)],
                                  env=env, capture_output=True, text=True, timeout=args.timeout,
                                  cwd=child_cwd())
        except subprocess.TimeoutExpired:
            results.append({"arm": arm, "status": "did not finish"})
            continue
        if proc.returncode != 0:
            results.append({"arm": arm, "status": "failed", "error": proc.stderr[-800:]})
            continue
        results.append({"status": "ok", **json.loads(proc.stdout.strip().splitlines()[-1])})
    base = next((r for r in results if r["arm"] == "compile" and r["status"] == "ok"), None)
    for r in results:
        if base and r["status"] == "ok":
            r["vs_compile"] = r["median_ms"] / base["median_ms"]
    info = meta(torch, model="Llama 16 layers, hidden 2048, GQA 32/8 heads, vocab 32000 "
                "(~1.1B), bf16", batch=args.batch, seq=args.seq, warmup=args.warmup,
                iters=args.iters)
    save(args.json, info, results)
    print(f"{'arm':<9}{'median ms':>10}{'std ms':>8}{'vs compile':>11}{'first call s':>13}"
          f"{'max|diff|':>11}")
    for r in results:
        if r["status"] != "ok":
            print(f"{r['arm']:<9}{r['status']}")
            continue
        print(f"{r['arm']:<9}{r['median_ms']:>10.2f}{r['std_ms']:>8.2f}"
              f"{r['vs_compile']:>10.3f}x{r['first_call_s']:>13.1f}{r['max_abs_diff']:>11.4f}")


if __name__ == "__main__":
    main()
