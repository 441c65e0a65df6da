"""The compile caches: where they live (``ROCM_AUTOPATCH_CACHE``) and the variable that
turns them all off (``TORCHINDUCTOR_FORCE_DISABLE_CACHES``).

A first compile of minutes is normal on AMD GPUs (sglang#6830, vllm#34399), and a
container restart pays it again: torch's caches default to ``/tmp/torchinductor_<user>``
and Triton's to ``~/.triton``, and both vanish with the container. ``ROCM_AUTOPATCH_CACHE=
DIR`` (a directory the user mounts) points both at ``DIR/<torch>-<triton>-<arch>/``: an
upgrade of torch or Triton, or another GPU, gets a directory of its own, so nothing stale
is ever loaded. It sets ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``, which torch
and Triton read when they first compile (``torch/_inductor/runtime/cache_dir_utils.py``
``cache_dir``; Triton's ``knobs.cache.dir``), never where the user set them (theirs win).
Ranks and processes of one machine share it: torch and Triton write each entry to a
temporary file and rename it (``torch/_inductor/codecache.py`` ``write_atomic``; Triton's
``FileCacheManager.put``), so no reader sees a partial one and no writer waits for another.

There is no default when it is unset: in a container the home directory vanishes as /tmp
does, and only the user knows which directory is mounted. The doctor says where the caches
are and whether that is under a temporary directory.

C++ precompiled headers are the one thing torch keeps under ``/tmp`` whatever
``TORCHINDUCTOR_CACHE_DIR`` says (``torch/_inductor/codecache.py`` ``_HEADER_DIR``, set from
``default_cache_dir()`` at import: "these headers need to be global"), and torch builds them
before it looks for a cached C++ kernel: a new container rebuilds them at its first CPU
compile with every kernel cached (4.6 s of an 8.1 s warm start of a 6-layer GPT-2 on this
project's CPU machine). ``keep_headers`` moves them beside the caches; their file names
hash the compiler, its flags and the preprocessed header, so a stale one is never used.
Likewise torch checks each CPU vector ISA in every process with a child interpreter that
loads a probe (1.2 s of the same warm start); ``keep_isa_checks`` remembers the answers
there, per ISA, probe, CPU, compiler and torch.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import tempfile
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple

from rocm_autopatch import files, log, probe, record, settings

NAME = "compile_cache"  # its entry in report().fixes
HEADERS = "precompiled_headers"  # the headers' entry in report().fixes, and their folder
HEADERS_REF = ("torch/_inductor/codecache.py _HEADER_DIR ('these headers need to be "
               "global') and CppPythonBindingsCodeCache.load_pybinding_async (torch 2.10-2.15)")
FORCE_VARS = ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCH_COMPILE_FORCE_DISABLE_CACHES")
KEEP_OFF = settings.override_var("force_disable_caches")  # INDUCTOR_FORCE_DISABLE_CACHES
TORCH_DIR, TRITON_DIR = "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"
REF = "sglang#6830, vllm#34399, pytorch#170621"
FORCE_REF = "torch/compiler/config.py force_disable_caches (env_name_force), torch 2.13"


def key(torch: ModuleType, archs: Optional[List[str]] = None) -> str:
    """The subdirectory for this torch, Triton and GPU: ``torch-2.13.0-triton-3.5.0-gfx942``."""
    found = probe.arch_names() if archs is None else archs
    arch = "+".join(sorted(set(found))) or probe.platform_of(torch)
    text = f"torch-{torch.__version__}-triton-{probe.triton_version() or 'none'}-{arch}"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def directory(torch: ModuleType, root: str) -> str:
    """``ROCM_AUTOPATCH_CACHE``'s (``root``) directory for this torch, Triton and GPU."""
    return os.path.join(os.path.abspath(os.path.expanduser(root)), key(torch))


_where: Optional[str] = None  # this process's cache directory, once it could be written


def install(torch: ModuleType) -> None:
    """At activation: flag the variable that turns caches off; point the caches at
    ``ROCM_AUTOPATCH_CACHE``. Never raises."""
    try:
        _flag_force()
        root = log.setting(settings.CACHE).strip()
        if root:
            _redirect(torch, root)
    except Exception as exc:  # noqa: BLE001 - the program goes on, with torch's defaults
        log.hook_failed("torch", "rocm_autopatch.config.caches.install", exc)


def forced_off(environ: Optional[Dict[str, str]] = None) -> List[str]:
    """The variables set that turn every compile cache off (``1``, as torch reads them)."""
    found = {v: settings.raw(v, environ) for v in FORCE_VARS}
    return [f"{v}={value}" for v, value in found.items() if (value or "").strip() == "1"]


