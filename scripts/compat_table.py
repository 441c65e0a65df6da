"""Render benchmarks/results/compat-results.jsonl (written by scripts/compat.sh) as the
per-release Markdown table in TESTING.md: the compile report against torch's own log, the
sentinel's verdict on each scenario, the capture policy's form.

    python scripts/compat_table.py [benchmarks/results/compat-results.jsonl]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "compat-results.jsonl"
SCENARIOS = ("bug_check", "bug_fallback", "kvcache", "batchnorm", "dropout")


def _max(values: Any) -> str:
    nums = [v for v in (values or []) if isinstance(v, (int, float))]
    return f"{max(nums):.2g}" if nums else "?"


def _scenario(name: str, data: Dict[str, Any]) -> str:
    if "crashed" in data:
        return "crashed"
    status = ", ".join(data["statuses"]) or "nothing checked"
    out = data.get("out", {})
    if name.startswith("bug"):
        return f"{status} (program off by {_max(out.get('diffs'))})"
    if name == "batchnorm":
        backward = ", ".join(b.split(":")[0] for b in data.get("backward", [])) or "?"
        tracked = "/".join(map(str, out.get("num_batches_tracked", [])))
        return f"{status}, backward {backward} (batches tracked {tracked})"
    if name == "kvcache":
        return f"{status} (cache off by {out.get('cache', '?')})"
    return status


def rows(path: Path) -> Dict[str, Dict[str, Any]]:
    by_release: Dict[str, Dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        by_release.setdefault(entry["release"], {})[entry["script"]] = entry["result"]
    return by_release


def table(path: Path = RESULTS) -> str:
    head = ("| torch | graph breaks: report / torch's log | recompiles: report / torch's log "
            "| injected bug, `check` | same, `fallback` | KV cache | BatchNorm | dropout "
            "| capture policy form |")
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    for release, scripts in rows(path).items():
        rv = scripts.get("compat_report_verify.py", {})
        rep = rv.get("report", {})
        ver = rv.get("verify", {})
        form = scripts.get("capture_policy_repro.py", {}).get("form", "?")
        cells = [rv.get("torch", release),
                 f"{rep.get('graph_breaks', '?')} / {rep.get('torch_logged_breaks', '?')}",
                 f"{rep.get('recompiles', '?')} / {rep.get('torch_logged_recompiles', '?')}"]
        cells += [_scenario(s, ver[s]) if s in ver else "?" for s in SCENARIOS]
        cells.append(form)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS))
