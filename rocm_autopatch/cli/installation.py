"""Where rocm-autopatch is installed, and which start-up path activated this process.

Read with the standard metadata API (``importlib.metadata``: the distribution's own file
list, ``direct_url.json`` of PEP 610, ``INSTALLER``, its entry points), never by scanning
site directories. Everything used here is in the stdlib from Python 3.9, so the
``importlib-metadata`` backport is not needed. For the doctor; never loaded at start-up.
"""

from __future__ import annotations

import json
import os
import re
import site
import sys
from importlib import metadata
from typing import Any, Dict, List

import _rocm_autopatch_start
from rocm_autopatch import settings

DIST_NAME = "rocm-autopatch"
PTH, START, MODULE = "rocm_autopatch.pth", "rocm_autopatch.start", "_rocm_autopatch_start.py"
ENTRY_POINT_GROUP = "torch.backends"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def distributions() -> List[metadata.Distribution]:
    """Every installed copy on ``sys.path``, in ``sys.path`` order (the first is imported)."""
    found, seen = [], set()
    for dist in metadata.distributions():
        if _normalise(dist.metadata["Name"] or "") != DIST_NAME:
            continue
        where = os.path.realpath(str(dist.locate_file("")))
        if where not in seen:  # the same directory reached twice (a lib64 symlink)
            seen.add(where)
            found.append(dist)
    return found


def processed_site_dirs() -> List[str]:
    """Directories whose .pth files site runs in this interpreter (none under ``-S``)."""
    if sys.flags.no_site:
        return []
    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [os.path.realpath(d) for d in dirs]


def _in_use_dir() -> str:
    import rocm_autopatch

    return os.path.realpath(os.path.dirname(os.path.dirname(rocm_autopatch.__file__)))


def describe(dist: metadata.Distribution) -> Dict[str, Any]:
    # As sys.path names it (what a user recognises); compared by real path.
    location = os.path.abspath(str(dist.locate_file("")))
    real = os.path.realpath(location)
    files = {str(f): os.path.abspath(str(dist.locate_file(f))) for f in dist.files or ()}
    direct_url: Dict[str, Any] = {}
    try:
        direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        pass
    processed = real in processed_site_dirs()
    startup = {}
    for name in (PTH, START, MODULE):
        path = files.get(name)
        startup[name] = {"path": path, "exists": bool(path) and os.path.exists(path)}
    startup[PTH]["runs"] = startup[PTH]["exists"] and processed and sys.version_info < (3, 15)
    startup[START]["runs"] = startup[START]["exists"] and processed and sys.version_info >= (3, 15)
    entry_points = [f"{ep.name} = {ep.value}" for ep in dist.entry_points
                    if ep.group == ENTRY_POINT_GROUP]
    return {
        "version": dist.version,
        "location": location,
        "installer": (dist.read_text("INSTALLER") or "unknown").strip(),
        "editable": bool(direct_url.get("dir_info", {}).get("editable")),
        "source": direct_url.get("url"),
        "site_dir_processed": processed,
        "startup_files": startup,
        "entry_points": entry_points,
        "in_use": real == _in_use_dir(),
    }


def info() -> Dict[str, Any]:
    """What is installed and how start-up went; call before anything else starts the hook."""
    dists = [describe(d) for d in distributions()]
    trigger = _rocm_autopatch_start.installed()
    return {
        "distributions": dists,
        "duplicate": len(dists) > 1,
        "site_processed": not sys.flags.no_site,
        "autoload": settings.torch_autoload(),
        # Before the doctor's own start(): did a start-up path run in this process?
        "started_before_doctor": trigger is not None,
        "will_run": any(d["startup_files"][PTH]["runs"] or d["startup_files"][START]["runs"]
                        for d in dists),
    }
