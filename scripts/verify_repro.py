"""Scenarios for the numerics sentinel (ROCM_AUTOPATCH_VERIFY), on real compiles.

    ROCM_AUTOPATCH=force ROCM_AUTOPATCH_VERIFY=check python scripts/verify_repro.py SCENARIO

The miscompile is torch's own fault injection in Inductor's code generation
(``torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"``: the C++ kernel
computes relu(x) as x + 1; ``triton.`` on a GPU), never a stub. Each scenario prints one
JSON line last: what the program saw (``out``), eager's answer computed without
torch.compile on a copy of the model (``expected``) and ``report().verify``.

SCENARIO: ``bug`` (an MLP with the injected miscompile, 3 calls), ``healthy`` (the same
without it, fp32 and bf16), ``dropout`` (a graph with a random op), ``batchnorm`` (3
training steps of a model with BatchNorm: running stats and weights), ``held_batchnorm``
and ``held_batchnorm_bug`` (the same through a graph that holds the module's parameters and
buffers itself, as Dynamo's do on torch 2.4; the second with the miscompile), ``kvcache`` (a
buffer written with ``index_copy_`` over 3 calls), ``train_bug`` (3 training steps with
the injected miscompile), ``no_fp64`` (a custom op with no float64 kernel), ``models``
(GPT-2, Llama and ViT from transformers, small random configs, fp32 and bf16). Used by
tests/sentinel/test_verify.py.
"""

import copy
import json
import os
import sys

import torch
import torch._inductor.config  # noqa: F401 - torch 2.4 does not import it with torch

DEVICE = os.environ.get("DEVICE", "cpu")


def inject_bug() -> None:
    config = torch._inductor.config
    if DEVICE == "cpu":
        config.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"
    else:
        config.triton.inject_relu_bug_TESTING_ONLY = "accuracy"


def mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 8)).to(DEVICE, dtype)


def diff(a, b) -> float:
    return float((a.double() - b.double()).abs().max())


def calls(model, dtype=torch.float32, n=3):
    torch.manual_seed(1)
    xs = [torch.randn(4, 16, device=DEVICE, dtype=dtype) for _ in range(n)]
    compiled = torch.compile(model)
    with torch.no_grad():
        got = [compiled(x) for x in xs]
        want = [model(x) for x in xs]
    return [diff(g, w) for g, w in zip(got, want)]


def train(model, steps=3, compile=torch.compile):
    """Compiled and eager copies trained side by side on the same data."""
    ref = copy.deepcopy(model)
    compiled = compile(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
    torch.manual_seed(2)
    data = [(torch.randn(32, 16, device=DEVICE), torch.randn(32, 8, device=DEVICE))
            for _ in range(steps)]
    losses = {"compiled": [], "eager": []}
    for x, y in data:
        for name, m, opt in (("compiled", compiled, opts[0]), ("eager", ref, opts[1])):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            losses[name].append(float(loss))
    weights = max(diff(p, q) for p, q in zip(model.parameters(), ref.parameters()))
    return model, ref, losses, weights


def compile_holding_state(model):
    """Inductor on a graph that holds its module's parameters and buffers itself
    (``torch.fx.symbolic_trace`` + ``torch._inductor.compile``), as Dynamo's graphs do on
    torch 2.4 (``inline_inbuilt_nn_modules`` off)."""
    import torch.fx

    fn = torch._inductor.compile(torch.fx.symbolic_trace(model),
                                 [torch.randn(32, 16, device=DEVICE)])

    def call(x):
        out = fn(x)
        return out[0] if isinstance(out, (list, tuple)) else out

    return call


def batchnorm(compile=torch.compile) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 8)).to(DEVICE)
    model, ref, losses, weights = train(model, compile=compile)
    bn, bn_ref = model[1], ref[1]
    return {"losses": losses, "weights": weights,
            "num_batches_tracked": [int(bn.num_batches_tracked),
                                    int(bn_ref.num_batches_tracked)],
            "running_mean": diff(bn.running_mean, bn_ref.running_mean),
            "running_var": diff(bn.running_var, bn_ref.running_var)}


class KVCache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(8, 16, device=DEVICE))
        self.proj = torch.nn.Linear(16, 16, device=DEVICE)

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, self.proj(x))
        return self.cache.sum(0)


