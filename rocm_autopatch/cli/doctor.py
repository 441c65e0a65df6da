"""``rocm-autopatch doctor``: what is installed, detected and changed, collected in this
process as a script would get it (torch and its compiler config imported here), with the
environment audited and red flags raised. ``doctor_text`` renders it for people.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional

from rocm_autopatch import settings
from rocm_autopatch.config import caches, known_issues, profiles

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
            keep = caches.kept_off(environ)
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
    from rocm_autopatch import log, probe, record
    from rocm_autopatch.cli import installation
    from rocm_autopatch.startup import bootstrap

    environ = settings.environment()  # as the shell set it: torch's import adds some
    from rocm_autopatch import __version__

    data: Dict[str, Any] = {"version": __version__, "install": installation.info(),
                            "python": sys.version.split()[0]}
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
    data["caches"]["skipping_dynamo"] = caches.skipping_dynamo(torch_module)
    data["fixes"] = _fixes()
    data["rungs"] = _rungs()
    data["left_out"] = {**profiles.LEFT_OUT, **known_issues.LEFT_OUT}
    data["known_issues"] = known_issues.judge(
        probe.triton_version(), report.get("hip_version"), [g["arch"] for g in data["gpus"]],
        bool(data["gemm_backends"].get("templates_used")), environ)
    data["notes"] = notes(report, data["gpus"])
    data["tunableop"] = report["fixes"].get("tunableop") or {
        "status": "off", "reason": f"the {report.get('profile') or 'safe'} profile leaves "
        f"TunableOp off ({settings.PROFILE}=perf with {settings.CACHE} set turns it on)"}
    data["caches"]["asked"] = bool(log.setting(settings.CACHE, warn=False).strip())
    data["red_flags"] = red_flags(data)
    if "torch_error" in data:
        data["red_flags"].insert(0, (
            f"torch cannot be imported by this Python ({sys.executable}): "
            f"{data['torch_error']}. rocm-autopatch acts on the torch of the environment it is "
            "installed in: install it where your torch is (that environment's pip), or "
            "install torch here"))
    data["healthy"] = not data["red_flags"]
    return data


def red_flags(data: Dict[str, Any]) -> List[str]:
    """Every red flag, one line each with its fix: a variable that still hangs or breaks
    compiles, a promise the package could not keep in this process (a fix or a key that
    failed: a cache it cannot write, a watchdog that cannot start), a hook that failed, an
    known issue of this GPU, Triton or ROCm that can bite here (``known_issues``)."""
    report = data["report"]
    flags = [f"{r['name']}: {r['note']}" for r in data["environment"] if r["flag"] == "red"]
    flags += [f"{name} failed: {fix['reason']}" for name, fix in report["fixes"].items()
              if fix["status"] == "failed"]
    flags += [f"{c['key']} failed: {c['reason']}" for c in report["config"]
              if c["status"] == "failed"]
    flags += [f"hook failed: {error}" for error in report["errors"]]
    flags += [f"{k['name']}: {k['reason']} [{k['ref']}]" for k in data["known_issues"]
              if k["status"] == "red"]
    return flags


def notes(report: Dict[str, Any], gpus: List[Dict[str, str]]) -> List[str]:
    """What the doctor says of this machine beyond the rules."""
    found = []
    if report.get("platform") == "rocm" and not gpus:
        found.append("a ROCm build of torch on a machine without an AMD GPU (the KFD "
                     "topology lists none): torch.compile of CPU code on such a build takes "
                     "HIP code paths that have no device; use a CPU build of torch here "
                     "(no public report verified)")
    return found


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
    from rocm_autopatch import log, sentinel

    if record.REPORT.active and log.setting(settings.VERIFY) != "off":
        try:
            import torch._inductor.compile_fx  # noqa: F401 - the hook installs the sentinel
        except Exception:  # noqa: BLE001 - a broken torch is reported elsewhere
            pass
    if sentinel.NAME not in record.REPORT.fixes:
        record.fix(sentinel.NAME, record.OFF, f"{settings.VERIFY} is unset: compiled graphs are "
                   "not compared with eager (check: warn about a graph that computes wrong "
                   "numbers; fallback: also run it eagerly)", sentinel.REF)


def _rungs() -> Dict[str, Any]:
    """The store of rungs remembered across processes (``sentinel.scheduling.rungs``)."""
    from rocm_autopatch import sentinel

    return sentinel.rungs_kept()


def _fixes() -> Dict[str, Any]:
    """The remembered fixes (``rocm-autopatch bisect``), and which apply here."""
    from rocm_autopatch import sentinel

    return sentinel.remembered()