def kept_off(environ: Optional[Dict[str, str]] = None) -> bool:
    """Did the user ask to keep every cache off, through our override (``KEEP_OFF=1``)?"""
    return (settings.raw(KEEP_OFF, environ) or "").strip().lower() in settings.TRUE_WORDS


def _flag_force() -> None:
    found = forced_off()
    if not found:
        return
    if kept_off():
        record.fix(NAME, record.SKIPPED, f"{found[0]}: compile caches off, as {KEEP_OFF} "
                   "asks", FORCE_REF)
        return
    text = (f"{found[0]} is set in this environment (container images do this): every "
            "compile cache is off, so every run and every rank compiles everything again "
            f"(first compiles of minutes on AMD GPUs: {REF}). torch pins it ({FORCE_REF}): "
            f"unset it to get the caches back; to keep it and silence this, set {KEEP_OFF}=1.")
    record.fix(NAME, record.FAILED, text, FORCE_REF)
    log.warn_once(("caches", "force"), text)


def _redirect(torch: ModuleType, root: str) -> None:
    where = directory(torch, root)
    theirs = [v for v in (TORCH_DIR, TRITON_DIR) if (settings.raw(v) or "").strip()]
    try:
        for sub in ("inductor", "triton"):
            os.makedirs(os.path.join(where, sub), exist_ok=True)
        probe_file = tempfile.NamedTemporaryFile(dir=where, prefix=".write-test-")
        probe_file.close()
    except OSError as exc:
        text = (f"{settings.CACHE}={root}: cannot write to {where} ({exc.strerror or exc}); "
                "the compile caches stay where torch puts them (give a writable directory, "
                "e.g. one mounted into the container)")
        record.fix(NAME, record.FAILED, text, REF)
        log.warn_once(("caches", "dir"), text)
        return
    global _where
    _where = where
    set_here = []
    for var, sub in ((TORCH_DIR, "inductor"), (TRITON_DIR, "triton")):
        if var not in theirs:
            settings.export(var, os.path.join(where, sub))
            set_here.append(var)
    kept = f"; kept your {', '.join(theirs)}" if theirs else ""
    record.fix(NAME, record.APPLIED if set_here else record.SKIPPED,
               f"{settings.CACHE}: compile caches in {where} (per torch, Triton and GPU: an "
               f"upgrade never loads stale kernels){kept}" if set_here else
               f"{settings.CACHE} not used: {', '.join(theirs)} set (yours win)", REF)


def keep_headers(codecache: ModuleType) -> None:
    """At ``torch._inductor.codecache``'s import: its precompiled headers beside the caches
    (where ``ROCM_AUTOPATCH_CACHE`` was applied). Never raises."""
    try:
        if _where is None:
            return
        if not hasattr(codecache, "_HEADER_DIR"):
            record.fix(HEADERS, record.SKIPPED, "this torch keeps no C++ precompiled headers "
                       "(torch._inductor.codecache has no _HEADER_DIR)", HEADERS_REF)
            return
        headers = os.path.join(_where, HEADERS)
        codecache._HEADER_DIR = headers
        codecache._HEADER_LOCK_DIR = os.path.join(headers, "locks")
        record.fix(HEADERS, record.APPLIED, f"C++ precompiled headers kept in {headers} "
                   "(torch keeps them under /tmp whatever TORCHINDUCTOR_CACHE_DIR says, and "
                   "rebuilds them in a new container before it looks for a cached kernel)",
                   HEADERS_REF)
    except Exception as exc:  # noqa: BLE001 - torch's default place stays
        log.hook_failed("torch._inductor.codecache",
                        "rocm_autopatch.config.caches.keep_headers", exc)


ISA = "cpu_isa"  # the CPU vector-ISA probes' entry in report().fixes, and their record
ISA_REF = ("torch/_inductor/cpu_vec_isa.py VecISA.check_build: a probe built, then loaded "
           "by a child interpreter, per check (torch 2.10-2.15)")


