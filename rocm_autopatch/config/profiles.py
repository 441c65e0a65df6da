"""The profiles: which Inductor/Dynamo settings each profile wants, why, and the public
evidence for it. Data only.

Keys are namespaced: ``inductor.<key>`` is ``torch._inductor.config.<key>`` (nested keys
like ``inductor.triton.cudagraphs`` included), ``dynamo.<key>`` is
``torch._dynamo.config.<key>``. Each entry's ``reason`` is what a user reads (doctor,
``report()``, warnings) and ``ref`` the public evidence: an issue or PR, or a torch source
path and release; an entry without public evidence says so in ``ref``.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Tuple

from rocm_autopatch import settings


class Setting(NamedTuple):
    key: str
    value: Any
    reason: str
    ref: str = ""
    at_least: bool = False  # a limit: raised to ``value``, never lowered
    at_most: bool = False  # a cap: lowered to ``value``, never raised
    cap_by: str = ""  # a bound known only at apply time (USABLE_CPUS), for at_most
    older_names: Tuple[str, ...] = ()
    # TORCHINDUCTOR_* variables that set this key in torch: overridden with a warning, or,
    # with ``env_wins``, left alone (the user chose the value).
    env: Tuple[str, ...] = ()
    env_wins: bool = False
    # Not applied where a GPU's architecture starts with one of these (KFD topology; the
    # previous layer's value for the key stays).
    not_on_archs: Tuple[str, ...] = ()
    # A yes/no variable that, set, leaves torch's own value of this key (settings.ALLOW_GRAPHS).
    kept_by: str = ""
    # A failure (``broken_settings.FAILURES``) that keeps this setting out where the running
    # torch and Triton carry it (the previous layer's value for the key stays).
    broken_by: str = ""


# Bound at apply time: the CPUs this process may use (affinity and cgroup quota).
USABLE_CPUS = "usable CPUs"

NO_PUBLIC_REPORT = "no public report found"
# The README's "Why each rule" table says what each of these reports.
REF_AUTOTUNE = "ROCm/pytorch#3548, pytorch#193735"
REF_CUDAGRAPHS = "pytorch#185074, pytorch#187715"
REF_CDT_GFX12 = "pytorch#193658"

SAFE: Tuple[Setting, ...] = (
    Setting(
        "inductor.max_autotune", False,
        "GEMM autotuning benchmarks every GEMM shape at compile time: with many shapes the "
        "first compile takes minutes or never ends, and on ROCm the tuning runs crash or "
        "break graph capture",
        ref=REF_AUTOTUNE + "; set by sglang's docker/rocm.Dockerfile",
        env=("TORCHINDUCTOR_MAX_AUTOTUNE",),
    ),
    Setting(
        "inductor.max_autotune_gemm", False,
        "the same GEMM autotuning, turned on for GEMMs only",
        ref=REF_AUTOTUNE,
        env=("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM",),
    ),
    Setting(
        "inductor.max_autotune_pointwise", False,
        "autotunes every pointwise/reduction kernel at compile time (long first compiles)",
        ref=REF_AUTOTUNE + "; set by sglang's docker/rocm.Dockerfile",
        env=("TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE",),
    ),
    Setting(
        "inductor.max_autotune_gemm_backends", "ATEN",
        "GEMMs go to hipBLASLt through ATen; Triton/CK/FlyDSL (torch 2.15+, experimental) GEMM "
        "candidates only add compile time and crash-prone benchmark runs when autotuning is "
        "asked for anyway",
        ref=REF_AUTOTUNE,
        env=("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS",),
    ),
    Setting(
        "inductor.coordinate_descent_tuning", False,
        "benchmarks block-size variants of every Triton kernel at compile time (2-4x first "
        "compile); off for a predictable start-up",
        ref=REF_AUTOTUNE + "; " + REF_CDT_GFX12,
        env=("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING",),
    ),
    Setting(
        "inductor.distributed_max_autotune_gemm", False,
        "shares GEMM autotuning between ranks through a collective inside every compile "
        "(all_gather_object, torch/_inductor/distributed_autotune.py _sync): a rank whose "
        "compile cache hits skips it, and the ranks that compile wait on it for good "
        "(measured: 2 gloo ranks, one cache warm, hung until killed; the same cache-hit "
        "divergence hangs FlashInfer's shared autotuning, vllm#57423)",
        ref="pytorch#163369 (distributed autotuning); torch/_inductor/distributed_autotune.py "
            "(torch 2.13); vllm#57423",
        env=("TORCHINDUCTOR_DISTRIBUTED_MAX_AUTOTUNE_GEMM",),
    ),
    Setting(
        "inductor.triton.cudagraphs", False,
        "Inductor CUDA graphs on HIP: capture of work that hipGraph records silently, and "
        "reported silent training degradation",
        ref=REF_CUDAGRAPHS,
        env=("TORCHINDUCTOR_CUDAGRAPHS",),
        kept_by=settings.ALLOW_GRAPHS,
    ),
    Setting(
        "inductor.triton.cudagraph_trees", False,
        "the CUDA-graph-trees implementation of the same Inductor CUDA graphs",
        ref=REF_CUDAGRAPHS,
        kept_by=settings.ALLOW_GRAPHS,
    ),
    Setting(
        "inductor.memory_planning", False,
        "torch's default is already off; kept only to undo an environment that turns it on",
        ref=NO_PUBLIC_REPORT + " of a failure; torch/_inductor/config.py defaults it off",
        env=("TORCHINDUCTOR_MEMORY_PLANNING",),
    ),
    Setting(
        "inductor.epilogue_fusion", True,
        "fuses bias/activation into the GEMM epilogue: where default mode's speed comes from",
        ref="torch's default (torch/_inductor/config.py); kept explicit",
    ),
    Setting(
        "inductor.pattern_matcher", True,
        "pattern rewrites (SiLU, attention) that default mode relies on",
        ref="torch's default (torch/_inductor/config.py); kept explicit",
    ),
    Setting(
        "inductor.reorder_for_locality", True,
        "better memory access order; called 'reordering' in torch 2.1",
        ref="torch's default (torch/_inductor/config.py); kept explicit",
        older_names=("reordering",),
    ),
    Setting(
        "inductor.combo_kernels", False,
        "combines independent kernels into one (marked Experimental in torch's config); on "
        "ROCm its kernels computed wrong scalar results (missing store masks, fixed in torch "
        "2.11) and it crashes compiles with dynamic reduction sizes (fixed in torch 2.14). "
        "Off is torch's default in 2.10-2.15, kept explicit; asked for per call "
        "(options={'combo_kernels': True}) it is dropped under safe on torch < 2.14",
        ref="pytorch#168937 (PR 168939); pytorch#187269 (PR 187275); torch/_inductor/config.py "
            "combo_kernels ('Experimental'), torch/_inductor/codegen/triton_combo_kernel.py "
            "('Dynamic shape on reduction dimension is not supported' through 2.13)",
    ),
    Setting(
        "inductor.autotune_cudagraph_benchmarking", False,
        "times each autotuning candidate by replaying it in a CUDA graph (torch 2.14+, only "
        "with max_autotune): on MI350 with ROCm 7.1 repeated graph timing aborts the process "
        "(HSA_STATUS_ERROR_INVALID_PACKET_FORMAT or a segmentation fault); torch's default "
        "is off, kept explicit to undo an environment that turns it on",
        ref="pytorch/helion PR 3471 (torch 2.13, ROCm 7.1, MI350); pytorch PR 179246; "
            "torch/_inductor/config.py autotune_cudagraph_benchmarking (2.14.1, 2.15.0)",
        env=("TORCHINDUCTOR_AUTOTUNE_CUDAGRAPH_BENCHMARKING",),
    ),
    Setting(
        "inductor.compile_threads", 16,
        "Inductor forks min(32, CPUs it sees) GPU-attached compile workers; in containers "
        "that see the host's CPUs that oversubscribes the GPU's queues and hangs autotuning. "
        "Capped at the CPUs this process may use and at 16, never raised",
        ref="pytorch PR 191493, PR 191385; torch/_inductor/config.py decide_compile_threads",
        at_most=True,
        cap_by=USABLE_CPUS,
        env=("TORCHINDUCTOR_COMPILE_THREADS",),
        env_wins=True,
    ),
    Setting(
        "dynamo.recompile_limit", 128,
        "models with many shapes or control-flow paths pass torch's 8 recompiles and fall "
        "back to eager silently; raised, never lowered (SGLang sets 1024)",
        ref="torch/_dynamo/config.py recompile_limit (cache_size_limit before PR 143709)",
        at_least=True,
        older_names=("cache_size_limit",),
    ),
)

# perf = safe, then these (a later entry for the same key wins where it applies).
PERF_EXTRA: Tuple[Setting, ...] = (
    Setting(
        "inductor.coordinate_descent_tuning", True,
        "tunes Triton block sizes/warps for steady-state speed; costs 2-4x first compile, "
        "bounded, unlike GEMM autotuning. Not on gfx11/gfx12 (divides by zero there)",
        ref=REF_CDT_GFX12,
        env=("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING",),
        not_on_archs=("gfx11", "gfx12"),
    ),
    Setting(
        "inductor.aggressive_fusion", True,
        "fuses kernels without shared reads: fewer launches",
        ref=NO_PUBLIC_REPORT + " for ROCm; AMD's tuning notes recommend it",
    ),
    Setting(
        "inductor.max_fusion_size", 128,
        "larger fused kernels than torch's 64; diminishing returns past 128",
        ref=NO_PUBLIC_REPORT + " for ROCm; AMD's tuning notes recommend it",
    ),
    Setting(
        "inductor.triton.multi_kernel", 1,
        "builds persistent and non-persistent reductions and picks at run time",
        ref=NO_PUBLIC_REPORT + " for ROCm; AMD's tuning notes recommend it",
        env=("TORCHINDUCTOR_MULTI_KERNEL",),
        broken_by="multi_kernel_warm_start",
    ),
    Setting(
        "inductor.shape_padding", True,
        "pads odd GEMM shapes; already torch's default, kept explicit",
        ref="torch's default (torch/_inductor/config.py)",
        env=("TORCHINDUCTOR_SHAPE_PADDING",),
    ),
    Setting(
        "inductor.freezing", True,
        "inference only (torch applies it under no_grad): weights become constants; "
        "do not mutate weights after compiling, or set INDUCTOR_FREEZING=0. It also "
        "bypasses AOTAutograd's cache, so a warm start traces again (8.6 s against 6.8 s "
        "without it, measured on an H100 with torch 2.11): INDUCTOR_FREEZING=0 trades it back",
        ref="torch/_inductor/config.py freezing; torch/_inductor/freezing.py; "
            "torch/_functorch/_aot_autograd/autograd_cache.py ('Cannot cache a graph with "
            "freezing enabled')",
        env=("TORCHINDUCTOR_FREEZING",),
    ),
    Setting(
        "dynamo.recompile_limit", 256,
        "more room for complex models; raised, never lowered",
        ref="torch/_dynamo/config.py recompile_limit",
        at_least=True,
        older_names=("cache_size_limit",),
    ),
)

# Keys from AMD's tuning notes deliberately left out of perf, with the reason (doctor).
LEFT_OUT: Dict[str, str] = {
    "inductor.benchmark_kernel": (
        "said to benchmark kernel variants; in torch 2.13 it only emits a benchmark "
        "harness into compiled modules (torch/_inductor/codegen/triton.py), so it tunes "
        "nothing"
    ),
    "inductor.group_fusion": (
        "marked '# Deprecated' in torch/_inductor/config.py and read nowhere in 2.13"
    ),
    # The environment rung: HIP runtime variables AMD's notes name. Each stays out until
    # public evidence for it was read here (none is set by either profile).
    "HSA_NO_SCRATCH_RECLAIM": (
        "not set: no public report verified for its effect on torch programs (serving "
        "and RCCL scripts set it for older MEC firmware); set it yourself where your RCCL "
        "jobs need it"
    ),
    "GPU_MAX_HW_QUEUES": (
        "not set: no public measurement verified of its effect on torch.compile'd "
        "programs (AMD's guidance names it for FSDP)"
    ),
    "HIP_FORCE_DEV_KERNARG": (
        "not set: no public measurement verified that it helps torch programs, nor that "
        "current ROCm runtimes still need it set"
    ),
    "TORCH_BLAS_PREFER_HIPBLASLT": (
        "not set: torch chooses its BLAS backend itself where it is unset "
        "(aten/src/ATen/Context.cpp blasPreferredBackend), and public reports set it both "
        "ways: on for throughput, off for stability on consumer GPUs"
    ),
}

# Keys that exist but that torch no longer reads: reported as no-ops, never "applied".
NOOP_KEYS: Dict[str, str] = {
    "inductor.group_fusion": "deprecated in torch and read nowhere (torch/_inductor/config.py, "
    "2.13); setting it does nothing",
}


# A profile's layers, in order: for each key the last entry that applies here wins (an
# entry with a condition that fails here leaves the earlier layer's value).
PROFILES: Dict[str, Tuple[Setting, ...]] = {
    "safe": SAFE,
    "perf": SAFE + PERF_EXTRA,
}


def keys(profile: str) -> Tuple[str, ...]:
    """The profile's keys, each once, in first-seen order."""
    return tuple(dict.fromkeys(s.key for s in PROFILES[profile]))
