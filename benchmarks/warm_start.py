"""Compile once (issue 27): a cold compile against a warm start in a fresh process with a fresh
/tmp (a new container, as far as torch can tell), with the caches under ROCM_AUTOPATCH_CACHE.

    python benchmarks/warm_start.py [--models llama,runaway] [--arms one,two,mega]
                                    [--env KEY=VALUE ...] [--json PATH]

Models: transformers' Llama at TinyLlama's 1.1B configuration (22 layers, random weights,
bf16, a 1 x 512 forward, torch.compile default mode); the runaway-autotuning model of
benchmarks/compile_hang.py (32 distinct GEMM shapes, mode="max-autotune", the perf profile,
which keeps the tuning); ``gpt2-cpu``: transformers' GPT-2 with 6 layers on the CPU (random
weights, fp32, 1 x 128 tokens, default mode; also prints its logits' sum, which a warm start
must reproduce exactly). Arms, each model:
- ``one``: a process compiles with an empty cache directory (cold), then a new process
  with a new TMPDIR and the same directory (warm);
- ``two``: two processes started together on an empty directory (they race to fill it),
  then two more together on the filled one;
- ``ranks``: the same, the two processes ranks of one job (``WORLD_SIZE=2``, ``RANK``): each
  graph is compiled by one of them, the other waits and loads it (``config.compile_once``);
- ``mega``: torch's Mega-Cache instead of the directory (``torch.compiler.
  save_cache_artifacts`` after the cold compile, ``load_cache_artifacts`` before the warm
  one, each process with a new TMPDIR and no ROCM_AUTOPATCH_CACHE), where torch has it.
``--env`` adds a variable to every child (``--env INDUCTOR_FREEZING=0``).
Per process: the first call's seconds (the compile, synchronised), where they went (torch's
``dynamo_timed`` phases of 50 ms or more), torch's cache counters, and the seconds the
compile report says the caches saved. Target: warm >= 5x faster.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

from common import LLAMA_1B, RUNAWAY_MODEL, child_cwd, child_env, last_json, meta, save

CHILD = r"""
import json, sys, time, torch
model_name, mega = sys.argv[1], sys.argv[2]
if mega.startswith("load:"):
    with open(mega[5:], "rb") as fh:
        blob = fh.read()
    if blob:
        torch.compiler.load_cache_artifacts(blob)
torch.manual_seed(0)
device = "cpu" if model_name.endswith("-cpu") else "cuda"
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
if model_name == "gpt2-cpu":
    import transformers as t
    cfg = t.GPT2Config(n_layer=6)
    model = t.GPT2LMHeadModel(cfg).eval()
    x = torch.randint(0, cfg.vocab_size, (1, 128))
    f = torch.compile(model)
    call = lambda: f(input_ids=x).logits
elif model_name == "llama":
""" + textwrap.indent(LLAMA_1B, "    ") + r"""
    x = ids
    f = torch.compile(model)
    call = lambda: f(input_ids=x, use_cache=False).logits
else:
    shapes = 32
""" + textwrap.indent(RUNAWAY_MODEL, "    ") + r"""
    x = torch.randn(64, widths[0], device="cuda", dtype=torch.bfloat16)
    f = torch.compile(model, mode="max-autotune")
    call = lambda: f(x)
with torch.no_grad():
    sync()
    start = time.perf_counter()
    out = call()
    sync()
    first = time.perf_counter() - start
if mega.startswith("save:"):
    saved = torch.compiler.save_cache_artifacts()  # None: nothing to save
    with open(mega[5:], "wb") as fh:
        fh.write(saved[0] if saved else b"")
from torch._dynamo.utils import compilation_time_metrics, counters
# Where the first call's seconds went, as torch's dynamo_timed phases record them
phases = {k: round(sum(v), 3) for k, v in compilation_time_metrics.items() if sum(v) >= 0.05}
def tuners():
    # Inductor's Triton autotuners in this process: their autotune-cache state as torch
    # recorded it, and how many ended on a config marked as found by coordinate descent
    import collections, gc
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        return None
    found = []
    for o in gc.get_objects():
        try:
            if isinstance(o, CachingAutotuner):
                found.append(o)
        except ReferenceError:  # a weak proxy whose object is gone
            pass
    states = collections.Counter(
        str((getattr(o, "autotune_cache_info", None) or {}).get("autotune_cache_state"))
        for o in found)
    marked = sum(bool(o.launchers) and bool(getattr(o.launchers[0].config,
                                                    "found_by_coordesc", False))
                 for o in found)
    return {"autotuners": len(found), "cache_states": dict(states),
            "ended_found_by_coordesc": marked,
            "coordesc_benchmarks": counters["inductor"]["coordesc_tuning_bench"]}
