"""The command line, parsed and dispatched: ``rocm-autopatch doctor`` (what is installed,
detected and changed: ``doctor``), ``run`` (the launcher, see ``launcher``), ``selftest``,
``bisect`` (the compiler step that makes a sentinel's repro wrong, ``sentinel.bisect``) and
``forget`` (remembered fixes).

``doctor`` imports torch and its compiler config in its own process, so the report it
prints is the one a script would get in this environment. ``--json`` for machines.
Exit status: 0 healthy, 1 a red flag that rocm-autopatch did not neutralise, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, Sequence

from _rocm_autopatch_start import say
from rocm_autopatch import log, settings
from rocm_autopatch.cli import doctor, doctor_text
from rocm_autopatch.config import profiles
from rocm_autopatch.text import fit


def _report(paths: Sequence[str], as_json: bool) -> int:
    from rocm_autopatch import sentinel
    from rocm_autopatch.reporting import view

    view.register(sentinel.view_part())  # the sections the concerns write of their own
    if not paths:
        say(f"rocm-autopatch doctor --report: no report to read: give the files (written "
            f"with {settings.REPORT}=PATH, one per process), or set {settings.REPORT} as "
            "the program had it\n")
        return 2
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


def _reports_written() -> List[str]:
    """The report files ``ROCM_AUTOPATCH_REPORT`` names here, ``{rank}``/``{pid}`` matching
    any (``doctor --report`` with no file, run where the program ran)."""
    import glob

    template = str(log.setting(settings.REPORT) or "").strip()
    if not template:
        return []
    pattern = os.path.expanduser(template).replace("{rank}", "*").replace("{pid}", "*")
    stem, ext = os.path.splitext(pattern)
    # A child process's own file has ".<pid>" before the extension (reporting.placement).
    return sorted(set(glob.glob(pattern)) | set(glob.glob(f"{stem}.*{ext}")))


def _bisect(folder: str, limit: float, remember: bool, as_json: bool) -> int:
    from rocm_autopatch import sentinel

    if not os.path.isfile(os.path.join(folder, "repro.py")):
        say(f"rocm-autopatch bisect: {folder} has no repro.py; give a directory the numerics "
            f"sentinel wrote (its warning names it; {settings.VERIFY_DIR})\n")
        return 2
    result = sentinel.bisect(folder, limit, lambda line: say(line + "\n"), remember)
    sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n" if as_json else
                     "\n".join(sentinel.bisect_lines(result)) + "\n")
    return {"found": 0, "not found": 1, "not reproduced": 1}.get(result["status"], 2)


def _forget(fingerprint: Optional[str], everything: bool) -> int:
    from rocm_autopatch import sentinel

    if not fingerprint and not everything:
        say("rocm-autopatch forget: name a graph (its fingerprint, as the doctor lists it) "
            "or --all\n")
        return 2
    where = sentinel.fixes_path()
    gone = sentinel.forget(None if everything else fingerprint)
    sys.stdout.write(f"forgot {gone} fix{'es' if gone != 1 else ''}"
                     f"{f' ({where})' if where else ''}\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    from rocm_autopatch import __version__

    parser = argparse.ArgumentParser(prog="rocm-autopatch")
    parser.add_argument("--version", action="version", version=f"rocm-autopatch {__version__}")
    sub = parser.add_subparsers(dest="command")
    doctor = sub.add_parser("doctor", help="show what is installed, detected and changed")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--verbose", action="store_true",
                        help="every section in full: each key's reason and public source, "
                             "the rules without a config key, caches, remembered fixes")
    doctor.add_argument("--profile", choices=tuple(profiles.PROFILES),
                        help="show what this profile would do (this process only)")
    doctor.add_argument("--report", nargs="*", metavar="FILE",
                        help="render compile reports (ROCM_AUTOPATCH_REPORT files: one per "
                             "process, e.g. every rank of a job) as one view; without FILE, "
                             "the files ROCM_AUTOPATCH_REPORT names ({rank} and {pid} as *)")
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
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
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
    if args.report is not None:
        return _report(args.report or _reports_written(), args.json)
    data = doctor.collect(args.profile)
    sys.stdout.write(json.dumps(data, indent=2) + "\n" if args.json else
                     doctor_text.render(data, args.verbose))
    return 0 if data["healthy"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
