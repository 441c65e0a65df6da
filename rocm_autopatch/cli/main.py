"""The command line: ``rocm-autopatch doctor`` (what is installed, detected and changed),
``run`` (the launcher, see ``launcher``), ``selftest``, ``bisect`` (the compiler step that
makes a sentinel's repro wrong, ``sentinel.bisect``) and ``forget`` (remembered fixes).

``doctor`` imports torch and its compiler config in its own process, so the report it
prints is the one a script would get in this environment. ``--json`` for machines.
Exit status: 0 healthy, 1 a red flag that rocm-autopatch did not neutralise, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from _rocm_autopatch_start import say
from rocm_autopatch.config import caches, profiles, settings
from rocm_autopatch.text import Verbatim, fit

# Environment variables that turn on what the safe profile turns off, when set to "1",
# and why (with the public evidence). The key that neutralises each: the safe profile's.
RED_FLAGS: Dict[str, str] = {
    "TORCHINDUCTOR_MAX_AUTOTUNE": "GEMM autotuning on every compile: minutes-long "
    "compiles, crashes (ROCm/pytorch#3548)",
    "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE": "pointwise autotuning: long compiles "
    "(ROCm/pytorch#3548)",
    "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM": "GEMM autotuning (ROCm/pytorch#3548)",
    "TORCHINDUCTOR_CUDAGRAPHS": "Inductor CUDA graphs on HIP (pytorch#185074, #187715)",
    "TORCHINDUCTOR_MEMORY_PLANNING": "memory planning, off by default in torch (no public "
    "report of a failure)",
}
# A variable is audited when one of the words of its name (split at "_") is one of these,
# or it is ours: whole words, so VIRTUAL_ENV_PROMPT is not an OMP variable.
AUDIT_WORDS = frozenset(("TORCH", "PYTORCH", "TORCHINDUCTOR", "TORCHDYNAMO", "INDUCTOR",
                         "AUTOTUNE", "TRITON", "OMP", "MKL"))


def audited(name: str) -> bool:
    return name.startswith(settings.MODE) or not AUDIT_WORDS.isdisjoint(
        name.upper().split("_"))


def environment_audit(report: Dict[str, Any], environ: Dict[str, str]
                      ) -> List[Dict[str, Any]]:
    """The variables that matter here, as the user's shell set them (``environ`` is read
    before torch is imported: torch sets some itself, TORCHINDUCTOR_CACHE_DIR among them)."""
    config = {c["key"]: c for c in report.get("config", [])}
    key_of = {var: setting.key for setting in profiles.SAFE for var in setting.env}
    rows = []
    for var in sorted(environ):
        if not audited(var):
            continue
        value = environ[var]
        row: Dict[str, Any] = {"name": var, "value": value, "flag": "ok", "note": ""}
        if var in settings.BY_NAME:  # ours: what it means, and a bad value flagged
            found = settings.read(var, environ)
            row["note"] = found.problem or settings.BY_NAME[var].meaning
            row["flag"] = "red" if found.problem else "ok"
        if var in caches.FORCE_VARS and value.strip() == "1" and (
                report.get("platform") == "rocm" or report.get("forced")):
            keep = environ.get(caches.KEEP_OFF, "").strip().lower() in settings.TRUE_WORDS
            row["flag"] = "kept" if keep else "red"
            row["note"] = ("every compile cache is off: each run and each rank compiles "
                           "everything again" + (f"; kept as you asked ({caches.KEEP_OFF}=1)"
                                                 if keep else
                                                 f"; fix: unset {var} (torch pins it; "
                                                 f"{caches.KEEP_OFF}=1 keeps it)"))
        why = RED_FLAGS.get(var)
        if why and value.strip() == "1" and not (
                report.get("platform") not in ("rocm", "unknown") and not report.get("forced")):
            entry = config.get(key_of[var])
            done = (report.get("active") and entry is not None
                    and entry["status"] in ("applied", "unchanged")
                    and entry["source"] != "override")
            kept = (report.get("active") and entry is not None and entry["status"] == "skipped"
                    and entry["source"] == "environment")
            row["flag"] = "neutralised" if done else "kept" if kept else "red"
            row["note"] = why + ("; overridden by rocm-autopatch" if done else
                                 f"; kept as you asked: {entry['reason']}" if kept else
                                 f"; fix: unset {var} or let rocm-autopatch run")
        rows.append(row)
    return rows


def collect(profile: Optional[str]) -> Dict[str, Any]:
    if profile:
        settings.export(settings.PROFILE, profile)  # this process only
    from rocm_autopatch import probe
    from rocm_autopatch.cli import installation
    from rocm_autopatch.reporting import record
    from rocm_autopatch.startup import bootstrap

    environ = settings.environment()  # as the shell set it: torch's import adds some
    data: Dict[str, Any] = {"install": installation.info(), "python": sys.version.split()[0]}
    bootstrap.start("doctor")  # where the .pth already ran: recorded, nothing more
    try:
        import torch
        import torch._dynamo.config  # noqa: F401 - imported to apply and report the config
        import torch._inductor.config  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - no torch here is a finding, not a crash
        data["torch_error"] = repr(exc)
    _numerics_sentinel(record)
    data["install"]["activation"] = bootstrap.activation()
    data["install"]["mode"] = bootstrap.mode if bootstrap.started else bootstrap.parse_mode(
        environ.get(bootstrap.ENV_MODE, ""))
    report = record.REPORT.to_dict()
    torch_module = sys.modules.get("torch")
    if report["platform"] == "unknown" and torch_module is not None:
        # The hooks did not run (ROCM_AUTOPATCH=0): the doctor still says what torch is.
        report.update(probe.torch_build(torch_module))
    if data["install"]["mode"] == "off":
        report["reason"] = f"turned off by {bootstrap.ENV_MODE}={environ[bootstrap.ENV_MODE]}"
    data["report"] = report
    data["gpus"] = probe.gpu_archs()
    data["gemm_backends"] = gemm_backends(sys.modules.get("torch._inductor.config"))
    data["environment"] = environment_audit(report, environ)
    data["caches"] = caches.where_now()  # after activation: ROCM_AUTOPATCH_CACHE applied
    data["fixes"] = _fixes()
    data["left_out"] = profiles.LEFT_OUT
    data["red_flags"] = [f"{r['name']}: {r['note']}" for r in data["environment"]
                         if r["flag"] == "red"]
    if "torch_error" in data:
        data["red_flags"].insert(0, (
            f"torch cannot be imported by this Python ({sys.executable}): "
            f"{data['torch_error']}. rocm-autopatch acts on the torch of the environment it is "
            "installed in: install it where your torch is (that environment's pip), or "
            "install torch here"))
    data["healthy"] = not data["red_flags"]
    return data


# GEMM template backends torch can autotune besides ATen, with what they are; FlyDSL is new
# in torch 2.15 (torch/_inductor/config.py: "FlyDSL templates for ROCm GPUs (experimental)").
TEMPLATE_BACKENDS = ("TRITON", "CK", "CKTILE", "FLYDSL", "CUTLASS", "CUTEDSL", "NVGEMM", "CPP")


def gemm_backends(config: Any) -> Dict[str, Any]:
    """Which GEMM backends this process's torch would autotune, as torch reads them
    (``torch/_inductor/utils.py`` ``_use_autotune_backend``: listed in
    ``max_autotune_gemm_backends`` and autotuning on)."""
    if config is None:
        return {"known": False}
    listed = [b.strip().upper() for b in str(config.max_autotune_gemm_backends).split(",")]
    tuning = bool(getattr(config, "max_autotune", False)
                  or getattr(config, "max_autotune_gemm", False))
    templates = [b for b in listed if b in TEMPLATE_BACKENDS]
    return {"known": True, "listed": listed, "autotuning": tuning,
            "templates_used": templates if tuning else [],
            "flydsl_in_this_torch": hasattr(config, "flydsl_enable_autotuning"),
            # torch then tries it on ROCm gfx950 (torch/_inductor/utils.py use_flydsl_gemm_template)
            "flydsl_candidate": tuning and "FLYDSL" in listed
            and hasattr(config, "flydsl_enable_autotuning")}


def _numerics_sentinel(record: Any) -> None:
    """The sentinel's line: installed where the variable asks for it (its hook fires when
    Inductor's compile_fx is imported), otherwise said to be off."""
    from rocm_autopatch import log
    from rocm_autopatch.sentinel import status

    if record.REPORT.active and log.setting(settings.VERIFY) != "off":
        try:
            import torch._inductor.compile_fx  # noqa: F401 - the hook installs the sentinel
        except Exception:  # noqa: BLE001 - a broken torch is reported elsewhere
            pass
    if status.NAME not in record.REPORT.fixes:
        record.fix(status.NAME, record.OFF, f"{settings.VERIFY} is unset: compiled graphs are "
                   "not compared with eager (check: warn about a graph that computes wrong "
                   "numbers; fallback: also run it eagerly)", status.REF)


