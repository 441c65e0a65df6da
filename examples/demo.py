"""The demo of the README's first command: unchanged scripts, without and with rocm-autopatch.

    python examples/demo.py

Each run is a child process of its own. ROCm behaviour is forced (ROCM_AUTOPATCH=force)
because this may be a machine without an AMD GPU; on a ROCm build it is what happens anyway.

1. examples/hf_generate.py compiles a Hugging Face model with mode="reduce-overhead", and
   the environment sets TORCHINDUCTOR_MAX_AUTOTUNE=1 (as some container images do): what
   rocm-autopatch changed, from report() in that same process.
2. examples/opt_generate.py with a compiled kernel that computes wrong numbers. The bug is
   injected on purpose with torch's own fault injection (Inductor's
   ``cpp.inject_relu_bug_TESTING_ONLY = "accuracy"``: relu(x) computed as x + 1), standing
   for the silent miscompiles reported on AMD GPUs: without rocm-autopatch, then with
   ROCM_AUTOPATCH_VERIFY=check and =fallback.
3. The README's "When the sentinel warns": each repro directory the fallback run wrote is
   bisected (``rocm-autopatch bisect``: the compiler step named, the fix remembered), and
   the script runs once more: the graphs run compiled again, healed, and checked.
"""

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
# Runs an unchanged script, then says what rocm-autopatch did in that same process.
CHILD = r"""
import json, runpy, sys
if sys.argv[2] == "inject":
    import torch._inductor.config as config
    config.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"  # on purpose: the demo's miscompile
runpy.run_path(sys.argv[1], run_name="__main__")
try:
    import rocm_autopatch
    r = rocm_autopatch.report()
    said = {"active": r.active, "rewrites": [
        "torch.compile(" + ", ".join(f"{k}={v!r}" for k, v in w.before.items()) + ") ran as "
        + (", ".join(f"{k}={v!r}" for k, v in w.after.items()) or "defaults")
        for w in r.compile_rewrites],
            "config": [f"{c.key}={c.after!r}" for c in r.config if c.status == "applied"
                       and c.key.endswith(("max_autotune", "cudagraph_trees"))],
            "verify": (r.verify or {}).get("totals"),
            "healed": sum(bool(g.get("healed")) and g["status"] == "passed"
                          for g in (r.verify or {}).get("graphs", [])),
            "repros": sorted({g["repro"] for g in (r.verify or {}).get("graphs", [])
                              if g.get("repro")})}
except ImportError:
    said = {"active": False}
print("REPORT " + json.dumps(said))
"""


def run(script, env, inject=False):
    proc = subprocess.run([sys.executable, "-c", CHILD, os.path.join(HERE, script),
                           "inject" if inject else "-"], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=HERE, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"demo run failed:\n{proc.stderr[-3000:]}")
    lines = proc.stdout.splitlines()
    tokens = {k: v for k, v in (ln.split(":", 1) for ln in lines if ln.startswith(("eager",
                                                                                  "compiled")))}
    report = json.loads(next(ln for ln in lines if ln.startswith("REPORT "))[7:])
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("rocm-autopatch:")]
    return {k.strip(): v.strip() for k, v in tokens.items()}, report, warnings


