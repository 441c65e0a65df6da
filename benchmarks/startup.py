"""Start-up cost of the .pth: interpreter start and ``import torch``, with vs without it.

    python benchmarks/startup.py VENV_PYTHON [--runs 30]

VENV_PYTHON must have rocm-autopatch installed. "without" runs the same interpreter with
``rocm_autopatch.pth`` renamed away (restored afterwards); runs are paired and alternated
so drift hits both sides. Prints medians and ratios, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _time(python: str, code: str, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", code], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _torch_modules(python: str, env: dict) -> int:
    out = subprocess.run([python, "-c", "import sys, torch; print(len([m for m in sys.modules "
                          "if m.startswith('torch')]))"], capture_output=True, text=True,
                         env=env, check=True)
    return int(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("python")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    site = subprocess.run([args.python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    pth = Path(site.stdout.strip()) / "rocm_autopatch.pth"
    hidden = pth.with_name("rocm_autopatch.pth.off")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROCM_AUTOPATCH",
                                                                       "TORCHINDUCTOR"))}
    results = {}
    try:
        for label, code, runs in (("python -c pass", "pass", args.runs),
                                  ("import torch", "import torch", max(10, args.runs // 3))):
            with_pth, without = [], []
            for _ in range(runs):
                with_pth.append(_time(args.python, code, env))
                pth.rename(hidden)
                try:
                    without.append(_time(args.python, code, env))
                finally:
                    hidden.rename(pth)
            results[label] = {"with_ms": statistics.median(with_pth) * 1e3,
                              "without_ms": statistics.median(without) * 1e3,
                              "ratio": statistics.median(with_pth) / statistics.median(without),
                              "runs": runs}
        mods_with = _torch_modules(args.python, env)
        pth.rename(hidden)
        try:
            mods_without = _torch_modules(args.python, env)
        finally:
            hidden.rename(pth)
        results["extra_torch_modules"] = mods_with - mods_without
    finally:
        if hidden.exists() and not pth.exists():
            hidden.rename(pth)
    print(f"{'measure':<16}{'with .pth':>12}{'without':>12}{'ratio':>8}")
    for label in ("python -c pass", "import torch"):
        r = results[label]
        print(f"{label:<16}{r['with_ms']:>10.1f}ms{r['without_ms']:>10.1f}ms{r['ratio']:>8.3f}")
    print(f"extra torch modules imported: {results['extra_torch_modules']}")
    print(json.dumps({"python": sys.version.split()[0], **results}))


if __name__ == "__main__":
    main()