def _fixes() -> Dict[str, Any]:
    """The remembered fixes (``rocm-autopatch bisect``), and which apply here."""
    from rocm_autopatch.sentinel import fixes

    where = fixes.path()
    try:
        now = fixes.here()
    except Exception:  # noqa: BLE001 - no torch: nothing can apply
        now = None
    listed = []
    for fix in fixes.load(where):
        listed.append({**fix, "what": fixes.describe(fix["change"]),
                       "stale": fixes.stale(fix, now) if now else "torch is not importable"})
    return {"store": where, "fixes": listed}


def _human(data: Dict[str, Any]) -> str:
    r = data["report"]
    inst = data["install"]
    out = ["rocm-autopatch doctor", "", "Install"] + _install_lines(inst, r)
    out += ["", "Platform",
            f"  python {data['python']}; torch {r.get('torch_version') or 'not importable'}"
            f" ({r.get('platform')}{', HIP ' + r['hip_version'] if r.get('hip_version') else ''})"]
    gpus = data["gpus"]
    out.append("  GPUs (KFD): " + (", ".join(f"{g['arch']} ({g['gpu']})" for g in gpus)
                                   if gpus else "unknown (no KFD topology)"))
    out.append(f"  active: {'yes' if r['active'] else 'no'}; profile: {r['profile']}")
    out.append(f"  {r['reason']}")
    out += ["", "Environment"]
    for row in data["environment"]:
        mark = {"ok": "  ", "neutralised": "~ ", "kept": "= ", "red": "! "}[row["flag"]]
        out.append(f"  {mark}{row['name']}={row['value'][:40]}")
        if row["note"]:
            out.append(f"      {row['note']}")
    if not data["environment"]:
        out.append("  (no TORCH/INDUCTOR/TRITON/OMP/MKL or ROCM_AUTOPATCH variables set)")
    where = data["caches"]
    out += ["", "Compile caches (Inductor, Triton)", f"  {where['inductor']}",
            f"  {where['triton']}"]
    if where["temporary"]:
        out.append(f"      under a temporary directory: a new container compiles everything "
                   f"again; {settings.CACHE}=DIR keeps them in a directory you mount")
    remembered = data["fixes"]
    out += ["", f"Remembered fixes ({remembered['store'] or settings.FIXES + '=off'})"]
    for fix in remembered["fixes"]:
        out.append(f"  graph {fix.get('fingerprint')}: {fix['what']}"
                   + (f" [not applied: {fix['stale']}]" if fix["stale"] else ""))
        out.append(f"      {fix.get('answer', '')}")
        out.append(Verbatim(f"      at {fix.get('where') or '?'}"))
    if remembered["fixes"]:
        out.append("      (`rocm-autopatch forget GRAPH` or `--all` forgets)")
    else:
        out.append("  none (`rocm-autopatch bisect DIR` finds and remembers them)")
    out += ["", "Configuration (key: before -> after, source, status)"]
    if not r["active"]:
        out.append("  nothing applied: torch's own configuration is in use")
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
    out += ["", "torch.compile rewrites and fixes"]
    if not r["active"]:
        out.append("  nothing applied: torch.compile is torch's own")
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
    if "torch_error" in data:
        out += ["", f"! {data['red_flags'][0]}"]
    out += ["", "healthy" if data["healthy"] else "RED FLAGS remain (see above)"]
    return "\n".join(fit(line) for line in out) + "\n"


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


