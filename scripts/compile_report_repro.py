"""The compile report across torch releases: a graph break, dtype recompiles, and a frame
past the recompile limit (set to 2). Run with ROCM_AUTOPATCH=force ROCM_AUTOPATCH_REPORT=PATH;
results of 2.4.1-2.14.1 in benchmarks/results/compile-report-compat.txt (TESTING.md)."""
import torch


def f(x):
    x = x + 1
    torch._dynamo.graph_break()
    return x * 2


g = torch.compile(f)
for dtype in (torch.float32, torch.float64, torch.float32):
    g(torch.ones(4, dtype=dtype))
cfg = torch._dynamo.config
setattr(cfg, "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit", 2)
h = torch.compile(lambda x: x.sin() + 1)
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
    h(torch.ones(4, dtype=dtype))
