"""The sentinel in a decode loop (issue 32): transformers' ``generate`` with a static KV cache,
an 8-layer Llama in bf16 (random weights, TinyLlama's widths; ``--layers 22`` is TinyLlama's
1.1B configuration), its forward compiled.

    python benchmarks/decode_loop.py [--arms speed,bug,share,ab] [--rounds 2] [--tokens 256]
                                     [--bug-at 40,200] [--bug-modes check,fallback]
                                     [--layers 8] [--rungs shared] [--json PATH]
                                     [--op-by-op] [--with-at-call]

``speed``: arms ``off`` (ROCM_AUTOPATCH_VERIFY unset) and ``check`` (the default budget),
``--rounds`` rounds interleaved (off, check, off, check...), each its own process with its
own empty Inductor cache, ROCm behaviour forced. Each process generates ``--tokens`` new
tokens ``--generations`` times (3) after one warm-up generation; tokens/s is of those, and
``sentinel_share`` is the sentinel's own measure of its share of the wall time (its sampled
checks, value reads and, since 2026-11-28, its wrapper's time at every call, over the time
since the first warm call, all graphs).

``--with-at-call``: a third arm in each round, ``check_at_call``: ``check`` with every
verdict read at the checked call (as before the deferred verdict, ``sentinel/runs/deferred``).

``share``: the ``check`` arm alone (the sentinel's share, without the speed comparison).
Each ``check`` process also reports its checks past a graph's first call (``checks``: the
call, why, the watched inputs' values, passed) and what the ledger's reads cost by kind
(``ledger_reads``: reads every call, every ``stride`` calls, at a predicted rung).
``--ladder 2``: the ladder's rungs 2x apart, as before issue 43 item 3, to see its cost.
``--rungs shared``: the check processes share one store of remembered rungs
(``ROCM_AUTOPATCH_RUNGS``, ``sentinel/scheduling/rungs.py``) and one Inductor cache (rungs
are kept per cache directory): each after the first starts its ladder where the one before
stopped. By default each process has its own empty store and Inductor cache: a process
with no earlier one.

``ab``: both arms in one process, which removes the process-to-process spread (the same
arm moved up to 1.9x between processes on the lent GPUs): two copies of the model with
the same weights, one compiled through the sentinel's watch (``check``), the other with
Inductor's own ``compile_fx`` (the sentinel never sees it: ``off``); after a warm-up
generation each, ``--rounds`` rounds of one generation each, the order alternating
(off, check; check, off; ...), each timed between synchronisations of the device. The
sentinel's clock counts both copies' time as the program's, so it samples the watched copy
about twice as often as it would alone (a bias against ``check``).

``bug``: the same loop with a miscompile that starts at position p (one per ``--bug-at``),
under each of ``--bug-modes`` (``check``, ``fallback``): Inductor's cosine made wrong where
its argument passes p, which the rotary embedding's angles do from position p on (the first
inverse frequency is 1). Made in what Inductor compiles (a decomposition), as the tests do;
eager is right. (Until 2026-12-05 the cosine was scaled by 1.5 instead of raised by 0.5:
at positions where the cosine is near 0, 831 for one, that error was too small to judge.)
Three generations of ``--tokens`` new tokens each (no warm-up of its own:
the bug may be found in any). Reported: the generation and the position at which it was
found, against issue 43's bound of 1.25p (2p before).
"""

from __future__ import annotations

import argparse
import json
import sys

from common import DECODE_LLAMA, RUNGS_HELP, TIMED_PARTS, meta, run_arm, rungs_store

