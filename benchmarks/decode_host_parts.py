"""Where a decode loop's host time goes under ``check``, part by part, unsynchronised (issue
43, item 4): what each part of the sentinel costs the program's thread as the program runs
it, not between synchronisations (``decode_check_profile.py`` times a check's steps apart).

    python benchmarks/decode_host_parts.py [--tokens 256] [--layers 8] [--profile] [--json PATH]

The 8-layer Llama of ``decode_loop.py`` (static KV cache, bf16), ``check``, ROCm behaviour
forced: one generation (the ladder's checks, its deferred verdicts), then three timed ones.
Each part listed in ``PARTS`` is wrapped with a clock (about 1 us a call of its own, so a
part called at every call reads a little high); per part: calls, total ms, median ms, and
each call's ms where there are at most 20. ``per_call_us``: what the sentinel's wrapper of
the decode graph costs each call beyond the compiled call itself, in the timed generations,
the part of it that is the ledger's value reads, the rest (``outside_the_ledger``: the
ledger did not count it before 2026-11-28) and what the ledger now counts as the wrapper's
(``ledger_wrapper``: measured by ``check.call`` itself, without the parts' clocks).
``verdict_reads``: the reads back from the device (``tolist``, ``item``, ``nonzero``) while a
verdict read later is judged, each waiting for the judge's device work queued before it;
``verdict_device_ms``: each such verdict's span on the sentinel's stream (events at its
start and end), to hold against its host time (``compare.judged``).
"""

from __future__ import annotations

import argparse
import json

from common import DECODE_LLAMA, TIMED_PARTS, meta, run_arm, save

