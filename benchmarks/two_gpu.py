"""A real two-rank job (issue 35): the sentinel, the caches and the job view over NCCL.

    python benchmarks/two_gpu.py [--json PATH] [--arms ddp,fsdp2,tp,cache,report] [--steps 4]

Each arm is ``torchrun --standalone --nproc-per-node 2`` on this file's worker (NCCL on two
GPUs; gloo on the CPU, where it is checked before a GPU is spent), ROCm behaviour forced, a
Llama-class model from transformers (random weights, bf16 on the GPU) under
``torch.compile``, run in a session of its own and killed with every rank past its limit:
"hung" is a result, never a wait. The arms:

- ``ddp``: DistributedDataParallel training steps, the sentinel off, under ``check`` and
  ``fallback`` with a miscompile on rank 1 only (SiLU's decomposition 20% too large there,
  injected on purpose), and under ``check`` with rank 1 short of GPU memory for its checks
  (a tensor holds all but a little of its free memory). The losses and gradient norms of
  every step, per rank, against the sentinel off (``check``) and against eager (``fallback``,
  the buggy rank running the wrong graph eagerly).
- ``fsdp2``: the same training with FSDP2 (``fully_shard`` per decoder layer), the bug on
  rank 1: eager, the sentinel off, ``fallback``.
- ``tp``: tensor-parallel inference (``torch.distributed.tensor.parallel``), whose compiled
  graphs hold functional collectives: listed as not compared on both ranks, nothing hangs.
- ``cache``: the same job twice with one ``ROCM_AUTOPATCH_CACHE`` and a fresh ``TMPDIR``
  each: Inductor's FX-graph cache hits per rank, each rank's first-call seconds and how long
  it waited for the other's compile (issue 34); then cold with rocm-autopatch off.
- ``report``: ``ROCM_AUTOPATCH_REPORT=DIR/{rank}.json`` over the ``check`` job with the bug,
  then ``rocm-autopatch doctor --report DIR/*.json --json``: both ranks, verdicts, hits,
  divergence flagged.

The lent machine's NVLink multicast variables (NCCL_NVLS_ENABLE=0 ...) are kept: the ranks
inherit this environment. Prints one JSON line per arm and writes them all with ``--json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.abspath(__file__)
LIMIT = 300  # seconds an arm's job may run before it counts as hung


# ---- the ranks ---------------------------------------------------------------------------

def _setup() -> tuple:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    return torch, dist, device, (torch.bfloat16 if cuda else torch.float32)


def _inject(rank: int) -> None:
    """A miscompile on the ranks that ask for it: SiLU's decomposition 20% too large (what
    Inductor lowers; eager is untouched), with the caches of that rank its own."""
    if str(rank) not in os.environ.get("TWO_GPU_BUG_RANKS", "").split(","):
        return
    import torch
    from torch._inductor import decomposition as d

    d.decompositions[torch.ops.aten.silu.default] = lambda x: x * torch.sigmoid(x) * 1.2


def _llama(torch: Any, device: Any, dtype: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    big = device.type == "cuda"
    cfg = LlamaConfig(vocab_size=32000 if big else 512, hidden_size=1024 if big else 128,
                      intermediate_size=2816 if big else 352, num_hidden_layers=4 if big else 2,
                      num_attention_heads=8 if big else 4, num_key_value_heads=8 if big else 4,
                      max_position_embeddings=1024)
    torch.manual_seed(0)  # the same weights on every rank
    return LlamaForCausalLM(cfg).to(device, dtype), cfg


def _hog(torch: Any, device: Any, leave: int) -> Optional[Any]:
    """All of this GPU's free memory but ``leave`` bytes, held (the rank short of memory)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return torch.empty(max(free - leave, 0), dtype=torch.uint8, device=device)


def _verify_graphs() -> List[Dict[str, Any]]:
    import rocm_autopatch

    return [{k: g.get(k) for k in ("graph", "status", "reason", "checks_skipped",
                                   "skipped_reason", "calls_checked")}
            for g in (rocm_autopatch.report().verify or {}).get("graphs", [])]