CHILD = r"""
import json, math, sys, time, torch, transformers as t
tokens, bug_at, layers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if sys.argv[4:] == ["op_by_op"]:  # the references never replayed (as before issue 43)
    from rocm_autopatch.sentinel.runs import replay
    replay.Replays.replayed = lambda self, *a, **k: None
if sys.argv[4:] == ["at_call"]:  # every verdict read at the checked call (never deferred)
    from rocm_autopatch.sentinel import pending
    pending.launch = lambda check: False
if bug_at:
    from torch._inductor import decomposition as d
    def bad_cos(x):  # wrong from position bug_at on: a cosine 0.5 too large (eager is right)
        # (added, not scaled: a 1.5x cosine hid where cos(position) is near 0; on the CPU
        # the 1.5x form at position 831 alone passed every check, cos(831) = -0.049)
        return torch.sin(x + math.pi / 2) + torch.where(x.abs() >= bug_at, 0.5, 0.0)
    d.decompositions[torch.ops.aten.cos.default] = bad_cos
""" + DECODE_LLAMA + r"""
import os
import rocm_autopatch
from rocm_autopatch.sentinel.scheduling import crossings, schedule
if os.environ.get("BENCH_LADDER"):  # --ladder: the rungs' ratio, for a comparison
    schedule.LADDER = crossings.LADDER = float(os.environ["BENCH_LADDER"])
costs = []  # each check's cost to the program beyond its call (ms): what the ledger counts
checked = schedule.Schedule.checked
checks = []  # each check of a graph past its first call: (graph's call, why, values, passed)
def counted(self, why, flat, values, passed, call_seconds, check_seconds, outputs):
    costs.append(round((check_seconds - call_seconds) * 1e3, 2))
    if self.calls > 1:
        checks.append([self.calls, why, {k: round(v) for k, v in values.items()}, passed])
    return checked(self, why, flat, values, passed, call_seconds, check_seconds, outputs)
schedule.Schedule.checked = counted
# what the ledger's reads cost, by kind: (count, ms)
from rocm_autopatch.sentinel.scheduling import integers as _ints, magnitudes as _mags
""" + TIMED_PARTS + r"""
timed_part(_mags.Magnitudes, "measure", "magnitudes_every_stride")
timed_part(_ints.Integers, "read", "integers_every_call")
timed_part(schedule, "crossed", "predicted_crossing_reads")
from rocm_autopatch.sentinel import pending as _pending
timed_part(_pending, "launch", "check_launch")  # the compiled call included
timed_part(_pending, "resolve", "verdict_resolve")
timed_part(_pending, "settle", "settle_calls")  # a pending verdict looked at (its work included)
with torch.no_grad():
    for _ in range(1 if not bug_at else 3):  # a bug: three generations of --tokens
        generate(tokens)
    torch.cuda.synchronize()
    out = {}
    if not bug_at:
        generations = int(os.environ.get("BENCH_GENERATIONS") or 3)
        by_generation = []  # each generation's seconds and the sentinel's part of them
        start = time.perf_counter()
        for _ in range(generations):
            began = time.perf_counter()
            before = schedule.LEDGER.spent + schedule.LEDGER.wrapper
            generate(tokens)
            torch.cuda.synchronize()
            took = time.perf_counter() - began
            spent = schedule.LEDGER.spent + schedule.LEDGER.wrapper - before
            by_generation.append([round(took, 3), round(100 * spent / took, 3)])
        seconds = time.perf_counter() - start
        out["tokens_per_s"] = round(generations * tokens / seconds, 2)
        # (seconds, the checks', reads' and wrapper's percent of them) per generation: the
        # ladder's forced checks fall in the first ones, a long run's steady state after
        out["share_by_generation"] = by_generation
        out["sentinel_share"] = schedule.LEDGER.spent_share()
        # the share's two parts: checks and reads, and the wrapper at every call
        out["ledger_spent_s"] = round(schedule.LEDGER.spent, 4)
        out["ledger_wrapper_s"] = round(schedule.LEDGER.wrapper, 4)
graphs = rocm_autopatch.report().verify.get("graphs", [])
keep = ("graph", "status", "calls", "calls_checked", "checked_because", "period",
        "values_stride", "found_at_call", "found_because", "budget_spent", "reason", "rungs",
        "checks_read_later", "references", "values")
out["graphs"] = [{k: g.get(k) for k in keep} for g in graphs]
out["check_costs_ms"] = costs
out["checks"] = checks
reads = ("integers_every_call", "magnitudes_every_stride", "predicted_crossing_reads")
out["ledger_reads"] = {k: [len(v), round(sum(v) * 1e3, 2)] for k, v in parts.items()
                       if k in reads}
# each part's spread (ms): a one-time cost (pinned memory, a kernel's first launch) shows as
# a first read far above the median
out["parts_ms"] = {k: {"count": len(v), "sum": round(sum(v) * 1e3, 2),
                       "first": [round(x * 1e3, 3) for x in v[:3]],
                       "median": round(sorted(v)[len(v) // 2] * 1e3, 3),
                       "max": round(max(v) * 1e3, 3)} for k, v in parts.items() if v}
print(json.dumps(out))
"""

