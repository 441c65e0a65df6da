"""The sentinel's false-alarm rate on code nobody here wrote (issue 32): torch's OpInfo database
(``torch.testing._internal.common_methods_invocations.op_db``), each op, each float dtype,
its first samples, compiled one by one under ``ROCM_AUTOPATCH_VERIFY=check``.

    python benchmarks/opinfo_corpus.py [--device cpu|cuda] [--samples 2] [--dynamic]
                                       [--ops erf,stft,...] [--seconds 480] [--jobs 1]
                                       [--json PATH]

The script runs itself again with ROCm behaviour forced and the sentinel on (repros off), in
one process: each sample is compiled fresh (``torch._dynamo.reset()``), called once, and the
graphs it made are read from ``rocm_autopatch.report()``. Printed: graphs judged, judged
wrong (each with op, dtype, rule and detail: to be investigated, a miscompile or a false
alarm), not checked (by reason), and samples whose compile or eager run raised (the op's
own, not counted). ``--seconds`` bounds the run: it stops between ops and says how far it
got. ``--jobs N`` splits ``op_db`` into N interleaved shards, each its own process (compiling
is the cost, and it runs on the CPU), and merges their results.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from typing import Any, Dict, List

FORCED = {"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_VERIFY": "check",
          "ROCM_AUTOPATCH_VERIFY_DIR": "off", "ROCM_AUTOPATCH_VERIFY_BISECT": "0",
          "ROCM_AUTOPATCH_RUNGS": "off"}  # no rungs of an earlier run


def run(args: argparse.Namespace) -> Dict[str, Any]:
    import warnings

    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    import rocm_autopatch

    warnings.filterwarnings("ignore")
    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if args.device == "cuda"
                                                else [])
    wanted = set(args.ops.split(",")) if args.ops else None
    graphs: List[Dict[str, Any]] = []
    raised = collections.Counter()
    began, done_ops, stopped = time.time(), 0, ""
    index, count = (int(n) for n in args.shard.split("/"))
    for position, op in enumerate(op_db):
        if (wanted and op.name not in wanted) or position % count != index:
            continue
        if time.time() - began > args.seconds:
            stopped = f"stopped after {args.seconds} s, at op {op.name}"
            break
        done_ops += 1
        supported = op.supported_dtypes(args.device)
        for dtype in (d for d in dtypes if d in supported):
            try:
                samples = list(op.sample_inputs(args.device, dtype, requires_grad=False))
            except Exception:  # noqa: BLE001 - the database's own
                raised["sample_inputs"] += 1
                continue
            for sample in samples[:args.samples]:
                torch._dynamo.reset()
                before = len(rocm_autopatch.report().verify.get("graphs", []))

                def call(x: Any, *a: Any, _op: Any = op, _kw: Any = sample.kwargs) -> Any:
                    return _op(x, *a, **_kw)

                try:
                    with torch.no_grad():
                        torch.compile(call, dynamic=args.dynamic)(sample.input, *sample.args)
                except Exception as exc:  # noqa: BLE001 - the op's own failure
                    raised[type(exc).__name__] += 1
                    continue
                for g in rocm_autopatch.report().verify.get("graphs", [])[before:]:
                    mismatch = g.get("mismatch") or {}
                    graphs.append({"op": op.name, "dtype": str(dtype).replace("torch.", ""),
                                   "status": g.get("status"), "reason": g.get("reason", ""),
                                   "rule": mismatch.get("rule", ""),
                                   "detail": mismatch.get("detail", ""),
                                   "judge": g.get("judge")})
    statuses = collections.Counter(g["status"] for g in graphs)
    not_checked = collections.Counter(g["reason"][:160] for g in graphs
                                      if g["status"] == "skipped")
    which: Dict[str, List[str]] = collections.defaultdict(list)
    for g in graphs:
        if g["status"] == "skipped":
            which[g["reason"][:160]].append(f"{g['op']} {g['dtype']}")
    return {"device": args.device, "torch": torch.__version__, "dynamic": args.dynamic,
            "ops": done_ops, "graphs": len(graphs), "statuses": dict(statuses),
            "judged_wrong": [g for g in graphs if g["status"] in ("failed", "fell back")],
            "not_checked": dict(not_checked.most_common()),
            "not_checked_ops": dict(which), "raised": dict(raised),
            "stopped": stopped, "seconds": round(time.time() - began, 1),
            "date": time.strftime("%Y-%m-%d")}


def sharded(args: argparse.Namespace) -> Dict[str, Any]:
    """``args.jobs`` shards at once, each its own process; their results merged."""
    import subprocess
    import tempfile

    began = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        argv = [a for i, a in enumerate(sys.argv[1:], 1) if not a.startswith("--jobs")
                and sys.argv[i - 1] != "--jobs"]
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv,
                                   "--jobs", "1", "--shard", f"{k}/{args.jobs}",
                                   "--json", os.path.join(tmp, f"{k}.json")],
                                  stdout=subprocess.DEVNULL)
                 for k in range(args.jobs)]
        for proc in procs:
            proc.wait()
        parts = []
        for k in range(args.jobs):
            try:
                with open(os.path.join(tmp, f"{k}.json")) as fh:
                    parts.append(json.load(fh))
            except (OSError, ValueError):
                parts.append({"stopped": f"shard {k} wrote no result"})
    merged: Dict[str, Any] = {**parts[0], "statuses": {}, "judged_wrong": [],
                              "not_checked": {}, "not_checked_ops": {}, "raised": {},
                              "ops": 0, "graphs": 0,
                              "stopped": "; ".join(p["stopped"] for p in parts
                                                   if p.get("stopped"))}
    for part in parts:
        merged["ops"] += part.get("ops", 0)
        merged["graphs"] += part.get("graphs", 0)
        merged["judged_wrong"] += part.get("judged_wrong", [])
        for key in ("statuses", "not_checked", "raised"):
            for name, n in part.get(key, {}).items():
                merged[key][name] = merged[key].get(name, 0) + n
        for reason, ops in part.get("not_checked_ops", {}).items():
            merged["not_checked_ops"].setdefault(reason, []).extend(ops)
    merged.update(jobs=args.jobs, seconds=round(time.time() - began, 1))
    return merged


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--ops", default="")
    parser.add_argument("--seconds", type=float, default=480)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in FORCED.items()):
        # The sentinel is armed at `import torch` (the .pth): run again with it on.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **FORCED})
    result = sharded(args) if args.jobs > 1 else run(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    for g in result["judged_wrong"]:
        print(f"judged wrong: {g['op']} {g['dtype']}: {g['rule']}: {g['detail'][:200]}")
    for reason, count in result["not_checked"].items():
        ops = ", ".join(result["not_checked_ops"].get(reason, []))
        print(f"not checked ({count}): {reason} [{ops}]")
    print(json.dumps({k: v for k, v in result.items()
                      if k not in ("judged_wrong", "not_checked", "not_checked_ops")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
