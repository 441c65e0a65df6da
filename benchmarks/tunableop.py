"""TunableOp under the perf profile (issue 33): does a process tune, write its results under
ROCM_AUTOPATCH_CACHE, and does the next one start tuned? And what it is worth.

    python benchmarks/tunableop.py [--phase prefill|decode] [--iters 20] [--tokens 256]
                                   [--arms safe,perf-no-tunableop,...] [--json PATH]

Model: transformers' Llama at TinyLlama's 1.1B configuration (22 layers, random weights,
bf16), compiled with ``torch.compile`` defaults (Inductor hands its GEMMs to ATen, where
TunableOp picks). ``--phase prefill``: a 1 x 512 forward, ``fn = torch.compile(model)``.
``--phase decode``: greedy ``generate`` of ``--tokens`` new tokens after a 16-token prompt,
static KV cache, ``model.forward`` compiled once as a user would (transformers' own compile
switched off, so the model is compiled once, not twice); its GEMMs are 1-row.
Arms, each its own process with an empty Inductor cache, ROCm behaviour forced, in this
order (``--arms`` picks some):

- ``safe``: the default profile (TunableOp off);
- ``perf-no-tunableop``: perf with ``PYTORCH_TUNABLEOP_ENABLED=0`` (a user's own variable
  leaves TunableOp to them): what perf is worth without it;
- ``perf-cold``: ``ROCM_AUTOPATCH_PROFILE=perf`` with an empty ``ROCM_AUTOPATCH_CACHE``:
  TunableOp on, every GEMM shape tuned in this process, written at its exit;
- ``perf-warm``: the same directory: merged at start, read by torch at its first GEMM.

Per arm: the first call's seconds (compile and tuning; decode: the first ``generate``), the
steady state (prefill: median of ``--iters`` calls after 5 warm-ups, CUDA events; decode:
tokens/s over three ``generate`` calls after the first; where TunableOp is on, again with it
switched off in the same process, ``torch.cuda.tunable.enable(False)``), torch's own TunableOp state
(``torch.cuda.tunable``: enabled, the file it reads and writes, the results it holds at the
end) and what the record says; after each perf arm, the directory's files and their result
lines (what the next process will read).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile

from common import LLAMA_1B, TOKENS_PER_S, meta, run_arm

# Each phase defines first (seconds), steady() (its steady-state number, named unit) and
# extra (what else it reports); STEADY measures steady() with TunableOp on and switched off.
PREFILL = r"""
iters = int(sys.argv[1])
fn = torch.compile(model)
with torch.no_grad():
    torch.cuda.synchronize()
    start = time.perf_counter()
    logits = fn(input_ids=ids).logits
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    for _ in range(5):
        fn(input_ids=ids)
def steady():
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(input_ids=ids); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return round(statistics.median(times), 3)
unit, extra = "median_ms", {"logits_sum": float(logits.float().sum())}
"""

DECODE = r"""
tokens = int(sys.argv[2])
model.generation_config.cache_implementation = "static"
model.generation_config.disable_compile = True  # compiled once, below, as a user would
model.forward = torch.compile(model.forward)
prompt = ids[:, :16]
def generate():
    return model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                          do_sample=False, pad_token_id=0)
with torch.no_grad():
    torch.cuda.synchronize()
    start = time.perf_counter()
    text = generate()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
""" + TOKENS_PER_S + r"""
steady = tokens_per_s
unit, extra = "tokens_per_s", {"tokens": text[0, 16:32].tolist()}
"""

STEADY = r"""
with torch.no_grad():
    value, value_off = steady(), None
    tunable = torch.cuda.tunable
    was_on, held = tunable.is_enabled(), len(tunable.get_results())
    if was_on:  # the same compiled code with TunableOp switched off: what it is worth
        tunable.enable(False)
        value_off = steady()
        tunable.enable(True)
out = {"first_call_s": round(first, 2), unit: value,
       unit + "_tunableop_switched_off": value_off, **extra}
"""

RESULT = r"""
import rocm_autopatch
fix = rocm_autopatch.report().fixes.get("tunableop")
print(json.dumps({**out, "tunable_enabled": was_on, "filename": tunable.get_filename(),
                  "results_held": held,
                  "record": fix and f"{fix['status']}: {fix['reason']}"}))
"""


def child(phase: str) -> str:
    """The child's code for ``phase``: the model, the phase's calls, the result line."""
    return (LLAMA_1B + "import json, statistics, sys, time\n"
            + (PREFILL if phase == "prefill" else DECODE) + STEADY + RESULT)


def _files(where: str) -> dict:
    """The CSV files under the cache directory: result lines each (validators left out)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(where, "**", "*.csv"), recursive=True)):
        with open(path) as fh:
            lines = [x for x in fh.read().splitlines() if x and not x.startswith("Validator")]
        found[os.path.relpath(path, where)] = len(lines)
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=("prefill", "decode"), default="prefill")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--arms", default="safe,perf-no-tunableop,perf-cold,perf-warm")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as cache:
        arms = [("safe", {}),
                ("perf-no-tunableop", {"ROCM_AUTOPATCH_PROFILE": "perf",
                                       "ROCM_AUTOPATCH_CACHE": cache,
                                       "PYTORCH_TUNABLEOP_ENABLED": "0"}),
                ("perf-cold", {"ROCM_AUTOPATCH_PROFILE": "perf", "ROCM_AUTOPATCH_CACHE": cache}),
                ("perf-warm", {"ROCM_AUTOPATCH_PROFILE": "perf", "ROCM_AUTOPATCH_CACHE": cache})]
        for name, env in [a for a in arms if a[0] in args.arms.split(",")]:
            got = run_arm(child(args.phase), [str(args.iters), str(args.tokens)], env,
                          timeout=900)
            if "ROCM_AUTOPATCH_CACHE" in env:
                got["files_after"] = _files(cache)
            results.append({"arm": name, **got})
            print(json.dumps(results[-1]), flush=True)
    if args.json:
        import torch

        with open(args.json, "w") as fh:
            json.dump({**meta(torch, phase=args.phase), "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