CHILD = r"""
import json, os, statistics, sys, time, torch, transformers as t
tokens, layers = int(sys.argv[1]), int(sys.argv[2])
""" + DECODE_LLAMA + r"""
import rocm_autopatch
from rocm_autopatch.guards import capture
from rocm_autopatch.sentinel import check, compare, pending, regions
from rocm_autopatch.sentinel.judging import judge
from rocm_autopatch.sentinel.runs import deferred, graph as graph_mod, replay, snapshot
from rocm_autopatch.sentinel.scheduling import integers, magnitudes, schedule
""" + TIMED_PARTS + r"""
PARTS = [(check, "call"), (capture, "capturing"), (schedule.Schedule, "due"),
         (check.Check, "too_large"), (check.Check, "not_copied"),
         (snapshot.Snapshot, "__init__"), (replay.Replays, "ready"), (replay.Captured, "run"),
         (pending, "launch"), (deferred.Later, "launch"), (pending, "resolve"),
         (compare, "judged"), (regions, "written_regions"), (judge, "statistics"),
         (judge, "_equal"), (magnitudes.Magnitudes, "measure"), (magnitudes.Magnitudes, "now"),
         (integers.Integers, "read"), (schedule, "crossed"), (torch.Tensor, "tolist"),
         (torch.Tensor, "nonzero")]
READS = ("Magnitudes.measure", "crossed", "Integers.read")
for owner, name in PARTS:
    timed_part(owner, name, f"{getattr(owner, '__name__', '').split('.')[-1]}.{name}")
# Inside a verdict read later: the time its reads back from the device take (each waits for
# the judge's device work queued before it), and the device time from the verdict's start
# to its end on the sentinel's stream (events), against the host time of the whole verdict.
inside = {"depth": 0}
def verdict_read(owner, name):
    inner = getattr(owner, name)
    def wrapper(*a, **k):
        if not inside["depth"]:
            return inner(*a, **k)
        began = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            parts.setdefault("verdict_reads", []).append(time.perf_counter() - began)
    setattr(owner, name, wrapper)
for name in ("tolist", "item", "nonzero"):
    verdict_read(torch.Tensor, name)
spans = []
resolving = pending.resolve
def resolve_spanned(*a, **k):
    ends = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    inside["depth"] += 1
    judged = compare.judged
    def judged_spanned(*x, **y):  # on the sentinel's stream (``Later.judging``)
        ends[0].record()
        try:
            return judged(*x, **y)
        finally:
            ends[1].record()
            spans.append(ends)
    compare.judged = judged_spanned
    try:
        return resolving(*a, **k)
    finally:
        compare.judged = judged
        inside["depth"] -= 1
pending.resolve = resolve_spanned
profiles = {}  # --profile: the first generation's launches and verdict reads, by function
unprofiled = []  # what the profiler wrapped: put back after the first generation
if os.environ.get("BENCH_PROFILE"):
    import cProfile, pstats
    def profiled(owner, name):
        inner, prof = getattr(owner, name), cProfile.Profile()
        profiles[name] = prof
        unprofiled.append((owner, name, inner))
        def wrapper(*a, **k):
            prof.enable()
            try:
                return inner(*a, **k)
            finally:
                prof.disable()
        setattr(owner, name, wrapper)
    profiled(pending, "launch")
    profiled(pending, "resolve")
def top(prof, n=30):  # (function, calls, own ms, with callees ms), by own time
    rows = pstats.Stats(prof).stats.items()
    rows = sorted(rows, key=lambda kv: -kv[1][2])[:n]
    return [[f"{f[0].split('/site-packages/')[-1]}:{f[1]}:{f[2]}", v[1], round(v[2] * 1e3, 2),
             round(v[3] * 1e3, 2)] for f, v in rows]
made = graph_mod.Graph.__init__
def clocked(inner):  # the compiled call alone, to take from the wrapper's
    def compiled(*x, **y):
        began = time.perf_counter()
        try:
            return inner(*x, **y)
        finally:
            parts.setdefault("compiled", []).append(time.perf_counter() - began)
    return compiled
def timed_compiled(self, *a, **k):
    made(self, *a, **k)
    self.compiled = clocked(self.compiled)
    if getattr(self, "bare", None) is not None:  # since 99bb255 a quiet call runs the
        self.bare = (clocked(self.bare[0]), self.bare[1])  # function inside disable()
graph_mod.Graph.__init__ = timed_compiled
def summary(found):
    return {k: [len(v), round(sum(v) * 1e3, 3), round(statistics.median(v) * 1e3, 3)]
            + ([[round(x * 1e3, 2) for x in v]] if len(v) <= 20 else [])
            for k, v in sorted(found.items(), key=lambda kv: -sum(kv[1]))}
with torch.no_grad():
    generate(tokens)
    torch.cuda.synchronize()
    first = dict(parts)
    parts.clear()
    for owner, name, inner in unprofiled:  # the timed generations run without the profiler
        setattr(owner, name, inner)
    wrapper = schedule.LEDGER.wrapper
    start = time.perf_counter()
    for _ in range(3):
        generate(tokens)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
verdict_device_ms = [round(a.elapsed_time(b), 3) for a, b in spans]  # every one, in order
calls = len(parts["check.call"])
beyond = sum(parts["check.call"]) - sum(parts["compiled"])
reads = sum(sum(parts.get(k, [])) for k in READS)
print(json.dumps({"timed_seconds": round(wall, 3), "wall_ms_per_call": round(wall / calls * 1e3, 3),
                  "per_call_us": {"beyond_the_compiled_call": round(beyond / calls * 1e6, 1),
                                  "ledger_reads": round(reads / calls * 1e6, 1),
                                  "outside_the_ledger": round((beyond - reads) / calls * 1e6, 1),
                                  "ledger_wrapper": round((schedule.LEDGER.wrapper - wrapper)
                                                          / calls * 1e6, 1)},
                  "sentinel_share": schedule.LEDGER.spent_share(),
                  "first_generation_ms": summary(first), "timed_ms": summary(parts),
                  "verdict_device_ms": verdict_device_ms,
                  "profile_first_generation": {k: top(v) for k, v in profiles.items()}}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the first generation's check launches and verdict "
                             "reads: each one's 30 costliest functions by their own time")
    parser.add_argument("--json")
    args = parser.parse_args()
    got = run_arm(CHILD, [str(args.tokens), str(args.layers)],
                  {"ROCM_AUTOPATCH_VERIFY": "check", "BENCH_PROFILE": "1" if args.profile
                   else ""}, timeout=900)
    import torch

    save(args.json, meta(torch, tokens=args.tokens, layers=args.layers), [got])
    print(json.dumps(got.get("per_call_us", got)))
    return 0 if "per_call_us" in got else 1


if __name__ == "__main__":
    raise SystemExit(main())
