"""Draws docs/benchmarks.png from benchmarks/results/{compile_hang,steady_state}.json.

    python benchmarks/chart.py      (needs matplotlib; not a dependency of the package)
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the headless backend

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    hang = json.loads((RESULTS / "compile_hang.json").read_text())
    steady = json.loads((RESULTS / "steady_state.json").read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    limit = hang["meta"]["limit_s"]
    names, values, colours = [], [], []
    for r in hang["results"]:
        names.append(r["arm"].replace("+", "\n+ "))
        done = r["status"] == "ok"
        values.append(r["compile_s"] if done else limit)
        colours.append("#4c72b0" if done else "#c44e52")
    bars = left.bar(names, values, color=colours)
    for bar, r in zip(bars, hang["results"]):
        label = (f"{r['compile_s']:.1f} s" if r["status"] == "ok"
                 else f"did not finish\nin {limit:.0f} s")
        left.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      ha="center", va="bottom", fontsize=9)
    left.set_ylabel("first-call compile time (s)")
    left.set_title(f"{hang['meta']['shapes']} GEMM shapes, cold cache")
    left.set_ylim(0, limit * 1.25)
    ok = [r for r in steady["results"] if r["status"] == "ok"]
    bars = right.bar([r["arm"] for r in ok], [r["median_ms"] for r in ok],
                     yerr=[r["std_ms"] for r in ok], capsize=4,
                     color=["#8c8c8c", "#4c72b0", "#55a868", "#dd8452"][:len(ok)])
    for bar, r in zip(bars, ok):
        right.annotate(f"{r['median_ms']:.1f} ms", (bar.get_x() + bar.get_width() / 2,
                                                    bar.get_height()),
                       ha="center", va="bottom", fontsize=9)
    meta = steady["meta"]
    right.set_ylabel("latency per forward (ms, median ± std)")
    right.set_title(f"Llama ~1.1B bf16, batch {meta['batch']} x {meta['seq']} tokens")
    fig.suptitle(f"rocm-autopatch on {hang['meta']['device']}, torch {hang['meta']['torch']} "
                 "(ROCm behaviour forced)", fontsize=11)
    fig.tight_layout()
    out = ROOT / "docs" / "benchmarks.png"
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
