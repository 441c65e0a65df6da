"""An UNCHANGED user script: seed 002's manual CUDA-graph workflow around a compiled
function (warm up, capture with a pool, replay). Needs a GPU.

It knows nothing of rocm-autopatch. On torch < 2.10 (ROCm, or with ROCM_AUTOPATCH=force)
the package keeps Dynamo from reading the CUDA RNG state while the graph is captured.
"""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                            torch.nn.Linear(2048, 512)).cuda().half().eval()
compiled = torch.compile(model)
static_in = torch.randn(64, 512, device="cuda", dtype=torch.half)

with torch.no_grad():
    # 1. Warm-up with the exact shapes, on a side stream as torch's docs do it.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(5):
            compiled(static_in)
    torch.cuda.current_stream().wait_stream(side)
    # 2. Capture.
    pool = torch.cuda.graphs.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        static_out = compiled(static_in)
    # 3. Replay with new inputs copied into the captured buffer.
    worst = 0.0
    for _ in range(5):
        x = torch.randn(64, 512, device="cuda", dtype=torch.half)
        static_in.copy_(x)
        graph.replay()
        worst = max(worst, (static_out - model(x)).abs().max().item())
print(f"replays: 5, max abs diff vs eager: {worst:.4f}")
print("equal to eager:", worst < 1e-2)