def _whole(grad: Any) -> Any:
    """A gradient as one tensor (FSDP2's are sharded DTensors: gathered, on every rank)."""
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def worker_ddp(steps: int) -> Dict[str, Any]:
    torch, dist, device, dtype = _setup()
    rank = dist.get_rank()
    _inject(rank)
    model, cfg = _llama(torch, device, dtype)
    short = str(rank) in os.environ.get("TWO_GPU_SHORT_RANKS", "").split(",")
    hog, left = None, None
    if os.environ.get("TWO_GPU_WRAP") == "fsdp2":  # each decoder layer, then the root
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        wrapped = fully_shard(model)
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    run = wrapped if os.environ.get("TWO_GPU_EAGER") == "1" else torch.compile(wrapped)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    losses, norms, first = [], [], None
    for step in range(steps):
        if step == 1 and short and device.type == "cuda":
            # After the first step the allocator holds what the program needs; all but
            # 512 MiB of the rest is taken, so this rank's later checks do not fit.
            hog = _hog(torch, device, 2**29)
            left = round(torch.cuda.mem_get_info(device)[0] / 2**30, 2)
        gen = torch.Generator().manual_seed(1000 * step + rank)
        ids = torch.randint(0, cfg.vocab_size, (4, 256), generator=gen).to(device)
        began = time.perf_counter()
        loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        if first is None:
            if device.type == "cuda":
                torch.cuda.synchronize()
            first = time.perf_counter() - began
        norm = torch.sqrt(sum(_whole(p.grad).float().pow(2).sum() for p in model.parameters()))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(float(loss), 6))
        norms.append(round(float(norm), 6))
    # Collectives still paired afterwards: one more all-reduce gives the world size.
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    out = {"rank": rank, "losses": losses, "grad_norms": norms, "first_step_s": round(first, 2),
           "paired_after": int(probe.item()), "graphs": _verify_graphs(),
           "free_gib_for_checks": left, "held_gib": None if hog is None else round(
               hog.numel() / 2**30, 1)}
    dist.barrier()
    dist.destroy_process_group()
    return out


