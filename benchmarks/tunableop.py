"""TunableOp under the perf profile (issue 33): does a process tune, write its results under
ROCM_AUTOPATCH_CACHE, and does the next one start tuned? And what it is worth.

    python benchmarks/tunableop.py [--iters 20] [--arms safe,perf-no-tunableop,...] [--json PATH]

Model: transformers' Llama at TinyLlama's 1.1B configuration (22 layers, random weights,
bf16), a 1 x 512 prefill compiled with ``torch.compile`` defaults (Inductor hands its GEMMs
to ATen, where TunableOp picks). Arms, each its own process with an empty Inductor cache,
ROCm behaviour forced, in this order (``--arms`` picks some):

- ``safe``: the default profile (TunableOp off);
- ``perf-no-tunableop``: perf with ``PYTORCH_TUNABLEOP_ENABLED=0`` (a user's own variable
  leaves TunableOp to them): what perf is worth without it;
- ``perf-cold``: ``ROCM_AUTOPATCH_PROFILE=perf`` with an empty ``ROCM_AUTOPATCH_CACHE``:
  TunableOp on, every GEMM shape tuned in this process, written at its exit;
- ``perf-warm``: the same directory: merged at start, read by torch at its first GEMM.

Per arm: the first call's seconds (compile and tuning), the steady state (median of
``--iters`` calls after 5 warm-ups, CUDA events; where TunableOp is on, again with it
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

from common import LLAMA_1B, meta, run_arm

CHILD = LLAMA_1B + r"""
import json, statistics, sys, time
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
    median = steady()
    tunable = torch.cuda.tunable
    was_on, held = tunable.is_enabled(), len(tunable.get_results())
    # the same compiled code with TunableOp switched off in this process: what it is worth
    if was_on:
        tunable.enable(False)
        median_off = steady()
        tunable.enable(True)
import rocm_autopatch
fix = rocm_autopatch.report().fixes.get("tunableop")
print(json.dumps({"first_call_s": round(first, 2), "median_ms": median,
                  "median_ms_tunableop_switched_off": median_off if was_on else None,
                  "tunable_enabled": was_on, "filename": tunable.get_filename(),
                  "results_held": held,
                  "record": fix and f"{fix['status']}: {fix['reason']}",
                  "logits_sum": float(logits.float().sum())}))
"""


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
    parser.add_argument("--iters", type=int, default=20)
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
            got = run_arm(CHILD, [str(args.iters)], env, timeout=900)
            if "ROCM_AUTOPATCH_CACHE" in env:
                got["files_after"] = _files(cache)
            results.append({"arm": name, **got})
            print(json.dumps(results[-1]), flush=True)
    if args.json:
        import torch

        with open(args.json, "w") as fh:
            json.dump({**meta(torch), "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