AB_CHILD = r"""
import copy, json, statistics, sys, time, torch, transformers as t
tokens, layers, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
import torch._inductor.compile_fx as cfx
from rocm_autopatch import patching
from rocm_autopatch.sentinel.scheduling import schedule
assert patching.ours(cfx.compile_fx), "the sentinel's watch is not installed"
unwatched = patching.original_of(cfx.compile_fx)
torch.manual_seed(0)
cfg = t.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                    num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4,
                    max_position_embeddings=2048)
with torch.device("cuda"):
    models = {"check": t.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()}
models["off"] = copy.deepcopy(models["check"])
for m in models.values():
    m.generation_config.cache_implementation = "static"
    m.generation_config.disable_compile = True
# Both copies are recompiles of one frame (LlamaForCausalLM.forward): pinned static, so
# that Dynamo's shared automatic-dynamic state cannot give them graphs of another kind.
models["check"].forward = torch.compile(models["check"].forward, dynamic=False)
models["off"].forward = torch.compile(models["off"].forward, dynamic=False,
                                      backend=lambda gm, example: unwatched(gm, example))
prompt = torch.randint(0, cfg.vocab_size, (1, 16), device="cuda")
def generate(arm):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = models[arm].generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                               do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return out, tokens / (time.perf_counter() - start)
speed = {"off": [], "check": []}
seconds = {"off": 0.0, "check": 0.0}
with torch.no_grad():
    warm = {arm: generate(arm)[0][0, 16:] for arm in ("off", "check")}  # warm-up
    differ = (warm["off"] != warm["check"]).nonzero()
    first_difference = int(differ[0]) if len(differ) else -1  # in the new tokens
    for r in range(rounds):
        for arm in (("off", "check") if r % 2 == 0 else ("check", "off")):
            rate = generate(arm)[1]
            speed[arm].append(round(rate, 2))
            seconds[arm] += tokens / rate
import rocm_autopatch
graphs = rocm_autopatch.report().verify.get("graphs", [])
keep = ("graph", "status", "calls", "calls_checked", "checked_because", "period",
        "checks_read_later", "references")
print(json.dumps({"tokens_per_s": speed, "first_different_token": first_difference,
                  "ratio_of_medians": round(statistics.median(speed["check"])
                                            / statistics.median(speed["off"]), 4),
                  "ratio_of_means": round(sum(speed["check"]) / sum(speed["off"]), 4),
                  # the ledger's clock runs through both arms' generations: its share of
                  # all of them, and its seconds over the watched arm's own
                  "sentinel_share": schedule.LEDGER.spent_share(),
                  "sentinel_seconds_over_check_time": round(
                      (schedule.LEDGER.spent + schedule.LEDGER.wrapper) / seconds["check"],
                      5),
                  "graphs": [{k: g.get(k) for k in keep} for g in graphs]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arms", default="speed,bug")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--bug-at", default="40,200")
    parser.add_argument("--bug-modes", default="check")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--op-by-op", action="store_true",
                        help="the check arms never replay their references as a device "
                             "graph (as before issue 43)")
    parser.add_argument("--with-at-call", action="store_true",
                        help="a third arm per round: check with every verdict read at the "
                             "checked call (never deferred)")
    parser.add_argument("--ladder", default="",
                        help="the check arms' ladder ratio (1.25 by default; 2 as before "
                             "issue 43 item 3), to measure what the ladder costs")
    parser.add_argument("--generations", type=int, default=3,
                        help="timed generations per check or off process (after one "
                             "warm-up); each one's share is reported: a long run's steady "
                             "state, past the ladder's forced checks")
    parser.add_argument("--rungs", default="", help=RUNGS_HELP)
    parser.add_argument("--json")
    args = parser.parse_args()
    extra = ["op_by_op"] if args.op_by_op else []
    rungs = rungs_store(args.rungs)
    arms = args.arms.split(",")
    results = []
    if "speed" in arms or "share" in arms:
        pairs = (("off", ""), ("check", "check")) if "speed" in arms else (("check", "check"),)
        if args.with_at_call:
            pairs += (("check_at_call", "check"),)
        for r in range(args.rounds):
            for arm, verify in pairs:
                variant = ["at_call"] if arm == "check_at_call" else extra
                got = run_arm(CHILD, [str(args.tokens), "0", str(args.layers), *variant],
                              {"ROCM_AUTOPATCH_VERIFY": verify, "BENCH_LADDER": args.ladder,
                               "BENCH_GENERATIONS": str(args.generations), **rungs},
                              timeout=900)
                results.append({"arm": arm, "round": r, **got})
                print(json.dumps(results[-1]), flush=True)
        off = [x["tokens_per_s"] for x in results if x["arm"] == "off" and "tokens_per_s" in x]
        on = [x["tokens_per_s"] for x in results if x["arm"] == "check" and "tokens_per_s" in x]
        if off and on:
            print(f"tokens/s off {off}, check {on}: check/off "
                  f"{sum(on) / len(on) / (sum(off) / len(off)):.4f}")
        at_call = [x["tokens_per_s"] for x in results if x["arm"] == "check_at_call"
                   and "tokens_per_s" in x]
        if off and at_call:
            print(f"tokens/s check_at_call {at_call}: check_at_call/off "
                  f"{sum(at_call) / len(at_call) / (sum(off) / len(off)):.4f}")
    if "ab" in arms:
        got = run_arm(AB_CHILD, [str(args.tokens), str(args.layers), str(args.rounds)],
                      {"ROCM_AUTOPATCH_VERIFY": "check"}, timeout=900)
        results.append({"arm": "ab", **got})
        print(json.dumps(results[-1]), flush=True)
    if "bug" in arms:
        for p in (int(v) for v in args.bug_at.split(",")):
            for how in args.bug_modes.split(","):
                got = run_arm(CHILD, [str(args.tokens), str(p), str(args.layers), *extra],
                              {"ROCM_AUTOPATCH_VERIFY": how}, timeout=900)
                found = [g for g in got.get("graphs", []) if g.get("found_at_call")]
                # the decode graph's call k (from 1) runs position 16 + (k - 1) mod (n - 1)
                # of generation (k - 1) div (n - 1): 16 prompt tokens, the prefill makes
                # the first of the n new tokens
                steps = args.tokens - 1
                where = [(1 + (g["found_at_call"] - 1) // steps,
                          16 + (g["found_at_call"] - 1) % steps)
                         for g in found if g["calls"] > 1]
                results.append({"arm": "bug", "mode": how, "bug_at": p,
                                "found_at_generation_position": where, **got})
                print(json.dumps(results[-1]), flush=True)
                print(f"bug from position {p} under {how}: found at (generation, position) "
                      f"{where} (bound {1.25 * p:g})")
    if args.json:
        with open(args.json, "w") as fh:
            import torch

            json.dump({**meta(torch, tokens=args.tokens, layers=args.layers),
                       "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
