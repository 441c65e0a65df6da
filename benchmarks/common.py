"""Shared by the GPU benchmark scripts: a clean child environment and the results file."""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from typing import Any, Dict, List, Optional

OURS = ("TORCHINDUCTOR_", "ROCM_AUTOPATCH", "INDUCTOR_")

# The runaway-autotuning model, as child code: ``shapes`` Linear layers of distinct widths,
# so every Linear is a GEMM of its own shape (M=batch*seq, K, N); defines widths and model.
RUNAWAY_MODEL = """
widths = [256 + 64 * ((i * 7) % (shapes + 1)) for i in range(shapes + 1)]
layers = []
for k, n in zip(widths, widths[1:]):
    layers += [torch.nn.Linear(k, n, bias=False), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers).to("cuda", torch.bfloat16).eval()
"""


def llama_child(layers: int = 22, prompt: int = 512) -> str:
    """Child code: TinyLlama's widths (width 2048, 32 heads, 4 KV heads, MLP 5632,
    vocabulary 32000) with ``layers`` layers, random weights, bf16, on the GPU; defines t
    (transformers), cfg, model and ids (a 1 x ``prompt`` prompt). Used by the benchmarks
    and by ``tests/gpu/gpu_checks.py``."""
    return f"""
import torch, transformers as t
torch.manual_seed(0)
cfg = t.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                    num_hidden_layers={layers}, num_attention_heads=32, num_key_value_heads=4)
with torch.device("cuda"):
    model = t.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
ids = torch.randint(0, 32000, (1, {prompt}), device="cuda")
"""


# TinyLlama's 1.1B configuration (22 layers), a 1 x 512 prompt.
LLAMA_1B = llama_child()

# The decode loop of issue 32, as child code (needs ``layers``): TinyLlama's widths with
# ``layers`` layers, random weights, bf16, a static KV cache, ``forward`` compiled as a user
# would (transformers' own compile off); defines t, cfg, model, prompt (16 tokens) and
# generate(n) (greedy, exactly n new tokens).
DECODE_LLAMA = """
torch.manual_seed(0)
cfg = t.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                    num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4,
                    max_position_embeddings=2048)
with torch.device("cuda"):
    model = t.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
model.generation_config.cache_implementation = "static"
model.generation_config.disable_compile = True
model.forward = torch.compile(model.forward)
prompt = torch.randint(0, cfg.vocab_size, (1, 16), device="cuda")
def generate(n):
    return model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=0)
"""

# Child code: a small Llama on the CPU (2 layers, ``{width}`` wide, its MLP twice that, in
# ``torch.{dtype}``), a static KV cache, its forward compiled, a 16-token ``prompt``; fill in
# with ``CPU_LLAMA.format(width=..., dtype=...)`` (benchmarks/bug_visibility.py,
# wrapper_in_loop.py).
CPU_LLAMA = """
torch.manual_seed(0)
cfg = t.LlamaConfig(vocab_size=1000, hidden_size={width}, intermediate_size={width} * 2,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=2048)
model = t.LlamaForCausalLM(cfg).to(torch.{dtype}).eval()
model.generation_config.cache_implementation = "static"
model.generation_config.disable_compile = True
model.forward = torch.compile(model.forward)
prompt = torch.randint(0, cfg.vocab_size, (1, 16))
"""

# Child code: ``timed_part(owner, name, key)`` wraps ``owner.name`` with a clock, each call's
# seconds appended to ``parts[key]`` (benchmarks/decode_loop.py, decode_host_parts.py).
TIMED_PARTS = """
parts = {}
def timed_part(owner, name, key):
    inner = getattr(owner, name)
    def wrapper(*a, **k):
        began = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            parts.setdefault(key, []).append(time.perf_counter() - began)
    setattr(owner, name, wrapper)
"""

# Child code: decode speed, tokens/s over three greedy generations (needs ``generate()``,
# ``tokens``, ``time``): benchmarks/tunableop.py and perf_rounds.py.
TOKENS_PER_S = """
def tokens_per_s():
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        generate()
    torch.cuda.synchronize()
    return round(3 * tokens / (time.perf_counter() - start), 2)
"""


def child_env(**arm: str) -> Dict[str, str]:
    """This environment without any variable that would change torch or us, plus ``arm``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(OURS)}
    env.update(arm)
    return env


@functools.cache
def child_cwd() -> str:
    """An empty directory for the children to run in. ``python -c``/``-m`` put the working
    directory first on sys.path: run from the checkout, a child would load the source tree
    (compiled anew each run where bytecode is not written) instead of the installed wheel."""
    return tempfile.mkdtemp(prefix="rocm-autopatch-bench-")


def run_arm(code: str, argv: List[str], arm: Dict[str, str], timeout: int,
            fresh_cache: bool = True) -> Dict[str, Any]:
    """``python -c code *argv`` in this environment plus ``arm``, ROCm behaviour forced, with
    an empty Inductor cache of its own and an empty store of the sentinel's remembered rungs
    (``fresh_cache``; else the caches ``arm`` names): a process with no earlier one. Its
    last stdout line as JSON, or {"error": stderr}."""
    import subprocess
    import sys

    with tempfile.TemporaryDirectory() as cache:
        fresh = {"TORCHINDUCTOR_CACHE_DIR": cache,
                 "ROCM_AUTOPATCH_RUNGS": os.path.join(cache, "rungs.json")}
        env = {**os.environ, "ROCM_AUTOPATCH": "force", **(fresh if fresh_cache else {}),
               **arm}
        proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                              text=True, env=env, timeout=timeout, cwd=child_cwd())
    return last_json(proc.stdout, proc.stderr)


def rungs_store(mode: str) -> Dict[str, str]:
    """``--rungs shared``: one store of the sentinel's remembered rungs and one Inductor
    cache for all the processes a benchmark starts (``ROCM_AUTOPATCH_RUNGS``; rungs are
    kept per cache directory, where the kernels' benchmarked configurations are), so that
    each after the first starts its graphs' ladders where the one before stopped, as a
    user's next process on one machine does; else {} (``run_arm`` gives each process an
    empty store and cache of its own)."""
    if mode != "shared":
        return {}
    shared = tempfile.mkdtemp(prefix="rungs-")  # left for the benchmark's life, like /tmp's
    return {"ROCM_AUTOPATCH_RUNGS": os.path.join(shared, "rungs.json"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(shared, "inductor")}


RUNGS_HELP = ("`shared`: the check processes share one store of remembered rungs "
              "(ROCM_AUTOPATCH_RUNGS) and one Inductor cache, so each after the first starts "
              "its ladder where the one before stopped (default: each its own empty store "
              "and cache, a process with no earlier one)")


def last_json(stdout: str, stderr: str) -> Dict[str, Any]:
    """A child's result: its last stdout line as JSON, or {"error": its stderr's end}."""
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": stderr[-1500:]}


def meta(torch: Any, **extra: Any) -> Dict[str, Any]:
    device = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
              else f"CPU ({os.cpu_count()} cores)")
    return {"device": device, "torch": torch.__version__, **extra,
            "date": time.strftime("%Y-%m-%d")}


def save(path: Optional[str], info: Dict[str, Any], results: List[Dict[str, Any]]) -> None:
    """Write the JSON file (when asked) and print the metadata line before the table."""
    if path:
        with open(path, "w") as fh:
            json.dump({"meta": info, "results": results}, fh, indent=2)
    print(json.dumps(info))
