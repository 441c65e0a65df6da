"""Whether ``decode_loop.py --arms bug``'s injected bug can be seen at a given position, on
the CPU: the decode loop's made-wrong cosine, wrong at that one position only, in a small
``transformers`` Llama (2 layers, width 256, bf16, a static KV cache, ``forward``
compiled), every call checked (``ROCM_AUTOPATCH_VERIFY_CALLS``), ROCm behaviour forced.
Each row: the bug's form (``scaled``: the cosine times 1.5, as until 2026-12-05;
``added``: the cosine plus 0.5, as since), the position, and whether the check of that
call found it. On an H100 the scaled bug from position 700 went unfound because the one
check past it (position 831, where cos = -0.049) passed (BENCHMARKS.md).

    python benchmarks/bug_visibility.py [--rows scaled:831,scaled:818,...] [--json PATH]
"""

from __future__ import annotations

import argparse

from common import CPU_LLAMA, meta, run_arm, save

CHILD = r"""
import json, math, sys, torch, transformers as t
form, at = sys.argv[1], int(sys.argv[2])
from torch._inductor import decomposition as d
def bad_cos(x):  # the decode loop's bug, at position ``at`` alone
    here = (x.abs() >= at) & (x.abs() < at + 1)
    if form == "scaled":
        return torch.sin(x + math.pi / 2) * torch.where(here, 1.5, 1.0)
    return torch.sin(x + math.pi / 2) + torch.where(here, 0.5, 0.0)
d.decompositions[torch.ops.aten.cos.default] = bad_cos
""" + CPU_LLAMA.format(width=256, dtype="bfloat16") + r"""
with torch.no_grad():
    n = at - 16 + 8  # past the position
    model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
import rocm_autopatch
decode = rocm_autopatch.report().verify["graphs"][-1]
print(json.dumps({"form": form, "position": at, "cos": round(math.cos(at), 4),
                  "found": decode["status"] == "failed", "calls": decode["calls"],
                  "calls_checked": decode["calls_checked"],
                  "found_at_call": decode["found_at_call"]}))
"""

ROWS = "scaled:831,scaled:818,scaled:709,added:831,added:1039"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=ROWS)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    arm = {"ROCM_AUTOPATCH_VERIFY": "check", "ROCM_AUTOPATCH_VERIFY_CALLS": "2000"}
    results = []
    for row in args.rows.split(","):
        form, at = row.split(":")
        out = run_arm(CHILD, [form, at], arm, timeout=900)
        print(out)
        results.append(out)
    save(args.json, meta(torch), results)
    for r in results:
        if "error" not in r:
            print(f"{r['form']:>6} bug at position {r['position']} (cos {r['cos']}): "
                  f"{'found' if r['found'] else 'not found'} in {r['calls_checked']} "
                  f"checks of {r['calls']} calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