once = sys.modules.get("rocm_autopatch.config.compile_once")  # loaded in a job of ranks
print(json.dumps({"first_call_s": round(first, 2), "out_sum": float(out.double().sum()),
                  "phases": phases, "triton_autotuners": tuners(),
                  "compile_once_waits": once and [round(w, 2) for w in once.WAITS],
                  "fx_hit": counters["inductor"]["fxgraph_cache_hit"],
                  "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
                  "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
                  "aot_miss": counters["aot_autograd"]["autograd_cache_miss"],
                  "aot_bypass": counters["aot_autograd"]["autograd_cache_bypass"]}))
"""


EXTRA: dict = {}  # --env


def start(model: str, cache: str, tag: str, work: str, mega: str = "-", **rank: str) -> tuple:
    tmp = os.path.join(work, f"tmp-{tag}")
    os.makedirs(tmp)
    report = os.path.join(work, f"report-{tag}.json")
    env = child_env(ROCM_AUTOPATCH="force", TMPDIR=tmp, ROCM_AUTOPATCH_REPORT=report,
                    **({"ROCM_AUTOPATCH_CACHE": cache} if cache else {}),
                    **({"ROCM_AUTOPATCH_PROFILE": "perf"} if model == "runaway" else {}),
                    **EXTRA, **rank)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, model, mega], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=child_cwd())
    return proc, report


def finish(started: tuple) -> dict:
    proc, report = started
    found = last_json(*proc.communicate(timeout=590))
    if "error" in found:
        return found
    try:
        with open(report) as fh:
            found["seconds_saved"] = json.load(fh)["compile"]["cache"].get("seconds_saved")
    except (OSError, ValueError, KeyError):
        found["seconds_saved"] = None
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="llama,runaway")
    parser.add_argument("--arms", default="one,two")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    EXTRA.update(item.split("=", 1) for item in args.env)
    arms = args.arms.split(",")
    work = tempfile.mkdtemp(prefix="rocm-autopatch-warm-")
    results = []
    for model in args.models.split(","):
        for arm in [a for a in ("one", "mega") if a in arms]:
            if arm == "mega" and not hasattr(torch.compiler, "save_cache_artifacts"):
                continue
            one = "" if arm == "mega" else os.path.join(work, f"{model}-{arm}")
            blob = os.path.join(work, f"{model}-mega.bin")
            cold = finish(start(model, one, f"{model}-{arm}-cold", work,
                                f"save:{blob}" if arm == "mega" else "-"))
            warm = finish(start(model, one, f"{model}-{arm}-warm", work,
                                f"load:{blob}" if arm == "mega" else "-"))
            row = {"model": model, "arm": "one process" if arm == "one" else "Mega-Cache",
                   "env": EXTRA, "cold": cold, "warm": warm}
            if cold.get("first_call_s") and warm.get("first_call_s"):
                row["speedup"] = round(cold["first_call_s"] / warm["first_call_s"], 2)
            results.append(row)
            print(json.dumps(row), flush=True)
        for arm in [a for a in ("two", "ranks") if a in arms]:
            two = os.path.join(work, f"{model}-{arm}")
            job = (lambda i: {"WORLD_SIZE": "2", "RANK": str(i), "LOCAL_RANK": str(i)}) \
                if arm == "ranks" else (lambda i: {})
            colds = [finish(p) for p in [start(model, two, f"{model}-{arm}-cold{i}", work,
                                               **job(i)) for i in (0, 1)]]
            warms = [finish(p) for p in [start(model, two, f"{model}-{arm}-warm{i}", work,
                                               **job(i)) for i in (0, 1)]]
            row = {"model": model, "arm": "two processes sharing" if arm == "two" else
                   "two ranks of a job sharing", "env": EXTRA, "cold": colds, "warm": warms}
            if all(r.get("first_call_s") for r in colds + warms):
                row["speedup"] = round(max(r["first_call_s"] for r in colds)
                                       / max(r["first_call_s"] for r in warms), 2)
            results.append(row)
            print(json.dumps(row), flush=True)
    save(args.json, meta(torch), results)


if __name__ == "__main__":
    main()