def worker_tp() -> Dict[str, Any]:
    torch, dist, device, dtype = _setup()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)
    width = 1024 if device.type == "cuda" else 128
    mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.SiLU(),
                              torch.nn.Linear(4 * width, width)).to(device, dtype)
    reference = torch.nn.Sequential(*[m for m in mlp]).to(device, dtype)
    reference.load_state_dict(mlp.state_dict())
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(8, width, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    with torch.no_grad():
        compiled = torch.compile(mlp)
        got = [compiled(x) for _ in range(3)][-1]
        expect = reference(x)
    diff = float((got.float() - expect.float()).abs().max())
    out = {"rank": rank, "max_abs_diff_vs_unsharded": diff, "graphs": _verify_graphs()}
    dist.barrier()
    dist.destroy_process_group()
    return out


def worker_cache() -> Dict[str, Any]:
    torch, dist, device, dtype = _setup()
    from torch._dynamo.utils import counters

    rank = dist.get_rank()
    model, cfg = _llama(torch, device, dtype)
    model.eval()
    compiled = torch.compile(model)
    ids = torch.randint(0, cfg.vocab_size, (1, 128), generator=torch.Generator().manual_seed(2))
    ids = ids.to(device)
    dist.barrier()
    began = time.perf_counter()
    with torch.no_grad():
        logits = compiled(input_ids=ids).logits
    if device.type == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - began
    with torch.no_grad():
        eager = model(input_ids=ids).logits
    out = {"rank": rank, "first_call_s": round(first, 2),
           "fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
           "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
           "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
           "max_abs_diff_vs_eager": float((logits.float() - eager.float()).abs().max()),
           "logits_sum": float(logits.float().sum()),
           "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}
    once = sys.modules.get("rocm_autopatch.config.compile_once")  # a job of ranks: installed
    out["compile_once_waits"] = [round(w, 2) for w in once.WAITS] if once else None
    dist.barrier()
    dist.destroy_process_group()
    return out


def worker(arm: str, steps: int) -> None:
    """One rank: its result as one JSON line on stdout and, where the driver asks
    (``TWO_GPU_OUT``), in a file of its own (the ranks' lines can run together on a pipe)."""
    found = {"ddp": lambda: worker_ddp(steps), "tp": worker_tp, "cache": worker_cache}[arm]()
    print(json.dumps(found), flush=True)
    folder = os.environ.get("TWO_GPU_OUT")
    if folder:
        with open(os.path.join(folder, f"rank{found['rank']}.json"), "w") as fh:
            json.dump(found, fh)


# ---- the driver --------------------------------------------------------------------------

def _read(path: str) -> Dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def job(arm: str, steps: int, limit: int = LIMIT, **env: str) -> Dict[str, Any]:
    """One torchrun job in a session of its own; killed with its ranks past ``limit``."""
    ours = {k: v for k, v in os.environ.items()
            if not k.startswith(("ROCM_AUTOPATCH", "TORCHINDUCTOR_", "INDUCTOR_", "TWO_GPU"))}
    folder = tempfile.mkdtemp(prefix="ranks-")
    full = {**ours, "ROCM_AUTOPATCH": "force", "PYTHONUNBUFFERED": "1", "TWO_GPU_OUT": folder,
            "ROCM_AUTOPATCH_RUNGS": "off", **env}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", HERE, "--worker", arm, "--steps", str(steps)]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full, start_new_session=True, cwd=tempfile.gettempdir())
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return {"hung": True, "seconds": round(time.perf_counter() - began, 1),
                "stderr": err[-1500:]}
    said = [ln for ln in err.splitlines() if "rocm-autopatch" in ln]
    errors = [ln for ln in err.splitlines() if "Error" in ln and "elastic" not in ln]
    return {"hung": False, "rc": proc.returncode, "seconds": round(time.perf_counter() - began, 1),
            "ranks": [_read(os.path.join(folder, name)) for name in sorted(os.listdir(folder))],
            "rocm_autopatch_lines": said[:12],
            "errors": errors[-6:] if proc.returncode else []}


def _own_caches(work: str, name: str) -> Dict[str, str]:
    """Inductor's caches of this job alone (the injected bug is not in their keys); Triton's
    binaries shared (keyed by the kernel's source, which the bug changes)."""
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(work, name, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(work, "triton")}


def arm_fsdp2(work: str, steps: int) -> List[Dict[str, Any]]:
    """FSDP2 (``fully_shard`` per decoder layer): the bug on rank 1, off, eager, fallback."""
    bug = {"TWO_GPU_BUG_RANKS": "1", "TWO_GPU_WRAP": "fsdp2"}
    results = []
    for i, (name, env) in enumerate((
            ("eager, bug on rank 1 (the right answer)", {"TWO_GPU_EAGER": "1"}),
            ("off, bug on rank 1", {}),
            ("fallback, bug on rank 1", {"ROCM_AUTOPATCH_VERIFY": "fallback",
                                         "ROCM_AUTOPATCH_VERIFY_BISECT": "0"}))):
        found = job("ddp", steps, **_own_caches(work, f"fsdp{i}"), **bug, **env,
                    ROCM_AUTOPATCH_VERIFY_DIR=os.path.join(work, f"fsdp-repros{i}"))
        results.append({"arm": f"fsdp2: {name}", **found})
        print(json.dumps(results[-1])[:3000], flush=True)
    return results


def arm_ddp(work: str, steps: int, only: str = "") -> List[Dict[str, Any]]:
    bug = {"TWO_GPU_BUG_RANKS": "1"}
    runs = [("off, no bug", {}), ("eager, bug on rank 1 (the right answer)",
                                  {**bug, "TWO_GPU_EAGER": "1"}),
            ("off, bug on rank 1", bug),
            ("check, bug on rank 1", {**bug, "ROCM_AUTOPATCH_VERIFY": "check"}),
            ("fallback, bug on rank 1", {**bug, "ROCM_AUTOPATCH_VERIFY": "fallback",
                                         "ROCM_AUTOPATCH_VERIFY_BISECT": "0"}),
            ("check, the first 3 calls, rank 1 short of memory from step 2",
             {"ROCM_AUTOPATCH_VERIFY": "check", "ROCM_AUTOPATCH_VERIFY_CALLS": "3",
              "TWO_GPU_SHORT_RANKS": "1"})]
    results = []
    for i, (name, env) in enumerate(runs):
        if only not in name:
            continue
        found = job("ddp", steps, **_own_caches(work, f"ddp{i}"),
                    ROCM_AUTOPATCH_VERIFY_DIR=os.path.join(work, f"repros{i}"), **env)
        results.append({"arm": f"ddp: {name}", **found})
        print(json.dumps(results[-1])[:3000], flush=True)
    return results


def arm_tp(work: str, steps: int) -> List[Dict[str, Any]]:
    found = {"arm": "tp: check", **job("tp", steps, **_own_caches(work, "tp"),
                                         ROCM_AUTOPATCH_VERIFY="check")}
    print(json.dumps(found)[:3000], flush=True)
    return [found]


def arm_cache(work: str, steps: int) -> List[Dict[str, Any]]:
    """Cold and warm with one ``ROCM_AUTOPATCH_CACHE`` (the ranks compile each graph once:
    ``config/compile_once.py``), then cold with rocm-autopatch off (each rank compiles)."""
    root, results = os.path.join(work, "mounted-cache"), []
    for name in ("cold", "warm", "cold, rocm-autopatch off"):
        fresh = tempfile.mkdtemp(dir=work, prefix=f"tmp-{name.split(',')[0]}-")
        off = {"ROCM_AUTOPATCH": "0"} if "off" in name else {}
        found = job("cache", steps, ROCM_AUTOPATCH_CACHE=root, TMPDIR=fresh, **off)
        results.append({"arm": f"cache: {name}", **found})
        print(json.dumps(results[-1])[:3000], flush=True)
    return results


def arm_report(work: str, steps: int) -> List[Dict[str, Any]]:
    folder = os.path.join(work, "reports")
    os.makedirs(folder)
    found = job("ddp", steps, **_own_caches(work, "report"), TWO_GPU_BUG_RANKS="1",
                ROCM_AUTOPATCH_VERIFY="check", ROCM_AUTOPATCH_VERIFY_DIR=os.path.join(
                    work, "repros-report"),
                ROCM_AUTOPATCH_REPORT=os.path.join(folder, "{rank}.json"))
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    doctor = subprocess.run([sys.executable, "-m", "rocm_autopatch", "doctor", "--report",
                             *files, "--json"], capture_output=True, text=True, timeout=300,
                            cwd=tempfile.gettempdir())
    try:
        view = json.loads(doctor.stdout)
    except ValueError:
        view = {"error": doctor.stderr[-1500:]}
    summary = {k: view.get(k) for k in ("healthy", "red_flags", "diverging", "numerics")}
    summary["processes"] = [{k: p.get(k) for k in ("rank", "pid", "graphs", "cache", "verify")}
                            for p in view.get("processes", [])]
    result = {"arm": "report: check, bug on rank 1", "files": [os.path.basename(f)
                                                               for f in files],
              "doctor_exit": doctor.returncode, "job": {"hung": found.get("hung"),
                                                        "rc": found.get("rc")},
              "view": summary}
    print(json.dumps(result)[:3000], flush=True)
    return [result]


ARMS = {"ddp": arm_ddp, "fsdp2": arm_fsdp2, "tp": arm_tp, "cache": arm_cache,
        "report": arm_report,
        "ddp-short": lambda work, steps: arm_ddp(work, steps, only="short of memory")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--arms", default="ddp,tp,cache,report")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    import torch

    work = tempfile.mkdtemp(prefix="rocm-autopatch-two-gpu-")
    info = {"devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            or ["cpu (gloo)"], "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"), "steps": args.steps}
    print(json.dumps(info), flush=True)
    results: List[Dict[str, Any]] = []
    for arm in args.arms.split(","):
        results += ARMS[arm](work, args.steps)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": info, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
