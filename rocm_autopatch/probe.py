"""The platform probe: is this torch a ROCm build, and which AMD GPU is here?

Reads only what is free to read: ``torch.version.hip``/``cuda`` (plain strings) and the
KFD sysfs topology. Never initialises HIP or CUDA (a program may fork after import).
"""

from __future__ import annotations

import glob
import os
from types import ModuleType
from typing import Dict, List, Optional

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


def _setting(which: str) -> str:
    """A path of ``settings`` (``KFD_TOPOLOGY``, ``CGROUP_ROOT``; "" unset): where tests put
    a fake topology or cgroup tree. Loaded only here: deciding whether this is a ROCm build
    must not load the settings on every other build."""
    from rocm_autopatch import settings

    return (settings.raw(getattr(settings, which)) or "").strip()


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


# Triton's distributions: its own, and the names of torch's ROCm and CUDA wheels of it.
TRITON_DISTS = ("triton", "pytorch-triton-rocm", "pytorch-triton")


def triton_version() -> Optional[str]:
    """The installed Triton's version; None when there is none."""
    from importlib import metadata

    for dist in TRITON_DISTS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def gfx_name(target_version: int) -> str:
    """KFD's gfx_target_version (e.g. 90402) -> "gfx942"; minor/stepping are hex digits."""
    major, rest = divmod(target_version, 10000)
    minor, step = divmod(rest, 100)
    return f"gfx{major}{minor:x}{step:x}"


def gpu_archs(root: Optional[str] = None) -> List[Dict[str, str]]:
    """One entry per GPU node of the KFD topology; empty where there is none (or no AMD)."""
    root = root or _setting("KFD_TOPOLOGY") or DEFAULT_KFD
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


def arch_names(root: Optional[str] = None) -> List[str]:
    """The GPU architectures of the KFD topology ("gfx942", ...), each once."""
    return sorted({gpu["arch"] for gpu in gpu_archs(root)})


DEFAULT_CGROUP = "/sys/fs/cgroup"


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _own_cgroup_dirs(root: str) -> List[str]:
    """This process's cgroup directories under ``root`` (v2 first), then ``root`` itself."""
    dirs = []
    own = _read("/proc/self/cgroup") or ""
    for line in own.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/") and parts[2] != "/":
            controllers = parts[1].split(",")
            if parts[1] == "":
                dirs.append(os.path.join(root, parts[2].lstrip("/")))
            elif "cpu" in controllers:
                dirs.append(os.path.join(root, parts[1], parts[2].lstrip("/")))
    return dirs + [root]


def cgroup_cpu_limit(root: Optional[str] = None) -> Optional[float]:
    """CPUs allowed by the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``);
    None where there is no quota."""
    root = root or _setting("CGROUP_ROOT") or DEFAULT_CGROUP
    for d in _own_cgroup_dirs(root):
        for v2, quota_file, period_file in (
                (True, os.path.join(d, "cpu.max"), None),
                (False, os.path.join(d, "cpu.cfs_quota_us"), os.path.join(d, "cpu.cfs_period_us")),
                (False, os.path.join(d, "cpu", "cpu.cfs_quota_us"),
                 os.path.join(d, "cpu", "cpu.cfs_period_us"))):
            text = _read(quota_file)
            if text is None:
                continue
            try:
                if v2:
                    quota, _, period = text.partition(" ")
                    if quota == "max":
                        return None
                    return int(quota) / int(period or "100000")
                if int(text) < 0:
                    return None
                return int(text) / int(_read(period_file or "") or "100000")
            except (ValueError, ArithmeticError):  # absurd quotas: 0 periods, 400 digits
                return None
    return None


def usable_cpus(cgroup_root: Optional[str] = None) -> int:
    """The CPUs this process may really use: its affinity mask and its cgroup CPU quota
    (``torch._utils.cpu_count`` in 2.13 honours the first only)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup_root)
    if limit is not None:
        count = min(count, max(1, int(-(-limit // 1))))  # a quota of 2.5 CPUs -> 3 workers
    return max(1, count)
