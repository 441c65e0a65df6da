"""Start-up cost of the .pth: interpreter start and ``import torch``, with vs without it.

    python benchmarks/startup.py VENV_PYTHON [--runs 30]

VENV_PYTHON must have rocm-autopatch installed. Three arms, run paired and alternated so
drift hits all of them, in the same interpreter:
  with     - rocm_autopatch.pth as installed;
  floor    - rocm_autopatch.pth replaced by the line ``import os``: what site charges for
             any .pth file that runs a line, i.e. the least a .pth-based tool can cost;
  without  - rocm_autopatch.pth renamed away.
The installed file is restored afterwards. Prints medians and ratios, then one JSON line.
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

from common import child_cwd, child_env

ARMS = ("with", "floor", "without")


def _time(python: str, code: str, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", code], check=True, env=env, stdout=subprocess.DEVNULL,
                   cwd=child_cwd())
    return time.perf_counter() - start


def _torch_modules(python: str, env: dict) -> int:
    out = subprocess.run([python, "-c", "import sys, torch; print(len([m for m in sys.modules "
                          "if m.startswith('torch')]))"], capture_output=True, text=True,
                         env=env, check=True, cwd=child_cwd())
    return int(out.stdout.strip())


class PthArms:
    """Switches site-packages between the three arms; always puts the real file back."""

    def __init__(self, site: Path) -> None:
        self.pth = site / "rocm_autopatch.pth"
        self.original = self.pth.read_text()

    def set(self, arm: str) -> None:
        if arm == "without":
            self.pth.unlink(missing_ok=True)
        else:
            self.pth.write_text(self.original if arm == "with" else "import os\n")

    def restore(self) -> None:
        self.pth.write_text(self.original)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("python")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    # Absolute, not resolved: a venv's python is a symlink whose target is outside the venv.
    args.python = os.path.abspath(args.python)
    site = subprocess.run([args.python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    arms = PthArms(Path(site.stdout.strip()))
    env = child_env()
    results: dict = {}
    try:
        for label, code, runs in (("python -c pass", "pass", args.runs),
                                  ("import torch", "import torch", max(10, args.runs // 3))):
            times: dict = {arm: [] for arm in ARMS}
            for _ in range(runs):
                for arm in ARMS:
                    arms.set(arm)
                    times[arm].append(_time(args.python, code, env))
            med = {arm: statistics.median(t) * 1e3 for arm, t in times.items()}
            results[label] = {**{f"{arm}_ms": med[arm] for arm in ARMS},
                              "ratio": med["with"] / med["without"],
                              "floor_ratio": med["floor"] / med["without"],
                              "ours_over_floor_ms": med["with"] - med["floor"], "runs": runs}
        modules = {}
        for arm in ("with", "without"):
            arms.set(arm)
            modules[arm] = _torch_modules(args.python, env)
        results["extra_torch_modules"] = modules["with"] - modules["without"]
    finally:
        arms.restore()
    print(f"{'measure':<16}{'with .pth':>12}{'floor':>10}{'without':>10}{'ratio':>8}"
          f"{'floor ratio':>13}")
    for label in ("python -c pass", "import torch"):
        r = results[label]
        print(f"{label:<16}{r['with_ms']:>10.1f}ms{r['floor_ms']:>8.1f}ms{r['without_ms']:>8.1f}ms"
              f"{r['ratio']:>8.3f}{r['floor_ratio']:>13.3f}")
    print(f"extra torch modules imported: {results['extra_torch_modules']}")
    print(json.dumps({"python": sys.version.split()[0], **results}))


if __name__ == "__main__":
    main()
