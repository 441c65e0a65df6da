"""Start-up cost of rocm-autopatch under each installer, with and without bytecode.

    python benchmarks/startup.py TORCH_PYTHON [--wheel W] [--runs 30]

TORCH_PYTHON: a Python (a venv's) that has torch. For each installer (pip, uv) this
makes a fresh venv from the same base Python, puts the torch venv's packages on its path
through a path-only .pth (no code runs), and installs the wheel (built from this checkout
unless --wheel) with that installer: pip compiles bytecode at install, uv does not. Each
is measured with bytecode allowed and with PYTHONDONTWRITEBYTECODE=1 (many container
images), in three arms run paired and alternated so drift hits all of them:
  with     - rocm_autopatch.pth as installed;
  floor    - rocm_autopatch.pth replaced by the line ``import os``: what site charges for
             any .pth file that runs a line, the least a .pth-based tool can cost;
  without  - rocm_autopatch.pth removed (the torch.backends entry point stays, as it
             would for a user: it runs at ``import torch`` only).
Then, with ROCM_AUTOPATCH=force, the time spent inside our hooks during
``import torch, torch._dynamo, torch._inductor.config`` (``post_import.timings``: our
modules' loading included, so from source where no bytecode exists).
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Dict, List

from common import child_cwd, child_env

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("with", "floor", "without")
HOOKS = """
import json, torch, torch._dynamo, torch._inductor.config
from rocm_autopatch.startup import post_import
print(json.dumps(sum(post_import.timings.values()) * 1e3))
"""


def _run(python: str, code: str, env: Dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", code], check=True, env=env, stdout=subprocess.DEVNULL,
                   cwd=child_cwd())
    return time.perf_counter() - start


def _purelib(python: str) -> Path:
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                          "['purelib'])"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _base_python(python: str) -> str:
    cfg = Path(python).parent.parent / "pyvenv.cfg"
    for line in cfg.read_text().splitlines():
        if line.startswith("executable"):
            return line.split("=", 1)[1].strip()
    return python


def make_env(installer: str, base: str, torch_site: Path, wheel: Path, root: Path) -> str:
    path = root / installer
    if installer == "uv":
        subprocess.run([sys.executable, "-m", "uv", "venv", "-q", "--python", base, str(path)],
                       check=True)
        python = str(path / "bin" / "python")
        subprocess.run([sys.executable, "-m", "uv", "pip", "install", "-q", "--offline",
                        "--no-deps", "--python", python, str(wheel)], check=True)
    else:
        venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
        python = str(path / "bin" / "python")
        subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                        "--no-deps", "--disable-pip-version-check", str(wheel)], check=True)
    links = root / "torch-links"
    if not links.exists():
        links.mkdir()
        for entry in torch_site.iterdir():
            if not entry.name.startswith(("rocm_autopatch", "_rocm_autopatch")) and \
                    entry.suffix != ".pth":
                (links / entry.name).symlink_to(entry)
    (_purelib(python) / "torch_links.pth").write_text(f"{links}\n")
    return python


def measure(python: str, runs: int, nobytecode: bool) -> Dict[str, object]:
    pth = _purelib(python) / "rocm_autopatch.pth"
    original = pth.read_text()
    extra = {"PYTHONDONTWRITEBYTECODE": "1"} if nobytecode else {}
    env = child_env(**extra)
    if not nobytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    results: Dict[str, object] = {}
    try:
        for label, code, n, arms in (("python -c pass", "pass", runs, ARMS),
                                     ("import torch", "import torch", max(6, runs // 4),
                                      ("with", "without"))):
            times: Dict[str, List[float]] = {arm: [] for arm in arms}
            for _ in range(n):
                for arm in arms:
                    if arm == "without":
                        pth.unlink(missing_ok=True)
                    else:
                        pth.write_text(original if arm == "with" else "import os\n")
                    times[arm].append(_run(python, code, env))
            med = {arm: statistics.median(t) * 1e3 for arm, t in times.items()}
            results[label] = {**{f"{arm}_ms": med[arm] for arm in arms},
                              "ratio": med["with"] / med["without"], "runs": n}
            if "floor" in med:
                results[label]["floor_ratio"] = med["floor"] / med["without"]
    finally:
        pth.write_text(original)
    hooks = [float(subprocess.run([python, "-c", HOOKS], capture_output=True, text=True,
                                  check=True, env={**env, "ROCM_AUTOPATCH": "force"},
                                  cwd=child_cwd()).stdout.strip().splitlines()[-1])
             for _ in range(max(3, runs // 6))]
    results["hooks_force_ms"] = statistics.median(hooks)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("python", help="a Python that has torch (a venv's)")
    parser.add_argument("--wheel", help="the rocm-autopatch wheel (default: build this checkout)")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    python = os.path.abspath(args.python)  # not resolved: a venv's python is a symlink
    root = Path(tempfile.mkdtemp(prefix="rocm-autopatch-startup-"))
    wheel = Path(args.wheel) if args.wheel else None
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(root / "wheel"), str(ROOT)],
                       check=True)
        (wheel,) = (root / "wheel").glob("rocm_autopatch-*.whl")
    rows = []
    for installer in ("pip", "uv"):
        target = make_env(installer, _base_python(python), _purelib(python), wheel, root)
        for nobytecode in (False, True):
            result = measure(target, args.runs, nobytecode)
            rows.append({"installer": installer, "PYTHONDONTWRITEBYTECODE": int(nobytecode),
                         **result})
            print(f"done: {installer}, PYTHONDONTWRITEBYTECODE={int(nobytecode)}",
                  file=sys.stderr, flush=True)
    print(f"{'installer':<10}{'no-pyc':>7}{'pass with':>11}{'floor':>8}{'without':>9}"
          f"{'ratio':>7}{'floor r.':>9}{'torch ratio':>12}{'hooks(force)':>14}")
    for r in rows:
        p, t = r["python -c pass"], r["import torch"]
        print(f"{r['installer']:<10}{r['PYTHONDONTWRITEBYTECODE']:>7}{p['with_ms']:>9.2f}ms"
              f"{p['floor_ms']:>6.2f}ms{p['without_ms']:>7.2f}ms{p['ratio']:>7.3f}"
              f"{p['floor_ratio']:>9.3f}{t['ratio']:>12.3f}{r['hooks_force_ms']:>12.2f}ms")
    print(json.dumps({"python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d"),
                      "rows": rows}))


if __name__ == "__main__":
    main()
