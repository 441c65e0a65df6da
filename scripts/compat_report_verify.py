"""Per-release check of the compile report and the numerics sentinel, run by
scripts/compat.sh in each torch venv (ROCM_AUTOPATCH=force). Prints one JSON line:

- ``report``: compile_report_repro.py ``kinds`` under ``TORCH_LOGS=graph_breaks,recompiles``:
  our graph-break and recompile counts against the lines torch logged in the same run;
- ``verify``: verify_repro.py's injected miscompile under check and fallback, a KV cache
  and BatchNorm (state advanced once), dropout: each graph's status and what the program
  got.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LOG_LINE = re.compile(r"^[A-Z]\d{4} \S+ \d+ \S+\] \[[^\]]*\] \[__(graph_breaks|recompiles)\] "
                      r"(.*)$", re.MULTILINE)


def run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(HERE, script), *args],
                          capture_output=True, text=True, timeout=900, cwd=tempfile.gettempdir(),
                          env={**os.environ, "ROCM_AUTOPATCH": "force", **env})


def report() -> dict:
    path = os.path.join(tempfile.mkdtemp(), "r.json")
    proc = run("compile_report_repro.py", "kinds", ROCM_AUTOPATCH_REPORT=path,
               TORCH_LOGS="graph_breaks,recompiles")
    if proc.returncode != 0 or not os.path.exists(path):
        return {"crashed": proc.stderr[-600:]}
    lines = LOG_LINE.findall(proc.stderr)
    logged_breaks = sum(k == "graph_breaks" and t.startswith("Graph break") for k, t in lines)
    logged_recompiles = sum(t.startswith("Recompiling function") for _, t in lines)
    with open(path) as fh:
        c = json.load(fh)["compile"]
    ours = (c["graph_breaks"]["total"], c["recompiles"]["total"])
    return {"graph_breaks": ours[0], "torch_logged_breaks": logged_breaks,
            "recompiles": ours[1], "torch_logged_recompiles": logged_recompiles,
            "agree": ours == (logged_breaks, logged_recompiles), "unknown": c["unknown"]}


def verify() -> dict:
    out = {}
    for name, scenario, how in (("bug_check", "bug", "check"), ("bug_fallback", "bug", "fallback"),
                                ("kvcache", "kvcache", "check"),
                                ("batchnorm", "batchnorm", "check"),
                                ("dropout", "dropout", "check")):
        proc = run("verify_repro.py", scenario, ROCM_AUTOPATCH_VERIFY=how)
        try:
            data = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            out[name] = {"crashed": proc.stderr[-600:]}
            continue
        out[name] = {"statuses": [g["status"] for g in data["verify"]["graphs"]],
                     "backward": [g.get("backward", "") for g in data["verify"]["graphs"]],
                     "reasons": [g["reason"][:120] for g in data["verify"]["graphs"]
                                 if g["reason"]], "out": data["out"]}
    return out


if __name__ == "__main__":
    import torch

    print(json.dumps({"torch": torch.__version__, "report": report(), "verify": verify()}))