def _report(paths: Sequence[str], as_json: bool) -> int:
    from rocm_autopatch.reporting import view

    reports, problems = view.load(paths)
    for problem in problems:
        say(f"rocm-autopatch doctor: {problem}\n")
    if not reports:
        say(f"rocm-autopatch doctor: no readable compile report among {len(paths)} file(s)\n")
        return 2
    job = view.job(reports, problems)
    sys.stdout.write(json.dumps(job, indent=2) + "\n" if as_json else
                     "\n".join(fit(line) for line in view.render(job, reports)) + "\n")
    return 0 if job["healthy"] else 1


def _bisect(folder: str, limit: float, remember: bool, as_json: bool) -> int:
    from rocm_autopatch.sentinel import bisect

    if not os.path.isfile(os.path.join(folder, "repro.py")):
        say(f"rocm-autopatch bisect: {folder} has no repro.py; give a directory the numerics "
            f"sentinel wrote (its warning names it; {settings.VERIFY_DIR})\n")
        return 2
    result = bisect.run(folder, limit, lambda line: say(line + "\n"), remember)
    sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n" if as_json else
                     "\n".join(bisect.lines(result)) + "\n")
    return {"found": 0, "not found": 1, "not reproduced": 1}.get(result["status"], 2)


def _forget(fingerprint: Optional[str], everything: bool) -> int:
    from rocm_autopatch.sentinel import fixes

    if not fingerprint and not everything:
        say("rocm-autopatch forget: name a graph (its fingerprint, as the doctor lists it) "
            "or --all\n")
        return 2
    where = fixes.path()
    gone = fixes.forget(None if everything else fingerprint)
    sys.stdout.write(f"forgot {gone} fix{'es' if gone != 1 else ''}"
                     f"{f' ({where})' if where else ''}\n")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from rocm_autopatch import __version__

    parser = argparse.ArgumentParser(prog="rocm-autopatch")
    parser.add_argument("--version", action="version", version=f"rocm-autopatch {__version__}")
    sub = parser.add_subparsers(dest="command")
    doctor = sub.add_parser("doctor", help="show what is installed, detected and changed")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--profile", choices=tuple(profiles.PROFILES),
                        help="show what this profile would do (this process only)")
    doctor.add_argument("--report", nargs="+", metavar="FILE",
                        help="render compile reports (ROCM_AUTOPATCH_REPORT files: one per "
                             "process, e.g. every rank of a job) as one view")
    run = sub.add_parser(
        "run", help="run a Python command with rocm-autopatch applied, even under python -S",
        usage="rocm-autopatch run [--profile P] -- python [flags] script.py|-m mod args...")
    run.add_argument("--profile", choices=tuple(profiles.PROFILES),
                     help="the profile for the target")
    run.add_argument("target", nargs=argparse.REMAINDER, help="the command to run")
    selftest = sub.add_parser(
        "selftest", help="a bounded run on this GPU: compile under a hostile environment, "
                         "graph capture, the numerics sentinel; writes a JSON to attach to "
                         "an issue")
    selftest.add_argument("--json", metavar="PATH", dest="json_path",
                          help="where to write the results (default: "
                               "./rocm-autopatch-selftest.json)")
    selftest.add_argument("--only", nargs="+", metavar="CHECK",
                          choices=("compile", "capture", "numerics"),
                          help="run only these checks")
    bisect = sub.add_parser(
        "bisect", help="find the compiler step that makes a repro directory's graph wrong "
                       "(the numerics sentinel writes them), and remember the fix")
    bisect.add_argument("folder", metavar="DIR", help="a repro directory (has repro.py)")
    bisect.add_argument("--time-limit", type=float, default=1800.0, metavar="S",
                        help="give up after this many seconds (default 1800)")
    bisect.add_argument("--no-remember", action="store_true",
                        help="do not remember the fix for the next run")
    bisect.add_argument("--json", action="store_true", help="machine-readable output")
    forget = sub.add_parser("forget", help="forget remembered fixes (see the doctor)")
    forget.add_argument("fingerprint", nargs="?", metavar="GRAPH",
                        help="the graph's fingerprint (or its start), as the doctor lists it")
    forget.add_argument("--all", action="store_true", help="forget every fix")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if args.command == "run":
        from rocm_autopatch.cli import launcher

        target = args.target[1:] if args.target[:1] == ["--"] else args.target
        try:
            launcher.main(target, args.profile)
        except launcher.UsageError as exc:
            say(f"rocm-autopatch run: {exc}\n")
            return 2
    if args.command == "selftest":
        from rocm_autopatch.cli import selftest as selftest_module

        return selftest_module.main(args.json_path, args.only or list(selftest_module.CHECKS))
    if args.command == "bisect":
        return _bisect(args.folder, args.time_limit, not args.no_remember, args.json)
    if args.command == "forget":
        return _forget(args.fingerprint, args.all)
    if args.command != "doctor":
        parser.print_usage(sys.stderr)
        return 2
    if args.report:
        return _report(args.report, args.json)
    data = collect(args.profile)
    sys.stdout.write(json.dumps(data, indent=2) + "\n" if args.json else _human(data))
    return 0 if data["healthy"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
