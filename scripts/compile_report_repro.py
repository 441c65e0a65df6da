"""What the compile report must see, on any torch release: a deliberate graph break and a
recompile (a new dtype), then the first dtype again (cached).

    ROCM_AUTOPATCH=force ROCM_AUTOPATCH_REPORT=PATH python scripts/compile_report_repro.py [MODE]

MODE: ``limit`` (a second function past a recompile limit of 2), ``fork`` (a plain forked
child recompiles), ``mp`` (a multiprocessing fork child recompiles). Its last stdout line
is JSON about this process. Used by tests/test_compile_report.py; results across torch
2.4.1-2.14.1 in benchmarks/results/compile-report-compat.txt (TESTING.md).
"""

import json
import os
import sys

import torch


def f(x):
    x = x + 1
    torch._dynamo.graph_break()
    return x * 2


g = torch.compile(f)
for dtype in (torch.float32, torch.float64, torch.float32):
    g(torch.ones(4, dtype=dtype))
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "limit":  # more dtypes than the limit set here (its name differs before 2.6)
    config = torch._dynamo.config
    setattr(config, "recompile_limit" if hasattr(config, "recompile_limit")
            else "cache_size_limit", 2)
    h = torch.compile(lambda x: x.sin() + 1)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        h(torch.ones(4, dtype=dtype))
if mode == "fork":
    pid = os.fork()
    if pid == 0:
        g(torch.ones(4, dtype=torch.float16))  # the child's own recompile
        sys.exit(0)  # a plain fork child leaves through the exit handlers
    os.waitpid(pid, 0)
if mode == "mp":
    import multiprocessing as mp

    p = mp.get_context("fork").Process(target=g, args=(torch.ones(4, dtype=torch.float16),))
    p.start()
    p.join()

import atexit  # noqa: E402 - what this process armed, read at the end

import rocm_autopatch.record as record  # noqa: E402

print(json.dumps({"pid": os.getpid(), "armed": record.COMPILE is not None,
                  "loaded": "rocm_autopatch.compile_report" in sys.modules,
                  "atexit": atexit._ncallbacks()}))
sys.exit(int(os.environ.get("EXIT", "0")))
