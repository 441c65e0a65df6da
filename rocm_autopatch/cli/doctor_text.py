"""The doctor's report for people: sections at 80 columns, paths never wrapped (a user
copies them), marks for what the package changed (``~``), kept (``=``) or flags (``!``)."""

from __future__ import annotations

from typing import Any, Dict, List

from rocm_autopatch import settings
from rocm_autopatch.text import Verbatim, fit


def render(data: Dict[str, Any]) -> str:
    """The doctor's report at 80 columns (paths whole)."""
    r = data["report"]
    out = ["rocm-autopatch doctor", "", "Install"] + _install_lines(data["install"], r)
    for section in (_platform, _environment, _caches, _fixes, _config, _rewrites, _rules):
        out += [""] + section(data)
    if "torch_error" in data:
        out += ["", f"! {data['red_flags'][0]}"]
    out += ["", "healthy" if data["healthy"] else "RED FLAGS remain (see above)"]
    return "\n".join(fit(line) for line in out) + "\n"


def _platform(data: Dict[str, Any]) -> List[str]:
    r = data["report"]
    out = ["Platform",
            f"  python {data['python']}; torch {r.get('torch_version') or 'not importable'}"
            f" ({r.get('platform')}{', HIP ' + r['hip_version'] if r.get('hip_version') else ''})"]
    gpus = data["gpus"]
    out.append("  GPUs (KFD): " + (", ".join(f"{g['arch']} ({g['gpu']})" for g in gpus)
                                   if gpus else "unknown (no KFD topology)"))
    out.append(f"  active: {'yes' if r['active'] else 'no'}; profile: {r['profile']}")
    out.append(f"  {r['reason']}")
    out += [f"  ! {note}" for note in data.get("notes", [])]
    return out


def _environment(data: Dict[str, Any]) -> List[str]:
    out = ["Environment"]
    for row in data["environment"]:
        mark = {"ok": "  ", "neutralised": "~ ", "kept": "= ", "red": "! "}[row["flag"]]
        out.append(f"  {mark}{row['name']}={row['value'][:40]}")
        if row["note"]:
            out.append(f"      {row['note']}")
    if not data["environment"]:
        out.append("  (no TORCH/INDUCTOR/TRITON/OMP/MKL or ROCM_AUTOPATCH variables set)")
    return out


def _caches(data: Dict[str, Any]) -> List[str]:
    where = data["caches"]
    out = ["Compile caches (Inductor, Triton)", f"  {where['inductor']}",
           f"  {where['triton']}"]
    if where["temporary"]:
        out.append(f"      under a temporary directory: a new container compiles everything "
                   f"again; {settings.CACHE}=DIR keeps them in a directory you mount")
    if "torch_error" in data:
        return out
    skipping = where.get("skipping_dynamo") or {}
    out.append("  a warm start traces each compiled frame again (Dynamo); the rest comes "
               "from the caches" + ("" if skipping else
                                    ": this torch has no way to skip the tracing"))
    for name, why in skipping.items():
        out.append(f"      torch's {name}: {why}")
    return out


def _fixes(data: Dict[str, Any]) -> List[str]:
    remembered = data["fixes"]
    out = [f"Remembered fixes ({remembered['store'] or settings.FIXES + '=off'})"]
    for fix in remembered["fixes"]:
        out.append(f"  graph {fix.get('fingerprint')}: {fix['what']}"
                   + (f" [not applied: {fix['stale']}]" if fix["stale"] else ""))
        out.append(f"      {fix.get('answer', '')}")
        out.append(Verbatim(f"      at {fix.get('where') or '?'}"))
    if remembered["fixes"]:
        out.append("      (`rocm-autopatch forget GRAPH` or `--all` forgets)")
    else:
        out.append("  none (`rocm-autopatch bisect DIR` finds and remembers them)")
    return out


def _heading(data: Dict[str, Any], title: str, untouched: str) -> List[str]:
    """A section's title, and what stands where the package applied nothing."""
    return [title] + ([] if data["report"]["active"] else [f"  nothing applied: {untouched}"])


