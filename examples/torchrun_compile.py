"""An UNCHANGED user script for `torchrun --nproc-per-node N`: each rank compiles a small
model with mode="reduce-overhead", all-reduces its output and checks it against eager.

It knows nothing of rocm-autopatch; every rank's Python runs the .pth. Needs GPUs + NCCL.
"""

import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)  # the same weights on every rank
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                            torch.nn.Linear(1024, 256)).cuda().eval()
compiled = torch.compile(model, mode="reduce-overhead")
x = torch.randn(32, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(rank))
with torch.no_grad():
    for _ in range(3):
        out = compiled(x)
    ref = model(x)
diff = torch.tensor([(out - ref).abs().max().item()], device="cuda")
dist.all_reduce(diff, op=dist.ReduceOp.MAX)
total = out.clone()
dist.all_reduce(total)
if rank == 0:
    print(f"world {world}: max abs diff vs eager over ranks {diff.item():.2e}; "
          f"all-reduced sum {total.sum().item():.4f}")
    print("equal to eager:", diff.item() < 1e-4)
dist.destroy_process_group()
