"""The numerics sentinel never breaks a program (issue 24), through the installed wheel:
real multi-rank jobs (torchrun, gloo, on the CPU), a program near its memory limit, side
effects counted, the false alarm of aliased inputs, and a real torch miscompile. Each test
failed before its fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import Venv, named_in_cache_key, rank_lines

FORCE = {"ROCM_AUTOPATCH": "force"}

JOB = r'''
import json, os, sys
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
if rank == 1:  # a miscompile on one rank only, made in what Inductor compiles
    from torch._inductor import decomposition as d
    d.decompositions[torch.ops.aten.silu.default] = lambda x: x * torch.sigmoid(x) * 1.5
    # Named in Inductor's cache keys: a cache shared by the ranks once served rank 1 the
    # other's kernel (a CI run: rank 1 correct in one run only).
    exec(NAMED_BUG)

def reduce(x, k):  # a collective inside the compiled graph
    return funcol.all_reduce(x * k, "sum", dist.group.WORLD) + 1

def noisy(x, k):  # a random op on rank 0 only (ranks trace different graphs)
    y = funcol.all_reduce(x * k, "sum", dist.group.WORLD)
    return torch.nn.functional.dropout(y, 0.5) * 0 + y if rank == 0 else y

def act(x, k):  # wrong on rank 1: the verdicts differ between ranks
    return funcol.all_reduce(torch.nn.functional.silu(x) * k, "sum", dist.group.WORLD)

out = {}
for name, fn in (("reduce", reduce), ("noisy", noisy), ("act", act)):
    g = torch.compile(fn)
    for i in range(3):
        k = 3.0 if (rank == 1 and i == 1) else 2.0  # rank 1 recompiles alone (k is baked in)
        out.setdefault(name, []).append(g(torch.full((4,), float(i + 1)), k).tolist())
dist.barrier()
import rocm_autopatch
v = rocm_autopatch.report().verify
print(json.dumps({"rank": rank, "out": out,
                  "statuses": sorted({g["status"] for g in v.get("graphs", [])})}))
dist.destroy_process_group()
'''


def _torchrun(venv_: Venv, tmp_path: Path, **env: str) -> dict:
    script = tmp_path / "job.py"
    script.write_text(JOB.replace("NAMED_BUG", repr(named_in_cache_key("silu 1.5x, rank 1"))))
    env = {**FORCE, **env}
    proc = venv_.torchrun("--standalone", "--nproc-per-node", "2", str(script), env=env,
                          timeout=240, cwd=str(tmp_path))
    assert proc is not None, "the 2-rank job ran past 240 s: ranks out of step"
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return {r["rank"]: r for r in rank_lines(proc.stdout)}


@pytest.mark.heavy(85)
def test_ranks_that_would_decide_differently_stay_in_step(torch_venv: Venv,
                                                         tmp_path: Path) -> None:
    """Collectives inside compiled graphs, with a random op on one rank, a rank that
    recompiles alone and a miscompile on one rank: the job ends, with the results it has
    with the sentinel off (before: gloo aborted, "Received data size doesn't match")."""
    off = _torchrun(torch_venv, tmp_path)
    for mode in ("check", "fallback"):
        got = _torchrun(torch_venv, tmp_path, ROCM_AUTOPATCH_VERIFY=mode)
        assert set(got) == {0, 1}
        for rank in (0, 1):
            assert got[rank]["out"] == off[rank]["out"], (mode, rank)
            assert got[rank]["statuses"] == ["skipped"]  # it communicates: not re-run


MEMORY = r'''
import json, resource, torch
def step(cache, pos, x):
    cache.index_copy_(0, pos, x[None])  # an in-place write of a large cache (StaticCache)
    return x * 2
f = torch.compile(step)
cache = torch.zeros(32, 2**20)  # 128 MiB
x = torch.ones(2**20)
f(cache, torch.tensor([0]), x)  # compiled and checked with memory to spare
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
with open("/proc/self/status") as fh:
    size = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + 64 * 2**20, hard))  # 64 MiB to spare
y = f(cache, torch.tensor([1]), x * 3)
import rocm_autopatch
(g,) = rocm_autopatch.report().verify["graphs"]
print(json.dumps({"ok": bool((cache[1] == 3).all()) and bool((y == 6).all()),
                  "status": g["status"], "reason": g["skipped_reason"],
                  "skipped": g["checks_skipped"], "checked": g["calls_checked"]}))
'''


def test_a_cache_write_near_the_memory_limit_is_skipped_not_fatal(torch_venv: Venv) -> None:
    """The second call is checked too (VERIFY_CALLS=2) with 64 MiB left for a 128 MiB
    cache it writes: copying the cache's state must not kill the program (before: the copy
    was made outside any failure boundary)."""
    out = torch_venv.json(MEMORY, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": "check",
                                       "ROCM_AUTOPATCH_VERIFY_CALLS": "2"})
    # The first check passed; the second is counted as skipped, with its reason, and the
    # graph stays watched (a later call with memory to spare would be checked).
    assert out["ok"] and out["status"] == "passed", out
    assert out["skipped"] == 1 and out["checked"] == 1, out
    # where the copy found room (memory the first check left to the collector came back),
    # the references' own copies do not, and are skipped the same way
    assert ("could not be copied" in out["reason"] or "would need" in out["reason"]
            or "reference failed" in out["reason"] and "allocate" in out["reason"]), out


EFFECTS = r'''
import json, torch
calls = {"op": 0, "packed": 0}

@torch.library.custom_op("rap_test::count", mutates_args=())
def count(x: torch.Tensor) -> torch.Tensor:
    calls["op"] += 1          # a side effect: counting, logging, a runtime call
    return x.clone()

@count.register_fake
def _(x):
    return torch.empty_like(x)

f = torch.compile(lambda x: count(x) + 1)
for _ in range(3):
    f(torch.ones(4))

def pack(t):
    calls["packed"] += 1      # activation offloading would move t to the host here
    return t

m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
g = torch.compile(lambda x: m(x).sum())
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    for _ in range(2):
        g(torch.randn(4, 8)).backward()
import rocm_autopatch
print(json.dumps({**calls, "graphs": [(x["status"], x["reason"][:120])
                                      for x in rocm_autopatch.report().verify.get("graphs", [])]}))
'''


def test_side_effects_run_once_and_the_programs_hooks_see_only_the_program(
        torch_venv: Venv) -> None:
    off = torch_venv.json(EFFECTS, env=FORCE)
    on = torch_venv.json(EFFECTS, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": "check"})
    assert off["op"] == on["op"] == 3, on  # before: 5
    assert on["packed"] == off["packed"], on  # before: more (the backward check's forwards)
    (custom, trained) = on["graphs"]
    assert custom[0] == "skipped" and "rap_test::count" in custom[1]
    assert trained[0] == "passed"


ALIAS = r'''
import json, torch
def f(a, b):
    a.mul_(2)
    return b + 1
buf, buf2 = torch.arange(8.0), torch.arange(8.0)
out = torch.compile(f)(buf[0:5], buf[3:8])   # two overlapping views, one written
ref = f(buf2[0:5], buf2[3:8])
import rocm_autopatch
(g,) = rocm_autopatch.report().verify["graphs"]
print(json.dumps({"same": bool(torch.equal(out, ref) and torch.equal(buf, buf2)),
                  "status": g["status"]}))
'''


def test_inputs_that_overlap_are_no_false_alarm(torch_venv: Venv) -> None:
    out = torch_venv.json(ALIAS, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": "check"})
    assert out == {"same": True, "status": "passed"}  # before: "failed", a false alarm


BUMP = r'''
import json, torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(()))
    def forward(self, x):
        self.count.add_(1)
        return self.lin(x) * self.count
torch.manual_seed(0)
m, ref = M(), M()
ref.load_state_dict(m.state_dict())
x = torch.randn(2, 4)
torch.compile(m)(x).sum().backward()
ref(x).sum().backward()
import rocm_autopatch
(g,) = rocm_autopatch.report().verify.get("graphs", [{"status": None, "backward": ""}])
print(json.dumps({"ratio": (m.lin.weight.grad / ref.lin.weight.grad).mean().item(),
                  "status": g["status"], "backward": g["backward"]}))
'''


@pytest.mark.parametrize("mode", ["", "check", "fallback"])
def test_a_real_torch_miscompile_is_caught_and_corrected(torch_venv: Venv, mode: str) -> None:
    """A module that bumps a buffer in place and multiplies by it: torch.compile (2.13) gives
    gradients twice eager's. Nothing is injected."""
    out = torch_venv.json(BUMP, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": mode})
    if torch_venv.torch["release"] != (2, 13):
        pytest.skip("measured on torch 2.13; other releases may compile it right")
    if mode == "":
        assert out["ratio"] == pytest.approx(2.0)  # the miscompile, silent
    elif mode == "check":
        assert out["ratio"] == pytest.approx(2.0) and out["status"] == "failed"
        assert out["backward"].startswith("failed: gradient")
    else:
        assert out["ratio"] == pytest.approx(1.0) and out["status"] == "fell back"


SHARE = r'''
import json, torch
from rocm_autopatch.sentinel.runs import memory
memory.SHARE = 1e-12  # our bound on a check's memory: any graph's references now pass it
def step(cache, pos, x):
    cache.index_copy_(0, pos, x[None])  # a written input, as a KV cache is
    return torch.relu(x @ x.T)
f = torch.compile(step)
cache = torch.zeros(16, 512, 256)  # 8 MiB
x = torch.randn(512, 256)
y = f(cache, torch.tensor([3]), x)
import rocm_autopatch
(g,) = rocm_autopatch.report().verify["graphs"]
print(json.dumps({"ok": bool(torch.equal(cache[3], x)) and bool(torch.equal(
                      y, torch.relu(x @ x.T))),
                  "status": g["status"], "reason": g["skipped_reason"]}))
'''


def test_a_check_skipped_for_memory_says_what_would_hold_it(torch_venv: Venv) -> None:
    """A check whose references would need more than our share of the free memory is
    skipped with the estimate's parts, largest first, summing to the whole: on an 80 GB
    card an 8B prefill went unchecked at 39.27 GiB, and which factor made it so was not
    said (BENCHMARKS.md, "The proof re-run on the final build"). The written cache's part
    is its copies and the judge's stacks: ten times its 8 MiB."""
    out = torch_venv.json(SHARE, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": "check"})
    assert out["ok"] and out["status"] == "skipped", out
    found = re.fullmatch(r"not checked: its eager and float64 references would need about "
                         r"([\d.]+) MiB \((.*)\), more than half of the [\d.]+ GiB free",
                         out["reason"])
    assert found, out["reason"]
    parts = [(name, float(size)) for name, size in
             re.findall(r"([a-z][a-z0-9' ]*) ([\d.]+) MiB", found.group(2))]
    named = dict(parts)
    assert named["copies of the state it writes"] == 80.0, parts
    assert "the judge" in named and "the float64 run" in named, parts
    assert [size for _, size in parts] == sorted((size for _, size in parts), reverse=True)
    assert abs(sum(named.values()) - float(found.group(1))) <= 0.05 * (len(parts) + 1), parts
