"""The platform probe: is this torch a ROCm build, and which AMD GPU is here?

Reads only what is free to read: ``torch.version.hip``/``cuda`` (plain strings) and the
KFD sysfs topology. Never initialises HIP or CUDA (a program may fork after import).
"""

from __future__ import annotations

import glob
import os
from types import ModuleType
from typing import Dict, List, Optional

ENV_KFD = "ROCM_AUTOPATCH_KFD_TOPOLOGY"  # tests point this at a fake topology
DEFAULT_KFD = "/sys/class/kfd/kfd/topology/nodes"

# gfx_target_version (KFD) -> name: 90010 -> gfx90a.
KNOWN_GPUS = {
    "gfx908": "MI100",
    "gfx90a": "MI210/MI250/MI250X",
    "gfx940": "MI300 (early)",
    "gfx941": "MI300 (early)",
    "gfx942": "MI300X/MI300A/MI325X",
    "gfx950": "MI350X/MI355X",
}


def platform_of(torch: ModuleType) -> str:
    """"rocm", "cuda" or "cpu", from the build strings alone."""
    version = getattr(torch, "version", None)
    if getattr(version, "hip", None):
        return "rocm"
    if getattr(version, "cuda", None):
        return "cuda"
    return "cpu"


def torch_build(torch: ModuleType) -> Dict[str, Optional[str]]:
    """The report's description of ``torch``: platform, version and HIP version."""
    return {"platform": platform_of(torch),
            "torch_version": str(getattr(torch, "__version__", "unknown")),
            "hip_version": getattr(getattr(torch, "version", None), "hip", None)}


def gfx_name(target_version: int) -> str:
    """KFD's gfx_target_version (e.g. 90402) -> "gfx942"; minor/stepping are hex digits."""
    major, rest = divmod(target_version, 10000)
    minor, step = divmod(rest, 100)
    return f"gfx{major}{minor:x}{step:x}"


def gpu_archs(root: Optional[str] = None) -> List[Dict[str, str]]:
    """One entry per GPU node of the KFD topology; empty where there is none (or no AMD)."""
    root = root or os.environ.get(ENV_KFD) or DEFAULT_KFD
    found = []
    for props in sorted(glob.glob(os.path.join(root, "*", "properties"))):
        try:
            with open(props, encoding="ascii", errors="replace") as fh:
                fields = dict(line.split(None, 1) for line in fh if len(line.split()) == 2)
            target = int(fields.get("gfx_target_version", "0"))
        except (OSError, ValueError):
            continue
        if target <= 0:  # CPU nodes report 0
            continue
        name = gfx_name(target)
        found.append({"node": os.path.basename(os.path.dirname(props)), "arch": name,
                      "gpu": KNOWN_GPUS.get(name, "unknown")})
    return found
