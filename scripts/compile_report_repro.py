"""What the compile report must see, on any torch release: a deliberate graph break and a
recompile (a new dtype), then the first dtype again (cached).

    ROCM_AUTOPATCH=force ROCM_AUTOPATCH_REPORT=PATH python scripts/compile_report_repro.py [MODE]

MODE: ``limit`` (a second function past a recompile limit of 2), ``fork`` (a plain forked
child recompiles), ``mp`` (a multiprocessing fork child recompiles), ``forkserver`` (a
multiprocessing forkserver child compiles), ``fork_late`` (a child forked before torch is
imported imports it and compiles), ``kinds`` (every kind of graph break and recompile:
a data-dependent branch, print, untraceable calls, a break in a nested function,
``graph_break()``; recompiles on dtype, shape, an int argument and a global), ``train`` (a
training step: the backward is compiled at the first ``backward()``), ``nothing`` (imports
torch, compiles nothing: a launcher). ``EXTRA=1``: one more recompile in this process.
Its last stdout line is JSON about this process. Used by tests/reporting/test_compile_report.py
(which holds the report to ``TORCH_LOGS=graph_breaks,recompiles`` of the same run);
results across torch releases in benchmarks/results/compile-report-compat.txt (TESTING.md).
"""

import json
import os
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else ""
if MODE == "fork_late" and os.fork() == 0:
    import torch  # first imported in the child

    torch.compile(lambda x: x.cos() * 2)(torch.ones(4))
    sys.exit(0)

import torch  # noqa: E402


def f(x):
    x = x + 1
    torch._dynamo.graph_break()
    return x * 2


def child_work():
    torch.compile(lambda x: x.sin() * 3)(torch.ones(4))


g = torch.compile(f)
if MODE not in ("kinds", "train", "forkserver", "nothing"):
    for dtype in (torch.float32, torch.float64, torch.float32):
        g(torch.ones(4, dtype=dtype))
    if os.environ.get("EXTRA"):  # one more recompile in this process only (a diverging rank)
        g(torch.ones(4, dtype=torch.float16))
if MODE == "limit":  # more dtypes than the limit set here (its name differs before 2.6)
    config = torch._dynamo.config
    setattr(config, "recompile_limit" if hasattr(config, "recompile_limit")
            else "cache_size_limit", 2)
    h = torch.compile(lambda x: x.sin() + 1)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        h(torch.ones(4, dtype=dtype))
if MODE == "fork":
    pid = os.fork()
    if pid == 0:
        g(torch.ones(4, dtype=torch.float16))  # the child's own recompile
        sys.exit(0)  # a plain fork child leaves through the exit handlers
    os.waitpid(pid, 0)
if MODE == "mp":
    import multiprocessing as mp

    p = mp.get_context("fork").Process(target=g, args=(torch.ones(4, dtype=torch.float16),))
    p.start()
    p.join()
if MODE == "forkserver" and __name__ == "__main__":
    import multiprocessing as mp

    p = mp.get_context("forkserver").Process(target=child_work)
    p.start()
    p.join()
if MODE == "fork_late":
    os.wait()
if MODE == "kinds":
    import time
    import zlib

    def branch(x):
        if x.sum() > 0:  # data-dependent
            return x * 2
        return x - 1

    def printing(x):
        print("tracing", file=sys.stderr)
        return x + 1

    def untraceable(x):
        t = time.time()
        c = zlib.crc32(b"x")
        return x * (t > 0) + c * 0

    def inner(x):
        torch._dynamo.graph_break()
        return x + 2

    def nested(x):
        return inner(x * 3) - 1

    def scale(x, n):
        return x * n

    FACTOR = 2.0

    def uses_global(x):
        return x * FACTOR

    for fn in (branch, printing, untraceable, nested):
        torch.compile(fn)(torch.ones(4))
    compiled = torch.compile(branch)
    compiled(torch.ones(4, dtype=torch.float64))  # dtype recompile (both frames)
    shaped = torch.compile(lambda x: x.cos())
    shaped(torch.ones(4))
    shaped(torch.ones(8))  # shape recompile
    scaled = torch.compile(scale)
    scaled(torch.ones(4), 2)
    scaled(torch.ones(4), 3)  # int-argument recompile
    glob = torch.compile(uses_global)
    glob(torch.ones(4))
    FACTOR = 3.0
    glob(torch.ones(4))  # global recompile
if MODE == "train":
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1))
    step = torch.compile(model)
    for _ in range(2):
        step(torch.randn(8, 16)).sum().backward()

if __name__ == "__main__":  # not when a forkserver preloads this module
    import atexit  # what this process armed, read at the end

    import rocm_autopatch.record as record

    metrics = getattr(torch._dynamo.utils, "_compilation_metrics", ())
    print(json.dumps({"pid": os.getpid(), "armed": record.COMPILE is not None,
                      "loaded": "rocm_autopatch.reporting.collector" in sys.modules,
                      "atexit": atexit._ncallbacks(),
                      # torch's own record of the backward compiles
                      "torch_backward_compiles": sum(getattr(m, "is_forward", True) is False
                                                     for m in metrics)}))
    sys.exit(int(os.environ.get("EXIT", "0")))
