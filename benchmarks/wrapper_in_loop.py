"""What the sentinel's wrapper costs a call inside a real decode loop, against an earlier
build's (issue 43, item 4): ``scheduled_call_cost.py`` times it in a tight loop, where its
code and data stay in the CPU's caches; between a program's own steps they do not, and
each step of the wrapper costs several times more.

    python benchmarks/wrapper_in_loop.py [--against REV] [--rounds 30] [--tokens 256]
                                         [--json PATH]

In one process, on the CPU (ROCm behaviour forced, ``check``, the default budget):
transformers' Llama, 2 layers of width 128, static KV cache, its forward compiled,
``generate`` of ``--tokens`` tokens after a 16-token prompt. After a warm-up generation,
``--rounds`` rounds of one generation per arm, the order alternating, each arm putting its
own function in place of ``check.call`` (the graph, its schedule and the sentinel's state
shared): ``this build``; ``REV``, the ``check.call`` of commit ``--against``'s
``sentinel/check.py`` (``git show``); ``off``, the compiled call through the disable()
wrapper torch puts around it (still inside the sentinel's outer wrapper, so the
difference is ``check.call``'s own, less that disable() wrapper where ``check.call`` skips
it). Each check arm's
generations include its reads and the sampled checks that fall in them, which add several
us to its per-call mean and make it noisy (``us_a_call_over_off``: the median of the
per-round differences). The figure: the median time of a quiet call (nothing due: the wrapper and
the compiled call), each timed alone, against ``off``'s calls (``quiet_call_us_over_off``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile

from common import CPU_LLAMA, meta, run_arm, save

CHILD = r"""
import importlib.util, json, statistics, sys, time, torch, transformers as t
rounds, tokens, old_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
""" + CPU_LLAMA.format(width=128, dtype="float32") + r"""
import rocm_autopatch
from rocm_autopatch.sentinel import check
spec = importlib.util.spec_from_file_location("check_then", old_path)
then = importlib.util.module_from_spec(spec)
spec.loader.exec_module(then)
arms = {"this build": check.call, "REV": then.call,
        "off": lambda graph, args, kwargs: graph.compiled(*args, **kwargs)}
times = {k: [] for k in arms}
quiet = {k: [] for k in arms}  # each quiet call's seconds (nothing due), the compiled call in
now = None
def timed(graph, args, kwargs):
    plan = graph.schedule
    if plan.calls + 1 >= plan.quiet or graph.pending is not None:
        return arms[now](graph, args, kwargs)
    began = time.perf_counter()
    try:
        return arms[now](graph, args, kwargs)
    finally:
        quiet[now].append(time.perf_counter() - began)
with torch.no_grad():
    model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                   pad_token_id=0)
    for r in range(rounds):
        for k in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            now = k
            check.call = timed
            began = time.perf_counter()
            model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                           do_sample=False, pad_token_id=0)
            times[k].append(time.perf_counter() - began)
over = {k: round(1e6 * statistics.median([a - b for a, b in zip(v, times["off"])]) / tokens, 1)
        for k, v in times.items() if k != "off"}
calls = {k: round(1e6 * (statistics.median(v) - statistics.median(quiet["off"])), 2)
         for k, v in quiet.items() if k != "off"}
print(json.dumps({"quiet_call_us_over_off": calls,
                  "quiet_calls_timed": {k: len(v) for k, v in quiet.items()},
                  "off_quiet_call_us": round(1e6 * statistics.median(quiet["off"]), 1),
                  "us_a_call_over_off": over,
                  "off_us_a_call": round(1e6 * statistics.median(times["off"]) / tokens, 1),
                  "rounds": rounds, "tokens": tokens}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="57add74")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    source = subprocess.run(["git", "show", f"{args.against}:rocm_autopatch/sentinel/check.py"],
                            capture_output=True, text=True, check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py") as old:
        old.write(source)
        old.flush()
        result = run_arm(CHILD, [str(args.rounds), str(args.tokens), old.name],
                         {"ROCM_AUTOPATCH_VERIFY": "check"}, timeout=3600)
    for key in ("us_a_call_over_off", "quiet_call_us_over_off", "quiet_calls_timed"):
        if key in result:
            result[key][args.against] = result[key].pop("REV")
    save(args.json, meta(torch, against=args.against), [result])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