def bisect(folder, env):
    proc = subprocess.run([sys.executable, "-m", "rocm_autopatch", "bisect", folder, "--json"],
                          capture_output=True, text=True, env={**os.environ, **env},
                          timeout=1800)
    if proc.returncode not in (0, 1):
        sys.exit(f"bisect failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main():
    print("rocm-autopatch demo (ROCm behaviour forced with ROCM_AUTOPATCH=force)\n", flush=True)
    # Part 3's repros and remembered fixes stay in this run's own directory, removed at the
    # end (each run of the demo had left one in /tmp).
    with tempfile.TemporaryDirectory(prefix="rocm-autopatch-demo-") as work:
        demo(work)


def demo(work):
    hostile = {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}
    first = (("without rocm-autopatch", {"ROCM_AUTOPATCH": "0"}),
             ("with rocm-autopatch", {"ROCM_AUTOPATCH": "force"}))
    fallback = {"ROCM_AUTOPATCH": "force", "ROCM_AUTOPATCH_VERIFY": "fallback",
                "ROCM_AUTOPATCH_VERIFY_DIR": os.path.join(work, "repros"),
                "ROCM_AUTOPATCH_FIXES": os.path.join(work, "fixes.json"),
                "ROCM_AUTOPATCH_VERIFY_BISECT": "0"}  # bisected below, in the foreground
    second = (("without rocm-autopatch", {"ROCM_AUTOPATCH": "0"}),
              ("ROCM_AUTOPATCH_VERIFY=check", {"ROCM_AUTOPATCH": "force",
                                              "ROCM_AUTOPATCH_VERIFY": "check",
                                              "ROCM_AUTOPATCH_VERIFY_DIR": "off"}),
              ("ROCM_AUTOPATCH_VERIFY=fallback", fallback))
    # The five runs are independent processes: run them side by side, print them in order.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        runs = [pool.submit(run, "hf_generate.py", {**hostile, **env}) for _, env in first]
        runs += [pool.submit(run, "opt_generate.py", env, True) for _, env in second]
        results = [job.result() for job in runs]
    print("1. examples/hf_generate.py: torch.compile(mode='reduce-overhead'), with "
          "TORCHINDUCTOR_MAX_AUTOTUNE=1 set")
    for (label, _), (tokens, report, _) in zip(first, results):
        done = ("; ".join(report["rewrites"] + report["config"]) if report["active"] else
                "nothing changed: CUDA graphs and GEMM autotuning as asked")
        print(f"   {label:<22}: tokens {tokens['compiled']}; {done}")
    print("   (on a ROCm GPU the first run is the one that can hang or replay wrong)\n")
    print("2. examples/opt_generate.py with a miscompile INJECTED on purpose (torch's "
          "cpp.inject_relu_bug_TESTING_ONLY)")
    truth = None
    for (label, _), (tokens, _report, warnings) in zip(second, results[len(first):]):
        truth = truth or tokens["eager"]
        right = tokens["compiled"] == truth
        said = sum("numerics:" in w for w in warnings)
        verdict = ("correct: the graphs that differ run eagerly" if right and said else
                   "correct" if right else
                   f"WRONG, and {said} warning(s) name the graph(s)" if said else
                   "WRONG, and nothing says so")
        print(f"   {label:<30}: tokens {tokens['compiled']}  {verdict}")
    print(f"   {'eager (the right answer)':<30}: tokens {truth}")
    repros = results[-1][1]["repros"]
    print(f"\n3. When the sentinel warns: the fallback run wrote {len(repros)} repro "
          "director" + ("y" if len(repros) == 1 else "ies") + f"; `rocm-autopatch bisect "
          f"DIR` on the first ({os.path.basename(repros[0])}), about a minute on a "
          "2-core CPU:")
    result = bisect(repros[0], fallback)
    print(f"   {result['answer']} ({result.get('steps')} runs of repro.py, "
          f"{result.get('seconds', 0):.0f} s); fix remembered: {bool(result['remembered'])}")
    tokens, report, _ = run("opt_generate.py", fallback, True)
    right = "correct" if tokens["compiled"] == truth else "WRONG"
    left = len(report["repros"])
    print(f"   the next run (fallback): tokens {tokens['compiled']}  {right}; "
          f"{report['healed']} graph{'s' if report['healed'] != 1 else ''} compiled with the "
          "remembered fix, checked and run compiled"
          + (f"; {left} still run eagerly (bisect {'it' if left == 1 else 'them'} too)"
             if left else ""))
    print("\n`rocm-autopatch doctor` shows the setup; ROCM_AUTOPATCH_REPORT=PATH writes what "
          "each run did (README).")


if __name__ == "__main__":
    main()
