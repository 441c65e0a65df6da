"""The doctor's report for people, at 80 columns with paths never wrapped (a user copies
them): by default one screen (what is active, what it changed, the variables that matter,
the red flags last, each with its fix); ``--verbose`` adds every section in full (each key
with its reason and public source, the rules without a config key, the caches, the
remembered fixes). Marks: ``~`` a variable the package overrode, ``=`` one kept because you
asked, ``!`` a red flag."""

from __future__ import annotations

from typing import Any, Dict, List

from rocm_autopatch import settings
from rocm_autopatch.text import Verbatim, fit

MARKS = {"ok": "  ", "neutralised": "~ ", "kept": "= ", "red": "! "}


def render(data: Dict[str, Any], verbose: bool = False) -> str:
    """The doctor's report at 80 columns (paths whole): one screen, or every section."""
    if verbose:
        r = data["report"]
        out = ["rocm-autopatch doctor", "", "Install"] + _install_lines(data["install"], r)
        for section in (_platform, _environment, _caches, _fixes, _config, _rewrites, _rules):
            out += [""] + section(data)
    else:
        out = _summary(data)
    out += [""] + _red_flags(data, verbose)
    return "\n".join(fit(line) for line in out) + "\n"


def _summary(data: Dict[str, Any]) -> List[str]:
    """One screen: who is active and where from, what changed, what the user set."""
    r, inst = data["report"], data["install"]
    torch = r.get("torch_version") or "not importable"
    build = f"{r.get('platform')}{', HIP ' + r['hip_version'] if r.get('hip_version') else ''}"
    gpus = ", ".join(f"{g['arch']} ({g['gpu']})" for g in data["gpus"]) or "none found"
    act = inst.get("activation") or {}
    where = next((d for d in inst["distributions"] if d["in_use"]), None)
    out = [f"rocm-autopatch {data['version']} doctor: "
           f"{'active' if r['active'] else 'not active'}, profile {r['profile']}",
           f"  {r['reason']}",
           f"  torch {torch} ({build}); Python {data['python']}; AMD GPUs: {gpus}",
           "  started by " + (f"{act['via']}" if act.get("via") else "no start-up path")
           + (f" ({where['installer']} install)" if where else ""),
           Verbatim(f"      {where['location']}") if where else "  not installed (a source "
           "tree?)"]
    out += [f"  ! {note}" for note in data.get("notes", [])]
    if inst["duplicate"]:
        out.append(f"  ! installed {len(inst['distributions'])} times: applied once, by the "
                   "copy in use; uninstall the other (--verbose lists both)")
    out += ["", "What it changed" + ("" if r["active"] else ": nothing (torch's own "
                                     "configuration and torch.compile are in use)")]
    if r["active"]:
        out += _changed(data)
    rows = [row for row in data["environment"] if row["flag"] != "ok"
            or row["name"].startswith(settings.MODE)]
    if rows:
        out += ["", "Variables that matter (~ overridden, = kept as you asked, ! red flag)"]
        for row in rows:
            out.append(f"  {MARKS[row['flag']]}{row['name']}={row['value'][:40]}")
            if row["flag"] in ("neutralised", "kept"):  # red ones: their note is a red flag
                out.append(f"      {row['note']}")
    return out


def _changed(data: Dict[str, Any]) -> List[str]:
    r = data["report"]
    moved = [c for c in r["config"] if c["status"] == "applied"]
    out = [f"  {c['key']}: {c['before']!r} -> {c['after']!r}" for c in moved]
    count = {status: sum(c["status"] == status for c in r["config"])
             for status in ("unchanged", "skipped", "failed", "pending")}
    out.append(f"  ({count['unchanged']} more keys already had the {r['profile']} value"
               + "".join(f"; {n} {status}" for status, n in count.items()
                         if n and status != "unchanged") + ")")
    by_status: Dict[str, List[str]] = {}
    for name, fix in r["fixes"].items():
        by_status.setdefault(fix["status"], []).append(name)
    out.append("  fixes: " + ("; ".join(f"{status}: {', '.join(names)}"
                                        for status, names in by_status.items()) or "none"))
    rewrites = sum(rw["count"] for rw in r["compile_rewrites"])
    if rewrites:
        out.append(f"  torch.compile calls rewritten in this process: {rewrites}")
    caches = data["caches"]
    out.append(f"  compile caches: {caches['inductor']}"
               + (" (temporary: lost with the container)" if caches["temporary"] else ""))
    remembered = data["fixes"]["fixes"]
    if remembered:
        out.append(f"  remembered fixes: {len(remembered)} (rocm-autopatch forget --all)")
    return out + _rungs(data)


