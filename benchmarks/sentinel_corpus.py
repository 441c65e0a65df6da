"""The numerics sentinel's corpus: healthy programs and injected miscompiles, judged by
torch's criterion alone and by the sentinel's (rocm_autopatch/sentinel/judging/judge.py).

    python benchmarks/sentinel_corpus.py [--device cpu|cuda] [--only NAME...] [--json PATH]

Each case runs in its own process with ``ROCM_AUTOPATCH=force ROCM_AUTOPATCH_VERIFY=check``:
a model from transformers (tiny configs, random weights: no download) or timm (GPU), a
dtype, and optionally a bug. Bugs are made only in what Inductor compiles, through its
decomposition table (``torch._inductor.decomposition.decompositions``), never in eager:

- ``silu_bias``: SiLU 1% too large (a bias of a few bf16 rounding units)
- ``gelu_bias``: GELU 1% too large
- ``silu_gross``: SiLU 20% too large
- ``silu_nan``: SiLU gives NaN for inputs in [1, 1.01)
- ``silu_local``: SiLU gives 0 for inputs in [1, 1.01) (about 0.1% of the elements), on a
  graph whose output is SiLU's (after another layer the error is no longer local)
- ``silu_backward``: SiLU's gradient 1% too large (forward exact): training only
- late bugs (issue 25: they appear after the first call), each run for ``calls`` calls:
  - ``late_shape``: SiLU 1.5x too large past element 2^16 (ROCm/triton#944's copy kernel,
    scaled down), under ``dynamic=True`` with the sequence growing by 8 tokens every 10
    calls: first wrong where 4 x L x 256 > 2^16;
  - ``late_magnitude``: SiLU 1.5x too large for inputs beyond 30 (an overflow), the inputs
    16x larger from call 101;
  - ``late_range``: SiLU 1.5x too large above 2.5, inputs in [-3, 1] for calls 1-100 and in
    [-1, 3] after: the same magnitudes, found by sampling only.
  Their healthy twins run the same loops without the bug. ``calls_to_detection`` is the
  call that found it minus the first wrong call, at default settings.

Prints one line per case and the detection and false-alarm rates for both criteria.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r'''
import json, os, sys, torch
case = json.loads(sys.argv[1])
torch.manual_seed(0)
device = case["device"]
dtype = getattr(torch, case["dtype"])
aten = torch.ops.aten
bug = case.get("bug")
if bug:
    # So that the injected decomposition is what runs: with oneDNN weight prepacking, a CPU
    # bf16 linear followed by SiLU becomes one oneDNN kernel that no decomposition reaches.
    import torch._inductor.config as inductor_config
    inductor_config.cpp.weight_prepack = False
    from torch._inductor import decomposition as d
    def silu(x):
        return x * torch.sigmoid(x)
    if bug == "silu_bias":
        d.decompositions[aten.silu.default] = lambda x: silu(x) * 1.01
    elif bug == "silu_gross":
        d.decompositions[aten.silu.default] = lambda x: silu(x) * 1.2
    elif bug == "gelu_bias":
        base = d.decompositions[aten.gelu.default]
        d.decompositions[aten.gelu.default] = lambda x, approximate="none": base(
            x, approximate=approximate) * 1.01
    elif bug == "silu_nan":  # [1, 1.01): two bf16 values, about 0.1% of the elements
        d.decompositions[aten.silu.default] = lambda x: torch.where(
            (x >= 1.0) & (x < 1.01), x * float("nan"), silu(x))
    elif bug == "silu_local":
        d.decompositions[aten.silu.default] = lambda x: torch.where(
            (x >= 1.0) & (x < 1.01), torch.zeros_like(x), silu(x))
    elif bug == "silu_backward":
        base = d.decompositions[aten.silu_backward.default]
        d.decompositions[aten.silu_backward.default] = lambda g, x: base(g, x) * 1.01
    elif bug == "late_shape":
        d.decompositions[aten.silu.default] = lambda x: torch.where(
            torch.arange(x.numel(), device=x.device).view(x.shape) >= 2**16,
            silu(x) * 1.5, silu(x))
    elif bug == "late_magnitude":
        d.decompositions[aten.silu.default] = lambda x: torch.where(
            x.abs() > 30, silu(x) * 1.5, silu(x))
    elif bug == "late_range":
        d.decompositions[aten.silu.default] = lambda x: torch.where(
            x > 2.5, silu(x) * 1.5, silu(x))

def hf(name):
    import transformers as t
    small = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                 num_attention_heads=4)
    if name == "llama":
        cfg = t.LlamaConfig(vocab_size=512, num_key_value_heads=2, **small)
        return t.LlamaForCausalLM(cfg), "ids"
    if name == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(vocab_size=512, n_layer=2, n_embd=128,
                                               n_head=4, activation_function="gelu")), "ids"
    if name == "opt":
        return t.OPTForCausalLM(t.OPTConfig(vocab_size=512, num_hidden_layers=2,
                                            hidden_size=128, ffn_dim=256,
                                            num_attention_heads=4, word_embed_proj_dim=128)), "ids"
    if name == "bert":
        return t.BertModel(t.BertConfig(vocab_size=512, **small)), "ids"
    if name == "vit":
        return t.ViTModel(t.ViTConfig(image_size=32, patch_size=8, **small)), "pixels"
    if name == "mlp_silu":
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.SiLU(),
                                   torch.nn.Linear(1024, 256)), "dense"
    if name == "silu_out":  # SiLU's values are the graph's output: a local error stays local
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.SiLU()), "dense"
    if name == "silu_first":  # SiLU's inputs are the graph's: their values are the test's
        return torch.nn.Sequential(torch.nn.SiLU(), torch.nn.Linear(256, 256)), "dense"
    import timm
    return timm.create_model(name, pretrained=False, num_classes=100), "image"

model, kind = hf(case["model"])
model = model.to(device=device, dtype=dtype if not case.get("autocast") else torch.float32)
gen = torch.Generator(device="cpu").manual_seed(1)
if kind == "ids":
    x = (torch.randint(0, 512, (4, 64), generator=gen).to(device),)
elif kind == "pixels":
    x = (torch.randn(4, 3, 32, 32, generator=gen).to(device, dtype),)
elif kind == "image":
    x = (torch.randn(8, 3, 224, 224, generator=gen).to(device, dtype),)
else:
    x = (torch.randn(64, 256, generator=gen).to(device, dtype) * 3,)

def out_of(y):
    if hasattr(y, "logits"): return y.logits
    if hasattr(y, "last_hidden_state"): return y.last_hidden_state
    return y

mode = case.get("mode", "infer")
compiled = torch.compile(model, dynamic=case.get("dynamic", False))
if mode == "infer":
    model.eval()
    with torch.no_grad():
        y = out_of(compiled(*x))
elif mode == "greedy":
    model.eval()
    step = torch.compile(lambda ids: out_of(model(ids))[:, -1].argmax(-1))
    with torch.no_grad():
        ids = x[0][:, :8]
        for _ in range(8):
            ids = torch.cat([ids, step(ids)[:, None]], dim=1)
elif mode == "late":
    model.eval()
    late, calls = case["late"], case["calls"]
    step = torch.compile(model, dynamic=late == "shape")
    first_bad = {"shape": None, "magnitude": 101, "range": 101}[late]
    healthy_calls = {"shape": 400, "magnitude": 2000, "range": 2000}[late]
    found = None
    import rocm_autopatch
    with torch.no_grad():
        for i in range(1, (calls if bug else healthy_calls) + 1):
            if late == "shape":
                length = 8 * (1 + i // 10)
                if first_bad is None and 4 * length * 256 > 2**16:
                    first_bad = i
                inp = torch.randint(0, 512, (4, length), generator=gen).to(device)
            elif late == "magnitude":
                inp = (torch.randn(64, 256, generator=gen) * 3 * (16 if i > 100 else 1)
                       ).to(device, dtype)
            else:
                inp = (torch.rand(64, 256, generator=gen) * 4 - (3 if i <= 100 else 1)
                       ).to(device, dtype)
            step(inp)
            graphs = rocm_autopatch.report().verify["graphs"]
            if any(g["status"] in ("failed", "fell back") for g in graphs):
                break
    late_result = {"first_bad": first_bad if bug else None, "calls_run": i}
else:
    model.train()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bool(case.get("autocast"))):
        loss = out_of(compiled(*x)).float().pow(2).mean()
    loss.backward()
import rocm_autopatch
v = rocm_autopatch.report().verify
KEYS = ("status", "reason", "judge", "backward", "mismatch", "calls", "calls_checked",
        "checked_because", "shapes", "period", "values_stride", "found_at_call",
        "found_because", "unverified_calls", "references", "checks_read_later",
        "skipped_reason")
print(json.dumps({"graphs": [{k: g.get(k) for k in KEYS} for g in v["graphs"]],
                  "late": globals().get("late_result")}, default=str))
'''

MODELS_CPU = ["llama", "gpt2", "opt", "bert", "vit", "mlp_silu", "silu_out"]


def cases(device: str) -> List[Dict[str, Any]]:
    found: List[Dict[str, Any]] = []
    models = MODELS_CPU + (["resnet50", "vit_base_patch16_224"] if device == "cuda" else [])
    for model in models:
        for dtype in ("float32", "bfloat16") + (("float16",) if device == "cuda" else ()):
            found.append({"model": model, "dtype": dtype})
    found += [{"model": "llama", "dtype": "bfloat16", "mode": "greedy"},
              {"model": "gpt2", "dtype": "float32", "mode": "greedy"},
              {"model": "llama", "dtype": "float32", "mode": "train", "autocast": True},
              {"model": "llama", "dtype": "bfloat16", "dynamic": True}]
    bugs = [("silu_bias", "llama"), ("silu_bias", "mlp_silu"), ("gelu_bias", "gpt2"),
            ("silu_gross", "llama"), ("silu_nan", "mlp_silu"), ("silu_local", "silu_out")]
    for bug, model in bugs:
        for dtype in ("float32", "bfloat16"):
            found.append({"model": model, "dtype": dtype, "bug": bug})
    found.append({"model": "llama", "dtype": "float32", "mode": "train", "bug": "silu_backward"})
    # Enough calls to pass the bound on a cheap graph (the loop stops at the finding).
    late = [("shape", "llama", 400), ("magnitude", "mlp_silu", 20000),
            ("range", "silu_first", 20000)]
    for kind, model, calls in late:
        for bug in (None, f"late_{kind}"):
            found.append({"model": model, "dtype": "bfloat16", "mode": "late", "late": kind,
                          "calls": calls, **({"bug": bug} if bug else {})})
    for case in found:
        case["device"] = device
        case["name"] = "-".join(str(case[k]) for k in ("model", "dtype") if k in case) + "".join(
            f"-{case[k] if k != 'dynamic' else 'dynamic'}"
            for k in ("mode", "late", "bug", "dynamic")
            if case.get(k) and case.get(k) != "infer")
    return found


def verdict(graphs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Did the sentinel say wrong, and would torch's criterion alone have?"""
    ours = any(g["status"] in ("failed", "fell back") for g in graphs)
    torch_says = any((g.get("judge") or {}).get("torch_criterion") == "failed"
                     or (g.get("mismatch") or {}).get("torch_ok") is False
                     or str(g.get("backward", "")).startswith("failed") for g in graphs)
    skipped = [g["reason"] for g in graphs if g["status"] == "skipped"]
    return {"ours": ours, "torch": torch_says, "skipped": skipped,
            "graphs": len(graphs)}