def scenario(name: str) -> dict:
    if name == "bug":
        inject_bug()
        return {"diffs": calls(mlp())}
    if name == "healthy":
        return {"fp32": calls(mlp()), "bf16": calls(mlp(torch.bfloat16), torch.bfloat16)}
    if name == "dropout":
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5)).to(DEVICE)
        compiled = torch.compile(model)
        torch.manual_seed(3)
        out = compiled(torch.randn(4, 16, device=DEVICE))
        # The program's random stream after the call: the same with or without the sentinel.
        return {"out_sum": float(out.sum()), "next_random": float(torch.rand(1))}
    if name == "batchnorm":
        return batchnorm()
    if name in ("held_batchnorm", "held_batchnorm_bug"):
        if name.endswith("_bug"):
            inject_bug()
        return batchnorm(compile_holding_state)
    if name == "train_bug":
        inject_bug()
        _, _, losses, weights = train(mlp())
        return {"losses": losses, "weights": weights}
    if name == "kvcache":
        torch.manual_seed(0)
        model = KVCache()
        ref = copy.deepcopy(model)
        compiled = torch.compile(model)
        torch.manual_seed(4)
        steps = [(torch.randn(2, 16, device=DEVICE), torch.tensor([2 * i, 2 * i + 1],
                                                                  device=DEVICE))
                 for i in range(3)]
        with torch.no_grad():
            outs = [diff(compiled(x, p), ref(x, p)) for x, p in steps]
        return {"outs": outs, "cache": diff(model.cache, ref.cache),
                "rows_written": int((model.cache.abs().sum(1) > 0).sum())}
    if name == "no_fp64":
        return no_fp64()
    if name == "models":
        return models()
    raise SystemExit(f"unknown scenario {name!r}")


def no_fp64() -> dict:
    """A custom op with no float64 kernel (as vendor bf16/FP8 kernels have none): the graph
    cannot get a float64 reference; the program must go on with the compiled result."""

    @torch.library.custom_op("verify_repro::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float64:
            raise RuntimeError("verify_repro::scale has no float64 kernel")
        return x * 2

    @scale.register_fake
    def _(x):
        return torch.empty_like(x)

    compiled = torch.compile(lambda x: scale(x.sin()) + 1)
    x = torch.randn(8, device=DEVICE)
    return {"diff": diff(compiled(x), scale(x.sin()) + 1)}


def models() -> dict:
    """Real architectures at small sizes, random weights: every graph must pass."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        ViTConfig,
        ViTForImageClassification,
    )

    torch.manual_seed(0)
    built = {
        "gpt2": (GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64,
                                            vocab_size=512)),
                 lambda: {"input_ids": torch.randint(0, 512, (2, 16))}),
        "llama": (LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=64,
                                               intermediate_size=128, num_attention_heads=4,
                                               num_key_value_heads=2, vocab_size=512,
                                               max_position_embeddings=64)),
                  lambda: {"input_ids": torch.randint(0, 512, (2, 16))}),
        "vit": (ViTForImageClassification(ViTConfig(image_size=32, patch_size=8,
                                                    num_hidden_layers=2, hidden_size=64,
                                                    num_attention_heads=4,
                                                    intermediate_size=128, num_labels=10)),
                lambda: {"pixel_values": torch.randn(2, 3, 32, 32)}),
    }
    out = {}
    for name, (model, inputs) in built.items():
        for dtype in (torch.float32, torch.bfloat16):
            m = copy.deepcopy(model).to(DEVICE, dtype).eval()
            kwargs = {k: v.to(DEVICE, dtype) if v.is_floating_point() else v.to(DEVICE)
                      for k, v in inputs().items()}
            with torch.no_grad():
                got = torch.compile(m)(**kwargs).logits
                want = m(**kwargs).logits
            out[f"{name}-{str(dtype)[6:]}"] = diff(got, want)
    return out


if __name__ == "__main__":
    result = scenario(sys.argv[1])
    import rocm_autopatch

    print(json.dumps({"out": result, "verify": rocm_autopatch.report().verify,
                      "loaded": sorted(m for m in sys.modules
                                       if m in ("rocm_autopatch.sentinel.watch",
                                                "rocm_autopatch.sentinel.runs.numerics")),
                      "captures_counted": [  # the real graph classes' capture_begin
                          getattr(c.capture_begin, "__rocm_autopatch__", False) for c in (
                              torch.cuda.graphs.CUDAGraph, getattr(getattr(
                                  torch, "accelerator", None), "Graph", None)) if c],
                      "compile_fx_wrapped": getattr(getattr(
                          sys.modules.get("torch._inductor.compile_fx"), "compile_fx", None),
                          "__rocm_autopatch__", False)}))
