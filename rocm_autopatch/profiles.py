"""The profiles: which Inductor/Dynamo settings each profile wants, and why. Data only.

Keys are namespaced: ``inductor.<key>`` is ``torch._inductor.config.<key>`` (nested keys
like ``inductor.triton.cudagraphs`` included), ``dynamo.<key>`` is
``torch._dynamo.config.<key>``. ``older_names`` are tried when the running torch lacks
the key; ``at_least`` settings raise a limit and never lower one; ``env`` lists the
``TORCHINDUCTOR_*`` variables that set the key in torch (overridden, with a warning).
Sources: shared/seeds 000-003, corrected by shared/FINDINGS.md.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Tuple

ENV_PROFILE = "ROCM_AUTOPATCH_PROFILE"
DEFAULT_PROFILE = "safe"
# INDUCTOR_<KEY> sets an Inductor key over the profile's value (rocm_autopatch/overrides.py).
OVERRIDE_PREFIX = "INDUCTOR_"


class Setting(NamedTuple):
    key: str
    value: Any
    reason: str
    at_least: bool = False
    older_names: Tuple[str, ...] = ()
    env: Tuple[str, ...] = ()


SAFE: Tuple[Setting, ...] = (
    Setting(
        "inductor.max_autotune", False,
        "GEMM autotuning benchmarks every GEMM shape; with hundreds of shapes the compile "
        "never finishes on ROCm (seed 001; 6.7x compile time on an H200, FINDINGS)",
        env=("TORCHINDUCTOR_MAX_AUTOTUNE",),
    ),
    Setting(
        "inductor.max_autotune_gemm", False,
        "same runaway GEMM autotuning, enabled for GEMMs only",
        env=("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM",),
    ),
    Setting(
        "inductor.max_autotune_pointwise", False,
        "autotunes every pointwise kernel; a known cause of compile hangs (seed 003)",
        env=("TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE",),
    ),
    Setting(
        "inductor.max_autotune_gemm_backends", "ATEN",
        "GEMMs go to hipBLASLt/rocBLAS through ATen; Triton GEMM candidates only add "
        "compile time when autotuning is turned on per call (seeds 000, 001)",
        env=("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS",),
    ),
    Setting(
        "inductor.coordinate_descent_tuning", False,
        "extra kernel tuning at compile time (2-3x first compile, seed 000); off for "
        "predictable start-up",
        env=("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING",),
    ),
    Setting(
        "inductor.triton.cudagraphs", False,
        "Inductor CUDA graphs on HIP: hangs, crashes or silent wrong results (seeds 001-003)",
        env=("TORCHINDUCTOR_CUDAGRAPHS",),
    ),
    Setting(
        "inductor.triton.cudagraph_trees", False,
        "CUDA graph trees are less stable than flat graphs on ROCm (seed 001)",
    ),
    Setting(
        "inductor.memory_planning", False,
        "deep recursion on large graphs on ROCm (seed 001); torch's default is already "
        "off (FINDINGS), so this only undoes an environment that turned it on",
        env=("TORCHINDUCTOR_MEMORY_PLANNING",),
    ),
    Setting(
        "inductor.epilogue_fusion", True,
        "fuses bias/activation into the GEMM epilogue: where default mode's speed comes from",
    ),
    Setting(
        "inductor.pattern_matcher", True,
        "pattern rewrites (SiLU, attention) that default mode relies on",
    ),
    Setting(
        "inductor.reorder_for_locality", True,
        "better memory access order (seed 002); called 'reordering' in torch 2.1",
        older_names=("reordering",),
    ),
    Setting(
        "dynamo.recompile_limit", 128,
        "models with many shapes or control-flow paths exceed 8 and fall back to eager "
        "silently; raised, never lowered (frameworks such as SGLang set 1024)",
        at_least=True,
        older_names=("cache_size_limit",),
    ),
)

# perf = safe, then these (a later entry for the same key wins).
PERF_EXTRA: Tuple[Setting, ...] = (
    Setting(
        "inductor.coordinate_descent_tuning", True,
        "tunes Triton block sizes/warps for steady-state speed; costs 2-3x first compile "
        "(seed 000), bounded, unlike GEMM autotuning",
        env=("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING",),
    ),
    Setting(
        "inductor.aggressive_fusion", True,
        "fuses kernels without shared reads: fewer launches (seed 000)",
    ),
    Setting(
        "inductor.max_fusion_size", 128,
        "larger fused kernels than torch's 64; diminishing returns past 128 (seed 000)",
    ),
    Setting(
        "inductor.triton.multi_kernel", 1,
        "builds persistent and non-persistent reductions and picks at run time (seed 000)",
        env=("TORCHINDUCTOR_MULTI_KERNEL",),
    ),
    Setting(
        "inductor.shape_padding", True,
        "pads odd GEMM shapes (seed 000); already torch's default, kept explicit",
        env=("TORCHINDUCTOR_SHAPE_PADDING",),
    ),
    Setting(
        "inductor.freezing", True,
        "inference only (torch applies it under no_grad): weights become constants; "
        "do not mutate weights after compiling, or set INDUCTOR_FREEZING=0",
        env=("TORCHINDUCTOR_FREEZING",),
    ),
    Setting(
        "dynamo.recompile_limit", 256,
        "seed 000's value for complex models; raised, never lowered",
        at_least=True,
        older_names=("cache_size_limit",),
    ),
)

# Seed 000 keys deliberately left out of perf, with the reason (shown by the doctor).
LEFT_OUT: Dict[str, str] = {
    "inductor.benchmark_kernel": (
        "seed 000 says it benchmarks kernel variants; in torch 2.13 it only emits a "
        "benchmark harness into compiled modules (codegen/triton.py), so it tunes nothing"
    ),
    "inductor.group_fusion": (
        "marked '# Deprecated' in torch's inductor config and read nowhere in 2.13"
    ),
}

# Keys that exist but that torch no longer reads: reported as no-ops, never "applied".
NOOP_KEYS: Dict[str, str] = {
    "inductor.group_fusion": "deprecated in torch and read nowhere (2.13); setting it does "
    "nothing",
}


def _merge(*layers: Tuple[Setting, ...]) -> Tuple[Setting, ...]:
    merged: Dict[str, Setting] = {}
    for layer in layers:
        for setting in layer:
            merged[setting.key] = setting
    return tuple(merged.values())


PROFILES: Dict[str, Tuple[Setting, ...]] = {
    "safe": SAFE,
    "perf": _merge(SAFE, PERF_EXTRA),
}
