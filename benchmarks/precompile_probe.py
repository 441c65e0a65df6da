"""Can torch's precompile skip Dynamo for an unchanged model on a warm start (issue 34)?

    python benchmarks/precompile_probe.py [--layers 6]

GPT-2 from transformers (random weights, fp32, 1 x 128 tokens, on the CPU), as a user's
unchanged script would compile it, run through the running torch's ahead-of-time path:
``torch.compile(model.forward, fullgraph=True).aot_compile(((), {"input_ids": ids}))``, then
``save_compiled_function``; where that works, a new process loads it
(``torch.compiler.load_compiled_function``) and its first call is timed. Prints one JSON
line: torch, each step's outcome (or the error torch raised) and seconds. The doctor's
warm-start line cites what this found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time, torch, transformers as t
layers, path, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.manual_seed(0)
model = t.GPT2LMHeadModel(t.GPT2Config(n_layer=layers)).eval()
ids = torch.randint(0, 50257, (1, 128), generator=torch.Generator().manual_seed(1))
out, began = {"mode": mode}, time.perf_counter()
try:
    with torch.no_grad():
        if mode == "save":
            fn = torch.compile(model.forward, fullgraph=True).aot_compile(
                ((), {"input_ids": ids}))
            out["compiled_s"] = round(time.perf_counter() - began, 2)
            fn.save_compiled_function(path)
        else:
            with open(path, "rb") as fh:
                fn = torch.compiler.load_compiled_function(fh)
            fn(model, input_ids=ids)
        out["seconds"] = round(time.perf_counter() - began, 2)
        out["outcome"] = "ok"
except Exception as exc:  # what torch raised is the finding
    out["outcome"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
print(json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()
    import torch

    work = tempfile.mkdtemp(prefix="precompile-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(work, "cache"),
           "ROCM_AUTOPATCH": os.environ.get("ROCM_AUTOPATCH", "force")}
    path = os.path.join(work, "forward.bin")
    found = {"torch": torch.__version__, "layers": args.layers,
             "date": time.strftime("%Y-%m-%d")}
    for mode in ("save", "load"):
        proc = subprocess.run([sys.executable, "-c", CHILD, str(args.layers), path, mode],
                              capture_output=True, text=True, env=env, timeout=900)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        found[mode] = json.loads(lines[-1]) if lines else {"outcome": proc.stderr[-300:]}
        if found[mode].get("outcome") != "ok":
            break
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
