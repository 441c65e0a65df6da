"""Mixture-of-Experts models under the sentinel: does every graph get its float64 reference,
is anything judged wrong that is not, and is a bug inside the experts caught?

    python benchmarks/moe_models.py [--models mixtral,qwen2_moe,deepseek_v3] [--bug]
                                    [--calls 48] [--tokens 1] [--layers N] [--narrowed]
                                    [--json PATH]

One process, ``ROCM_AUTOPATCH=force ROCM_AUTOPATCH_VERIFY=check`` (set here if unset).
transformers' Mixtral, Qwen2-MoE and DeepSeek-V3 (tiny configs, random weights, bfloat16:
no download), their experts run by transformers' grouped GEMM (``torch._grouped_mm``, no
float64 kernel: ``rocm_autopatch/sentinel/runs/stand_ins.py``). Each model is compiled and
called ``--calls`` times on ``--tokens`` new tokens (no cache: one graph, one shape; 1 is
a decode step's size), then prints its graph records. Where a router's top-k is a near tie
in float64 and the results differ, the call is not judged (``judging/choices.py``): with
12 tokens, most calls. ``--bug``: SiLU (the experts' activation, used
nowhere else in these models) 1.5x too large in what Inductor compiles, through its
decomposition table; eager is untouched. ``--narrowed``: the grouped GEMM's float64
stand-in taken away, so its reference runs it in float32, the highest precision it has
(what any op without a float64 kernel gets: ``runs/reference.py``). On a GPU the models
are larger (hidden 1024, 4 layers, 8 experts); ``--layers`` sets the depth (2 on a CPU: the
test suite runs 1, whose graphs hold every op a deeper model's do, issue 42).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

os.environ.setdefault("ROCM_AUTOPATCH", "force")
os.environ.setdefault("ROCM_AUTOPATCH_VERIFY", "check")
os.environ.setdefault("ROCM_AUTOPATCH_VERIFY_DIR", "off")
os.environ.setdefault("ROCM_AUTOPATCH_RUNGS", "off")  # no rungs of an earlier run

MODELS = ("mixtral", "qwen2_moe", "deepseek_v3")


def build(name: str, big: bool, layers: int = 0) -> Any:
    import transformers as t

    common = dict(vocab_size=32000 if big else 256, hidden_size=1024 if big else 64,
                  intermediate_size=2048 if big else 128,
                  num_hidden_layers=layers or (4 if big else 2),
                  num_attention_heads=16 if big else 4, num_key_value_heads=4 if big else 2,
                  max_position_embeddings=2048)
    experts = 8 if big else 4
    moe = 512 if big else 64
    if name == "mixtral":
        config = t.MixtralConfig(**common, num_local_experts=experts, num_experts_per_tok=2)
        cls = t.MixtralForCausalLM
    elif name == "qwen2_moe":
        config = t.Qwen2MoeConfig(**common, num_experts=experts, num_experts_per_tok=2,
                                  moe_intermediate_size=moe,
                                  shared_expert_intermediate_size=moe)
        cls = t.Qwen2MoeForCausalLM
    else:  # multi-head latent attention: as many key/value heads as query heads
        common["num_key_value_heads"] = common["num_attention_heads"]
        config = t.DeepseekV3Config(**common, n_routed_experts=experts, num_experts_per_tok=2,
                                    moe_intermediate_size=moe, n_shared_experts=1,
                                    first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=32,
                                    qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                                    n_group=1, topk_group=1)
        cls = t.DeepseekV3ForCausalLM
    config._experts_implementation = "grouped_mm"  # transformers' default where it can
    return cls(config)


def run(name: str, calls: int, tokens: int, device: str, layers: int = 0
        ) -> Dict[str, Any]:
    import torch

    import rocm_autopatch

    torch.manual_seed(0)
    model = build(name, device != "cpu", layers).to(torch.bfloat16).to(device).eval()
    compiled = torch.compile(model)
    ids = torch.randint(0, 256, (calls, 1, tokens), device=device)
    before = len((rocm_autopatch.report().verify or {}).get("graphs", []))
    with torch.no_grad():
        for step in range(calls):
            compiled(input_ids=ids[step], use_cache=False)
    keys = ("graph", "status", "calls", "calls_checked", "checks_skipped", "found_at_call",
            "reason", "skipped_reason", "references", "judge")
    graphs = [{k: g.get(k) for k in keys}
              for g in (rocm_autopatch.report().verify or {}).get("graphs", [])[before:]]
    return {"model": name, "graphs": graphs}


def _name_the_bug_in_the_cache_keys(torch) -> None:
    """Inductor's caches do not key on the decomposition table: a healthy graph cached by
    an earlier run would stand in for the bug. A post-grad pass that changes nothing names
    it in the keys (a custom pass's uuid is part of the FX-graph and AOT-autograd keys from
    torch 2.6, PR 137298, ``torch/_inductor/custom_graph_pass.py``), so the kernels the bug
    leaves alike are still found in the cache (a cold compile of every Mixtral kernel was
    most of this run's time on a CPU); before 2.6 the caches are turned off."""
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:
        torch._inductor.config.force_disable_caches = True
        return

    class NamedBug(CustomGraphPass):
        def __call__(self, graph) -> None:
            pass

        def uuid(self) -> str:
            return "benchmarks/moe_models.py --bug: silu x 1.5"

    torch._inductor.config.post_grad_custom_post_pass = NamedBug()


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--bug", action="store_true")
    parser.add_argument("--calls", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--layers", type=int, default=0, help="depth (default 4 on a GPU, 2)")
    parser.add_argument("--narrowed", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    import torch

    if args.narrowed:
        from rocm_autopatch.sentinel.runs import stand_ins

        stand_ins.STAND_INS.clear()

    if args.bug:
        from torch._inductor import decomposition

        decomposition.decompositions[torch.ops.aten.silu.default] = \
            lambda x: x * torch.sigmoid(x) * 1.5  # on purpose: the experts' miscompile
        _name_the_bug_in_the_cache_keys(torch)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = [run(name, args.calls, args.tokens, device, args.layers)
               for name in args.models.split(",")]
    for result in results:
        for g in result["graphs"]:
            print(f"{result['model']:<12} graph {g['graph']}: {g['status']}, "
                  f"{g['calls_checked']} of {g['calls']} calls checked, "
                  f"{g['checks_skipped']} skipped"
                  + (f", found at call {g['found_at_call']}" if g["found_at_call"] else "")
                  + (f"; {g['skipped_reason']}" if g["skipped_reason"] else "")
                  + (f"; reference: {g['judge'].get('reference_precision')}"
                     if g.get("judge") else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": device, "torch": torch.__version__, "bug": args.bug,
                       "narrowed": args.narrowed,
                       "calls": args.calls, "tokens": args.tokens,
                       "results": results}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
