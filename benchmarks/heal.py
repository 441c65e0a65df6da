"""From a wrong graph to a healed one (issue 26): bisection time to verdict, the repro's size,
and the speed of the healed graph against the compiled one and the eager fallback.

    python benchmarks/heal.py [--device cuda|cpu] [--layers 2] [--json PATH]

The bug is the sentinel corpus's ``silu*1.2`` (benchmarks/sentinel_corpus.py): Inductor's
decomposition of silu made wrong. It must be in every interpreter the bisection starts, as a
torch bug would be, so a ``sitecustomize`` on the children's PYTHONPATH installs it. The
model: transformers' Llama at TinyLlama's width (hidden 2048, intermediate 5632, 32 heads,
4 KV heads; a 1.1B-class layer), ``--layers`` layers (the bisection compiles the graph
about 25 times, so the whole 22 layers would not fit one device call), random weights,
bf16, inference on 4 x 256 tokens. CPU: width 256.

Arms, each a process of its own with the same Inductor cache directory:
1. ``fallback``: VERIFY=fallback with the bug: the graph is found wrong and runs eagerly;
2. ``rocm-autopatch bisect`` on the repro it wrote (time to verdict, the answer);
3. ``healed``: the same program again: the graph compiles with the remembered fix;
4. ``compiled``: no bug, VERIFY off (what the healed graph is measured against).
Per arm: the median time of a forward (CUDA events) over ``CALLS`` calls after 3 warm-up
calls, and the sentinel's verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import child_cwd, child_env, last_json, meta, save

CALLS = 30
SITECUSTOMIZE = """
import torch
from torch._inductor import decomposition as d
d.decompositions[torch.ops.aten.silu.default] = lambda x: x * torch.sigmoid(x) * 1.2
"""

CHILD = r"""
import json, statistics, sys, time, torch, transformers as t
device, layers, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
if device == "cuda":
    cfg = t.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                        num_hidden_layers=layers, num_attention_heads=32,
                        num_key_value_heads=4)
    dtype, shape = torch.bfloat16, (4, 256)
else:
    cfg = t.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2)
    dtype, shape = torch.float32, (2, 64)
with torch.device(device):
    model = t.LlamaForCausalLM(cfg).to(dtype).eval()
ids = torch.randint(0, cfg.vocab_size, shape, device=device)
f = torch.compile(model.model)

def timed(fn):
    out = []
    for _ in range(calls):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
        else:
            s = time.perf_counter(); fn(); out.append((time.perf_counter() - s) * 1e3)
    return statistics.median(out)

with torch.no_grad():
    start = time.perf_counter()
    first = f(input_ids=ids, use_cache=False).last_hidden_state
    first_call = time.perf_counter() - start
    for _ in range(2):
        f(input_ids=ids, use_cache=False)
    ms = timed(lambda: f(input_ids=ids, use_cache=False))
    eager_ms = (timed(lambda: model.model(input_ids=ids, use_cache=False))
                if "eager" in sys.argv else None)
    ref = model.model(input_ids=ids, use_cache=False).last_hidden_state
err = float((first.float() - ref.float()).abs().max())
graphs = []
try:
    import rocm_autopatch
    graphs = [{k: g.get(k) for k in ("status", "reason", "repro", "healed", "calls_checked")}
              for g in rocm_autopatch.report().verify.get("graphs", [])]
except ImportError:
    pass
print(json.dumps({"ms": round(ms, 3), "eager_ms": eager_ms and round(eager_ms, 3),
                  "first_call_s": round(first_call, 2), "max_abs_diff_vs_eager": err,
                  "graphs": graphs}))
"""


def child(argv, env, timeout=900):
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=child_cwd())
    return last_json(proc.stdout, proc.stderr)


def size(folder):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--limit", type=float, default=420)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    work = tempfile.mkdtemp(prefix="rocm-autopatch-heal-")
    inject = os.path.join(work, "inject")
    os.makedirs(inject)
    with open(os.path.join(inject, "sitecustomize.py"), "w") as fh:
        fh.write(SITECUSTOMIZE)
    ours = {"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_VERIFY": "fallback",
            "ROCM_AUTOPATCH_VERIFY_BISECT": "0", "ROCM_AUTOPATCH_RUNGS": "off",
            "ROCM_AUTOPATCH_VERIFY_DIR": os.path.join(work, "repros"),
            "ROCM_AUTOPATCH_FIXES": os.path.join(work, "fixes.json"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(work, "inductor")}
    buggy = child_env(**ours, PYTHONPATH=inject)
    argv = [args.device, str(args.layers), str(CALLS)]
    results = []
    fell = child(argv + ["eager"], buggy)
    results.append({"arm": "fallback (bug found, graph eager)", **fell})
    print(json.dumps(results[-1]), flush=True)
    repro = next((g["repro"] for g in fell.get("graphs", []) if g.get("repro")), None)
    if repro:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "rocm_autopatch", "bisect", repro,
                               "--json", "--time-limit", str(args.limit)], capture_output=True,
                              text=True, env=buggy, cwd=child_cwd(), timeout=args.limit + 120)
        took = time.perf_counter() - start
        try:
            found = json.loads(proc.stdout)
        except ValueError:
            found = {"error": proc.stderr[-2000:]}
        results.append({"arm": "rocm-autopatch bisect", "seconds": round(took, 1),
                        "steps": found.get("steps"), "answer": found.get("answer"),
                        "remembered": bool(found.get("remembered")),
                        "repro_bytes": size(repro), "error": found.get("error"),
                        "torch_bisector": found.get("torch_bisector"),
                        "tried": [t.get("outcome") for t in found.get("tried", [])]})
        print(json.dumps(results[-1]), flush=True)
        healed = child(argv, buggy)
        results.append({"arm": "healed (remembered fix)", **healed})
        print(json.dumps(results[-1]), flush=True)
    clean = child_env(ROCM_AUTOPATCH="force",
                      TORCHINDUCTOR_CACHE_DIR=os.path.join(work, "inductor-clean"))
    compiled = child(argv, clean)
    results.append({"arm": "compiled (no bug, sentinel off)", **compiled})
    print(json.dumps(results[-1]), flush=True)
    base = compiled.get("ms")
    eager = fell.get("eager_ms")
    for r in results:
        if r.get("ms") and base:
            r["vs_compiled"] = round(r["ms"] / base, 3)
    summary = {"compiled_ms": base, "eager_ms": eager,
               "healed_ms": results[2].get("ms") if len(results) > 3 else None}
    if summary["healed_ms"] and eager and base and eager != base:
        # The share of the compile speed-up the healed graph keeps.
        summary["speedup_kept"] = round((eager - summary["healed_ms"]) / (eager - base), 3)
    results.append({"arm": "summary", **summary})
    save(args.json, meta(torch, layers=args.layers) if args.device == "cuda" else
         {"device": "cpu", "torch": torch.__version__, "layers": args.layers,
          "date": time.strftime("%Y-%m-%d")}, results)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
