"""What the numerics sentinel costs, and what it catches, on a GPU.

    python benchmarks/verify_cost.py [--iters 50] [--json out.json]

Each arm is its own subprocess with its own empty Inductor cache, ROCm behaviour forced:
  compiled   - torch.compile(model), ROCM_AUTOPATCH_VERIFY unset
  check      - the same, ROCM_AUTOPATCH_VERIFY=check
on GPT-2 (transformers, 124M: 12 layers, width 768; batch 8 x 512 tokens) and ViT-B/16
(timm ``vit_base_patch16_224``, batch 64; transformers' ViT-B/16 config where timm is
absent), bf16, inference, random weights. Per arm: the first call (compile, plus the
check under ``check``), the check's own time (``report().verify``), the first call's peak
GPU memory above the model and inputs, against an eager forward's; the steady state (median
of --iters calls after 5 warm-ups, CUDA events); the result against eager.
Then a real miscompile, torch's own fault injection (``triton.inject_relu_bug_TESTING_ONLY
= "accuracy"``), on timm's ResNet-50 (ReLU throughout; a relu MLP where timm is absent):
unpatched, under check and under fallback.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

from common import child_cwd, child_env, meta, save

CHILD = r"""
import json, statistics, sys, time, torch
model_name, arm, warmup, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
def build():
    if model_name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        with torch.device("cuda"):
            m = GPT2LMHeadModel(GPT2Config()).to(torch.bfloat16).eval()
        ids = torch.randint(0, 50257, (8, 512), device="cuda")
        return m, (lambda f: f(input_ids=ids).logits)
    if model_name == "vit_b16":
        try:
            import timm
            m = timm.create_model("vit_base_patch16_224", pretrained=False)
            call = lambda f: f(x)
        except ImportError:
            from transformers import ViTConfig, ViTForImageClassification
            m = ViTForImageClassification(ViTConfig())
            call = lambda f: f(pixel_values=x).logits
        m = m.cuda().to(torch.bfloat16).eval()
        x = torch.randn(64, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
        return m, call
    if model_name == "resnet50":
        try:
            import timm
            m = timm.create_model("resnet50", pretrained=False)
        except ImportError:
            m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                    torch.nn.Linear(4096, 1024))
        m = m.cuda().to(torch.bfloat16).eval()
        shape = (32, 3, 224, 224) if hasattr(m, "fc") else (64, 1024)
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        return m, (lambda f: f(x))
    raise SystemExit(model_name)
model, call = build()
if arm.startswith("bug"):
    torch._inductor.config.triton.inject_relu_bug_TESTING_ONLY = "accuracy"
with torch.no_grad():
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ref = call(model).float()
    torch.cuda.synchronize()
    eager_peak = torch.cuda.max_memory_allocated() - base
    fn = torch.compile(model)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    out = call(fn).float()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    first_peak = torch.cuda.max_memory_allocated() - base
    diffs = [float((out - ref).abs().max())]
    for _ in range(warmup):
        diffs.append(float((call(fn).float() - ref).abs().max()))
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); call(fn); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
import rocm_autopatch
v = rocm_autopatch.report().verify
print(json.dumps({"model": model_name, "arm": arm, "first_call_s": round(first, 2),
                  "check_s": round(sum(g["seconds"] for g in v.get("graphs", [])), 2),
                  "first_call_peak_gib": round(first_peak / 2**30, 3),
                  "eager_peak_gib": round(eager_peak / 2**30, 3),
                  "median_ms": round(statistics.median(times), 3),
                  "std_ms": round(statistics.pstdev(times), 3),
                  "max_abs_diff_first": diffs[0], "max_abs_diff_later": max(diffs[1:]),
                  "verify": v.get("totals"),
                  "statuses": [g["status"] for g in v.get("graphs", [])]}))
"""

ARMS = [("gpt2", "compiled"), ("gpt2", "check"), ("vit_b16", "compiled"), ("vit_b16", "check"),
        ("resnet50", "bug-unpatched"), ("resnet50", "bug-check"), ("resnet50", "bug-fallback")]
VERIFY = {"compiled": None, "check": "check", "bug-unpatched": None, "bug-check": "check",
          "bug-fallback": "fallback"}


def run(model: str, arm: str, warmup: int, iters: int) -> dict:
    env = child_env(ROCM_AUTOPATCH="force", TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(),
                    ROCM_AUTOPATCH_RUNGS="off")
    if VERIFY[arm]:
        env["ROCM_AUTOPATCH_VERIFY"] = VERIFY[arm]
    proc = subprocess.run([sys.executable, "-c", CHILD, model, arm, str(warmup), str(iters)],
                          capture_output=True, text=True, env=env, cwd=child_cwd(),
                          timeout=900)
    if proc.returncode != 0:
        return {"model": model, "arm": arm, "error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--models", default="gpt2,vit_b16,resnet50",
                        help="comma-separated subset of gpt2, vit_b16, resnet50")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the arms this many times, interleaved (steady-state noise)")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = []
    for round_ in range(args.rounds):
        for model, arm in (a for a in ARMS if a[0] in args.models.split(",")):
            results.append({**run(model, arm, args.warmup, args.iters), "round": round_})
            print(json.dumps(results[-1]), flush=True)
    import torch

    save(args.json, meta(torch, iters=args.iters), results)
    print(f"{'model':<10}{'arm':<15}{'first s':>8}{'check s':>8}{'peak GiB':>9}"
          f"{'eager GiB':>10}{'median ms':>10}{'diff first':>11}{'diff later':>11}  verify")
    for r in results:
        if "error" in r:
            print(f"{r['model']:<10}{r['arm']:<15}ERROR {r['error'][-200:]}")
            continue
        print(f"{r['model']:<10}{r['arm']:<15}{r['first_call_s']:>8.1f}{r['check_s']:>8.1f}"
              f"{r['first_call_peak_gib']:>9.2f}{r['eager_peak_gib']:>10.2f}"
              f"{r['median_ms']:>10.2f}{r['max_abs_diff_first']:>11.3g}"
              f"{r['max_abs_diff_later']:>11.3g}  {','.join(r['statuses']) or '-'}")
    by: dict = {}
    for r in results:
        if "error" not in r:
            by.setdefault((r["model"], r["arm"]), []).append(r)
    for model in ("gpt2", "vit_b16"):
        a, b = by.get((model, "compiled")), by.get((model, "check"))
        if a and b:
            ratios = [y["median_ms"] / x["median_ms"] for x, y in zip(a, b)]
            a, b = a[0], b[0]
            print(f"{model}: check/compiled steady state per round "
                  f"{', '.join(f'{q:.3f}' for q in ratios)}, "
                  f"first call +{b['first_call_s'] - a['first_call_s']:.1f} s "
                  f"(check itself {b['check_s']:.1f} s), peak "
                  f"{b['first_call_peak_gib']:.2f} vs {a['first_call_peak_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