def _config(data: Dict[str, Any]) -> List[str]:
    r = data["report"]
    out = _heading(data, "Configuration (key: before -> after, source, status)",
                   "torch's own configuration is in use")
    for c in r["config"]:
        line = f"  {c['key']}: {c['before']!r} -> {c['after']!r}, {c['source']}, {c['status']}"
        out.append(line)
        if c.get("reason") and (c["status"] in ("skipped", "failed")
                                or "not used on" in c["reason"]):
            out.append(f"      {c['reason']}")
        if c["status"] == "applied" and c.get("why"):
            out.append(f"      why: {c['why']}" + (f" [{c['ref']}]" if c.get("ref") else ""))
    gemm = data["gemm_backends"]
    if gemm.get("known"):
        used = gemm["templates_used"]
        out.append(f"  GEMM backends: {','.join(gemm['listed'])}; autotuning "
                   f"{'on' if gemm['autotuning'] else 'off'}: " + (
                       f"template backends in use: {', '.join(used)}" if used else
                       "no template backend in use (ATen only)")
                   + ("; FlyDSL (torch 2.15+, ROCm, experimental): "
                      + ("a candidate" if gemm["flydsl_candidate"] else "not used")
                      if gemm["flydsl_in_this_torch"] else ""))
    return out


def _rewrites(data: Dict[str, Any]) -> List[str]:
    r = data["report"]
    out = _heading(data, "torch.compile rewrites and fixes", "torch.compile is torch's own")
    for name, fix in r["fixes"].items():
        ref = f" [{fix['ref']}]" if fix.get("ref") else ""
        out.append(f"  {name}: {fix['status']}: {fix['reason']}{ref}")
    for rw in r["compile_rewrites"]:
        out.append(f"  {rw['before']} -> {rw['after']} x{rw['count']} at {rw['call_site']}")
        if rw.get("reason"):
            out.append(f"      why: {rw['reason']}")
    for where, count in r.get("eager_in_capture", {}).items():
        out.append(f"  ran eagerly during graph capture x{count}: {where}")
    for err in r["errors"]:
        out.append(f"  ERROR {err}")
    return out


def _install_lines(inst: Dict[str, Any], report: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    for d in inst["distributions"]:
        kind = ", editable" if d["editable"] else ""
        use = " [in use]" if d["in_use"] else " [not in use: another copy comes first]"
        out.append(f"  rocm-autopatch {d['version']} ({d['installer']}{kind}){use}")
        # Paths are never wrapped: a user copies them, and a venv can be deeper than 80.
        out.append(Verbatim(f"    {d['location']}"))
        files = d["startup_files"]
        pth = files["rocm_autopatch.pth"]
        out.append("    start-up: .pth " + ("runs" if pth["runs"] else "present, not run here "
                                              "(directory not processed by site, or -S)"
                                              if pth["exists"] else "missing")
                   + "; .start " + ("present (Python 3.15+)" if files["rocm_autopatch.start"]
                                    ["exists"] else "missing")
                   + "; torch.backends entry point " + ("yes" if d["entry_points"] else "no"))
    if not inst["distributions"]:
        out.append("  rocm-autopatch has no installed distribution on sys.path (a source tree?)")
    if inst["duplicate"]:
        out.append(f"  ! installed {len(inst['distributions'])} times (e.g. user site and a venv "
                   "with --system-site-packages): applied once, by the copy in use; uninstall "
                   "the other to avoid mixing versions")
    act = inst.get("activation") or {}
    reached = f"{act['via']} (reached by: {', '.join(act['reached'])})" if act.get("via") \
        else ""
    if not reached:
        out.append(f"  start-up: no start-up path ran; ROCM_AUTOPATCH mode: {inst.get('mode')}")
    elif report.get("active"):
        out.append(f"  activated by: {reached}; ROCM_AUTOPATCH mode: {inst.get('mode')}")
    else:
        out.append(f"  start-up: {reached} ran, found no ROCm build and applied nothing "
                   f"(ROCM_AUTOPATCH mode: {inst.get('mode')})")
    if not inst["autoload"]:
        out.append("  TORCH_DEVICE_BACKEND_AUTOLOAD=0: torch's autoload path is off (the .pth "
                   "and the launcher still work)")
    return out


def _rules(data: Dict[str, Any]) -> List[str]:
    """Rules that are not config keys: Triton pipelining, and what was left out (with why)."""
    out = ["Rules without a config key"]
    for risk in data.get("pipelining", []):
        mark = "! " if risk["status"] == "red" else "  "
        out.append(f"  {mark}Triton pipelining: {risk['status']}: {risk['reason']} "
                   f"[{risk['ref']}]")
    for name, why in data.get("left_out", {}).items():
        out.append(f"  left out: {name}: {why}")
    return out