def _rungs(data: Dict[str, Any]) -> List[str]:
    """The store of rungs remembered across processes, where it holds any."""
    kept = data.get("rungs") or {}
    if not kept.get("graphs"):
        return []
    return [f"  remembered rungs: {kept['graphs']} graph{'s' if kept['graphs'] != 1 else ''}"
            f" (the sentinel's ladders start there; delete the file or set "
            f"{settings.RUNGS}=off to start over)", Verbatim(f"      {kept['store']}")]


def _red_flags(data: Dict[str, Any], verbose: bool) -> List[str]:
    """The red flags, listed last and in full, and where to read more."""
    flags = data["red_flags"]
    more = ("" if verbose else "why each change, with its public source: "
            "`rocm-autopatch doctor --verbose`; everything: `--json`")
    if not flags:
        return ["healthy" + (f"; {more}" if more else "")]
    out = [f"Red flags ({len(flags)}; exit status 1)"] + [f"  ! {flag}" for flag in flags]
    return out + ([more] if more else [])


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
        out.append(f"  {MARKS[row['flag']]}{row['name']}={row['value'][:40]}")
        if row["note"]:
            out.append(f"      {row['note']}")
    if not data["environment"]:
        out.append("  (no TORCH/INDUCTOR/TRITON/OMP/MKL or ROCM_AUTOPATCH variables set)")
    return out


def _caches(data: Dict[str, Any]) -> List[str]:
    where = data["caches"]
    out = ["Compile caches (Inductor, Triton)", f"  {where['inductor']}",
           f"  {where['triton']}"]
    if where["temporary"] and not where.get("asked"):
        out.append(f"      under a temporary directory: a new container compiles everything "
                   f"again; {settings.CACHE}=DIR keeps them in a directory you mount")
    elif where["temporary"]:
        out.append(f"      under a temporary directory: {settings.CACHE} is set but could "
                   "not be used (see the red flags)")
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
    return out + _rungs(data)


def _heading(data: Dict[str, Any], title: str, untouched: str) -> List[str]:
    """A section's title, and what stands where the package applied nothing."""
    return [title] + ([] if data["report"]["active"] else [f"  nothing applied: {untouched}"])


def _config(data: Dict[str, Any]) -> List[str]:
    r = data["report"]
    out = _heading(data, "Configuration (key: before -> after, source, status)",
                   "torch's own configuration is in use")
    same = [c["key"] for c in r["config"] if c["status"] == "unchanged"
            and "not used on" not in (c.get("reason") or "")]
    for c in r["config"]:
        if c["key"] in same:
            continue
        line = f"  {c['key']}: {c['before']!r} -> {c['after']!r}, {c['source']}, {c['status']}"
        out.append(line)
        if c.get("reason") and (c["status"] in ("skipped", "failed")
                                or "not used on" in c["reason"]):
            out.append(f"      {c['reason']}")
        if c["status"] == "applied" and c.get("why"):
            out.append(f"      why: {c['why']}" + (f" [{c['ref']}]" if c.get("ref") else ""))
    if same:
        out.append(f"  already as the profile wants (unchanged): {', '.join(same)}")
    gemm = data["gemm_backends"]
    if gemm.get("known"):
        used = gemm["templates_used"]
        out.append(f"  GEMM backends listed: {','.join(gemm['listed'])}; " + (
                       f"autotuned (templates in use: {', '.join(used)})" if used else
                       "GEMMs run on ATen (no autotuning)")
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
    """Known issues judged here (``config.known_issues``), and what was left out (with why)."""
    out = ["Known issues (by GPU, Triton and ROCm) and rules without a config key"]
    quiet = [r for r in data.get("known_issues", []) if r["status"] == "not needed"]
    for row in data.get("known_issues", []):
        if row not in quiet:
            mark = "! " if row["status"] == "red" else "  "
            out.append(f"  {mark}{row['name']}: {row['status']}: {row['reason']} "
                       f"[{row['ref']}]")
    if quiet:
        out.append("  not needed here: " + "; ".join(
            f"{r['name']} ({r['reason']})" for r in quiet))
    for name, why in data.get("left_out", {}).items():
        out.append(f"  left out: {name}: {why}")
    return out