def keep_isa_checks(cpu_vec_isa: ModuleType) -> None:
    """At ``torch._inductor.cpu_vec_isa``'s import: each vector ISA's check (a probe
    compiled, then loaded in a child interpreter: about 0.12 s a child, ten of them, 1.2 s of
    a 3.4 s warm start of GPT-2 on this project's CPU) remembered beside the caches, keyed
    by the ISA, its flags, the probe's code, the CPU's flags, the compiler and torch: a new
    container on the same machine asks again of nothing. Never raises."""
    try:
        vec_isa = getattr(cpu_vec_isa, "VecISA", None)
        if _where is None or vec_isa is None or not hasattr(vec_isa, "check_build"):
            return
        from rocm_autopatch import patching

        if patching.wrap(vec_isa, "check_build", _remembered) is not None:
            record.fix(ISA, record.APPLIED, "CPU vector-ISA checks remembered in "
                       f"{os.path.join(_where, ISA + '.json')} (per CPU, compiler and torch: "
                       "a new container does not start a child interpreter per ISA again)",
                       ISA_REF)
    except Exception as exc:  # noqa: BLE001 - torch checks every time, as without us
        log.hook_failed("torch._inductor.cpu_vec_isa",
                        "rocm_autopatch.config.caches.keep_isa_checks", exc)


def _remembered(original: Any) -> Any:
    def check_build(self: Any, code: str) -> bool:
        try:
            key = _isa_key(self, code)
        except Exception:  # noqa: BLE001 - no key: torch's own check
            return original(self, code)
        path = os.path.join(_where or "", ISA + ".json")
        known = (files.read_json(path) or {}).get(key)
        if isinstance(known, bool):
            return known
        found = original(self, code)
        with files.directory_lock(os.path.dirname(path)):
            table = files.read_json(path) or {}
            table[key] = bool(found)
            files.write_atomically(path, json.dumps(table, indent=1, sort_keys=True))
        return found

    return check_build


def _isa_key(isa: Any, code: str) -> str:
    """What an ISA check's answer depends on: the ISA and its flags, the probe, and this
    machine (``_machine``)."""
    parts = [str(isa), isa.build_arch_flags(), code, *_machine()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


@functools.cache
def _machine() -> Tuple[str, ...]:
    """torch, this CPU's flags and the compiler (path, size, time): read once per process,
    not once per ISA check."""
    import torch
    from torch._inductor import cpp_builder

    compiler = cpp_builder.get_cpp_compiler()
    where = shutil.which(compiler) or compiler
    stat = os.stat(where)
    return (torch.__version__, _cpu_flags(), where, str(stat.st_size), str(stat.st_mtime_ns))


def _cpu_flags() -> str:
    """The first CPU's feature flags (Linux), "" elsewhere: a machine with other flags gets
    other keys."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features", "features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()



def where_now(environ: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Where torch's and Triton's caches go in this environment, and whether that is under
    a temporary directory (the doctor's line)."""
    env = settings.environment() if environ is None else environ
    user = env.get("USER") or env.get("LOGNAME") or "user"
    inductor = env.get(TORCH_DIR) or os.path.join(tempfile.gettempdir(),
                                                  f"torchinductor_{user}")
    triton = env.get(TRITON_DIR) or os.path.join(env.get("HOME", "~"), ".triton", "cache")
    temp = tempfile.gettempdir()
    return {"inductor": inductor, "triton": triton,
            "temporary": os.path.abspath(inductor).startswith(temp + os.sep)}


def skipping_dynamo(torch_module: Any) -> Dict[str, str]:
    """The running torch's ways to skip Dynamo's tracing on a warm start (what a warm start
    still pays once the caches hit: 1.6 s of GPT-2's 2.3 s on the CPU, 4.2 s of the 1.1B
    Llama's 6.3 s on an H200, BENCHMARKS.md), and why rocm-autopatch does not use them: each
    keeps a graph only by dropping or failing on guards an unchanged script relies on."""
    found: Dict[str, str] = {}
    if torch_module is None:  # no torch (the doctor says so): nothing to look up
        return found
    config = getattr(getattr(torch_module, "_dynamo", None), "config", None)
    if config is not None and hasattr(config, "caching_precompile"):
        found["caching_precompile"] = (
            "not used: it drops ID_MATCH and DICT_VERSION guards (torch/_dynamo/guards.py, "
            "\"dropped with caching_precompile=True\"), and a saved GPT-2 entry failed to "
            "rebuild its guards on torch 2.13 (torch/_dynamo/package.py load_guard_manager)")
    try:
        aot = importlib.util.find_spec("torch._dynamo.aot_compile") is not None
    except Exception:  # noqa: BLE001 - a torch without Dynamo (a stand-in, a broken install)
        aot = False
    if aot:
        found["aot_compile"] = (
            "not used: torch.compile(...).aot_compile and save_compiled_function (experimental) "
            "need fullgraph=True and guards that serialise; an unchanged transformers GPT-2 "
            "fails with \"ID_MATCH guard cannot be serialized\" (torch 2.13, "
            "torch/_dynamo/guards.py serialize_guards), and dropping the guards (vLLM's "
            "guard_filter_fn) could run a stale graph")
    return found
