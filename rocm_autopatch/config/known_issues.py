"""Known issues of the AMD stack that a profile's settings do not reach, or reach only while
a program keeps them away: each with the GPUs, Triton and ROCm releases it was reported
for and its public source, judged here against the running ones. The doctor lists the
judgement, a red flag where an issue can bite this program; the inductor-config hook warns
once about each red one (``warn_about``); ``triton_env`` sets the one variable that prevents
an issue where Inductor's own kernels would meet it.

Version bounds come from the sources named in ``ref`` (release branches and dates); a
bound we could not read in a release's own source says so in ``ref``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

from rocm_autopatch import torch_releases

Release = Tuple[int, int]

# What a program must use for an issue to reach it.
ANY = ""  # any use of the GPU's compiled or library code
TEMPLATES = "templates"  # Inductor's Triton GEMM templates, autotuned (not ATen GEMMs)
TF32 = "tf32"  # TF32 GEMMs allowed on ROCm (HIPBLASLT_ALLOW_TF32=1)


class Issue(NamedTuple):
    name: str  # how the doctor names it
    archs: Tuple[str, ...]  # GPU architectures (prefixes) it was reported on
    what: str
    ref: str
    fix: str  # what a user can do where it bites
    triton: Optional[Tuple[Release, Release]] = None  # Triton releases, first and last
    triton_dev: bool = False  # only development builds of those releases ("+git...")
    rocm: Tuple[Release, ...] = ()  # HIP releases it was reported on (() = any)
    needs: str = ANY  # what the program must use (TEMPLATES, TF32)
    off_by: str = ""  # a variable that, set to "0", keeps it away (``triton_env``)


# Triton pipelining: Inductor pipelines (num_stages > 1) only its Triton GEMM and conv
# templates (torch/_inductor/template_heuristics/triton.py ROCmConfigHeuristic takes
# num_stages from Triton's AMD backend default) and flex attention's autotuned configs; its
# pointwise and reduction kernels use num_stages=1 (torch/_inductor/runtime/
# triton_heuristics.py triton_config). No Inductor key bounds num_stages: both profiles'
# max_autotune_gemm_backends=ATEN keep it away, and the doctor says where a program turns
# the templates back on for an affected Triton and GPU.
ISSUES: Tuple[Issue, ...] = (
    Issue("Triton pipelining", ("gfx90a", "gfx942", "gfx11", "gfx12"),
          "the AMD software pipeliner crashes compiling kernels with 4 or more loads at "
          "num_stages=4 (reported on gfx90a and gfx1201, Triton 3.6)",
          "triton-lang/triton#9815 (open); vllm-project/vllm PR 45017",
          "let the profile keep GEMMs on ATen (unset INDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS)",
          triton=((3, 6), (3, 6)), needs=TEMPLATES),
    Issue("Triton pipelining", ("gfx950",),
          "pipelined kernels fail the verifier (a crash) or compute deterministic wrong "
          "values on gfx950 with Triton 3.7; num_stages=1 avoids both",
          "ROCm/aiter PR 4163",
          "let the profile keep GEMMs on ATen (unset INDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS)",
          triton=((3, 7), (3, 7)), needs=TEMPLATES),
    Issue("Triton block pingpong", ("gfx942",),
          "the two-cluster block-pingpong schedule races on LDS in Inductor's mm template "
          "shape (128x128x64 blocks, 8 warps, 2 stages): wrong 4x32 patches in every tile, "
          "200 of 200 runs; TRITON_HIP_USE_BLOCK_PINGPONG=0 avoids it (0 of 200). On by "
          "default for gfx942 since triton PR 5696 (January 2025: Triton 3.3, read from its "
          "date); fixed by triton PR 11765 (September 2026), after Triton 3.8.0 was released",
          "triton-lang/triton#11696, PR 11765; pytorch PR 196673",
          "TRITON_HIP_USE_BLOCK_PINGPONG=0 in the environment before the first compile "
          "(Inductor's compile workers copy it once, when they start), or GEMMs on ATen",
          triton=((3, 3), (3, 8)), needs=TEMPLATES, off_by="TRITON_HIP_USE_BLOCK_PINGPONG"),
    Issue("gfx950 bf16 NaN", ("gfx950",),
          "an LLVM AMDGPU hazard regression (llvm-project#197267) in Triton builds that "
          "carry LLVM 62b7cf96 without its fix makes torch.compile'd bf16 models return "
          "NaN silently on MI350; released Triton 3.8.0 carries the fix (triton PR 10719 "
          "on release/3.8.x, June 2026, before the release): development builds of 3.8 may "
          "not",
          "pytorch#187401; triton-lang/triton PR 10719; llvm/llvm-project PR 203770",
          "a released Triton (3.8.0 or later), or a development build made after the fix",
          triton=((3, 8), (3, 8)), triton_dev=True),
    Issue("hipBLASLt bf16 split-K", ("gfx950",),
          "bf16 GEMMs with a large K (split-K solutions) return NaN on MI355X; fp32 and fp16 "
          "are clean; present in ROCm 7.12 and 7.13, not in 7.2",
          "ROCm/rocm-libraries#9055",
          "a ROCm without it (7.2 is not affected); no setting of torch's or ours chooses "
          "hipBLASLt's solutions",
          rocm=((7, 12), (7, 13))),
    Issue("hipBLASLt TF32 NT", ("gfx950",),
          "fp32 GEMMs run as TF32 (HIPBLASLT_ALLOW_TF32=1, with torch's float32 matmul "
          "precision 'high' or allow_tf32) drop alpha when beta != 0 in the NT kernels "
          "on gfx950 (an addmm that scales its result): wrong columns past the first tile",
          "ROCm/rocm-libraries#12226 (open); the variable: pytorch PR 139869",
          "unset HIPBLASLT_ALLOW_TF32 (fp32 GEMMs then run in full precision); rocm-autopatch "
          "leaves it as set: TF32 is a precision you or your framework chose",
          needs=TF32),
)

# Reported, read, and not a rule: what a program reads in the doctor's "left out" lines.
LEFT_OUT: Dict[str, str] = {
    "triton-lang/triton#9887": (
        "stale reads across wavefronts (num_warps > 4) between two loops of one kernel that "
        "store and then load one buffer: Triton's maintainers call it the language's "
        "semantics (a tl.debug_barrier() is the kernel author's), and no Inductor kernel "
        "was found to depend on it"),
}


def _in(release: Release, bounds: Tuple[Release, Release]) -> bool:
    return bounds[0] <= release <= bounds[1]


def judge(triton: Optional[str], hip: Optional[str], archs: List[str], templates: bool,
          environ: Mapping[str, str]) -> List[Dict[str, Any]]:
    """Each issue here: ``not needed`` (another GPU, Triton or ROCm), ``kept off`` (it needs
    what the program does not use, or its variable keeps it away) or ``red``."""
    found = []
    for issue in ISSUES:
        hit = [a for a in archs if a.startswith(issue.archs)]
        reason = ""
        if not hit:
            reason = f"not on {', '.join(archs) or 'this machine: no AMD GPU found'}"
        elif issue.triton and not (
                triton and _in(torch_releases.release(triton), issue.triton)
                and (not issue.triton_dev or "+git" in triton or ".dev" in triton)):
            reason = f"Triton {triton or 'is not installed'}"
        elif issue.rocm and torch_releases.release(hip) not in issue.rocm:
            reason = f"ROCm (HIP) {hip or 'not in this torch'}"
        status = "not needed" if reason else "red"
        if status == "red" and issue.off_by and environ.get(issue.off_by, "").strip() == "0":
            status, reason = "kept off", f"{issue.off_by}=0 is set"
        elif status == "red" and issue.needs == TEMPLATES and not templates:
            status, reason = "kept off", ("GEMMs run on ATen: Inductor's Triton GEMM "
                                          "templates are not used")
        elif status == "red" and issue.needs == TF32 and environ.get(
                "HIPBLASLT_ALLOW_TF32", "").strip() != "1":
            status, reason = "kept off", "TF32 GEMMs are not allowed (HIPBLASLT_ALLOW_TF32)"
        elif status == "red":
            reason = (f"{', '.join(hit)}, Triton {triton or 'none'}, HIP {hip or 'none'}: "
                      f"{issue.what}. Fix: {issue.fix}")
        found.append({"name": issue.name, "status": status, "reason": reason,
                      "ref": issue.ref, "what": issue.what})
    return found


def warn_about(found: List[Dict[str, Any]], warn: Callable[[Any, str], Any]) -> None:
    """One warning for each issue that can bite this process."""
    for row in found:
        if row["status"] == "red":
            warn(("known_issue", row["name"]), f"{row['name']}: {row['reason']} "
                 f"[{row['ref']}]")