def run(case: Dict[str, Any]) -> Dict[str, Any]:
    # No Inductor cache: its key does not cover the decomposition table, so a graph compiled
    # with one injected bug would be served to the next case, with another or none.
    env = {**os.environ, "ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_VERIFY": "check",
           "TOKENIZERS_PARALLELISM": "false", "INDUCTOR_FORCE_DISABLE_CACHES": "1",
           "ROCM_AUTOPATCH_RUNGS": "off"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(case)], capture_output=True,
                          text=True, env=env, timeout=900)
    seconds = time.perf_counter() - start
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {**case, "error": proc.stderr.strip()[-600:], "seconds": seconds}
    out = {**case, **verdict(data["graphs"]), "seconds": round(seconds, 1),
           "detail": data["graphs"]}
    late = data.get("late")
    if late:
        found = [g for g in data["graphs"] if g.get("found_at_call")]
        out["calls_run"] = late["calls_run"]
        out["checks"] = sum(g.get("calls_checked") or 0 for g in data["graphs"])
        if late["first_bad"] and found:
            out["first_bad"] = late["first_bad"]
            out["found_at_call"] = found[0]["found_at_call"]
            out["found_because"] = found[0]["found_because"]
            out["calls_to_detection"] = found[0]["found_at_call"] - late["first_bad"]
            out["period"] = found[0]["period"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--json")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    todo = [c for c in cases(args.device) if not args.only or c["name"] in args.only
            or any(o in c["name"] for o in args.only)]
    from concurrent.futures import ThreadPoolExecutor

    results = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(run, todo):  # each case's line as it comes: a bounded run keeps them
            results.append(r)
            print(json.dumps(r, default=str), flush=True)
    healthy = [r for r in results if not r.get("bug") and "error" not in r]
    buggy = [r for r in results if r.get("bug") and "error" not in r]
    for r in results:
        if "error" in r:
            print(f"{r['name']:<44} ERROR {r['error'][-300:]}")
            continue
        expect = "bug" if r.get("bug") else "healthy"
        print(f"{r['name']:<44} {expect:<8} torch: {'wrong' if r['torch'] else 'ok':<6}"
              f"ours: {'wrong' if r['ours'] else 'ok':<6}{r['graphs']} graphs"
              + (f", {len(r['skipped'])} not compared" if r["skipped"] else "")
              + (f", {r['checks']} checks in {r['calls_run']} calls" if "checks" in r else "")
              + (f"; wrong from call {r['first_bad']}, found at {r['found_at_call']} "
                 f"({r['found_because']}): {r['calls_to_detection']} calls later, period "
                 f"{r['period']}" if "found_at_call" in r else "")
              + f"  {r['seconds']} s")
    for who in ("torch", "ours"):
        caught = sum(r[who] for r in buggy)
        alarms = sum(r[who] for r in healthy)
        print(f"{who:>6}: caught {caught}/{len(buggy)} injected bugs; false alarms "
              f"{alarms}/{len(healthy)} healthy programs")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
