"""The settings: every environment variable rocm-autopatch reads, declared once, typed, and
the one module of the package that reads or writes the process environment.

Each ``Variable`` gives the name, what it accepts, its default, one line of meaning and
where it applies. ``read`` parses the environment's value and never raises: a bad value
gives the value to use instead and the one warning to say (``log.setting`` says it, once).
The README's variables table is made from this table (``markdown``; a test keeps them in
step) and the doctor lists the variables set from it. Stdlib only, and it imports nothing
of the package at import time: every other module may read a setting.

Everything else that touches the environment goes through the functions at the end
(``raw``, ``names``, ``environment``, ``export``, ``exported``, ``take``, ``user_cache``):
ruff's banned-API rule (TID251 in ``pyproject.toml``) refuses ``os.environ`` elsewhere,
but in the start-up trigger, which may import nothing of ours.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, ContextManager, Dict, List, Mapping, NamedTuple, Optional, Tuple

from _rocm_autopatch_start import AUTO_VALUES, ENV_MODE, FORCE_VALUES, OFF_VALUES
from _rocm_autopatch_start import torch_autoload as torch_autoload  # torch's rule, re-exported

# The words of a yes/no variable (unset is no); INDUCTOR_<KEY> booleans take the same.
TRUE_WORDS = ("1", "true", "on", "yes")
FALSE_WORDS = ("0", "false", "off", "no")
NONE_WORDS = ("none", "null")


class Variable(NamedTuple):
    name: str
    parse: Callable[[str], Any]  # the stripped text -> the value; ValueError when bad
    accepted: str  # what a user may write (the README's "values" column, warnings)
    default: Any  # the value when unset or empty
    meaning: str  # one line: what it does
    applies: str  # where it takes effect (a process that imports torch, the doctor...)
    if_bad: str = ""  # what a bad value means instead, said in its warning ("" = the
    # default is used): always the default, so that a misspelt value turns nothing on


def _words(table: Mapping[str, Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return table[text.lower()]
        except KeyError:
            raise ValueError(text) from None
    return parse


def _flag(text: str) -> bool:
    low = text.lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ValueError(text)


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isascii() or not text.isdigit() or int(text) < low:
            raise ValueError(text)
        return int(text)
    return parse


def _seconds(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(text)
    return value


def _share(text: str) -> float:
    value = float(text)
    if not (0 <= value <= 1):
        raise ValueError(text)
    return value


BISECT_SECONDS = 900.0  # the background bisection's limit when it is simply on


def _bisect(text: str) -> float:
    """Seconds the background bisection may take; 0 for off."""
    low = text.lower()
    if low in FALSE_WORDS:
        return 0.0
    if low in TRUE_WORDS:
        return BISECT_SECONDS
    value = _seconds(text)
    if value < 10:  # a step alone (one compile in a fresh interpreter) takes seconds
        raise ValueError(text)
    return value


def _text(text: str) -> str:
    return text


def _rank(text: str) -> int:
    """A process's rank as launchers write it: plain ASCII digits ("²" and "../x" are not)."""
    if not text.isascii() or not text.isdigit() or len(text) > 9:
        raise ValueError(text)
    return int(text)


MODE = ENV_MODE
PROFILE = "ROCM_AUTOPATCH_PROFILE"
VERIFY = "ROCM_AUTOPATCH_VERIFY"
VERIFY_CALLS = "ROCM_AUTOPATCH_VERIFY_CALLS"
VERIFY_BUDGET = "ROCM_AUTOPATCH_VERIFY_BUDGET"
VERIFY_DIR = "ROCM_AUTOPATCH_VERIFY_DIR"
VERIFY_BISECT = "ROCM_AUTOPATCH_VERIFY_BISECT"
FIXES = "ROCM_AUTOPATCH_FIXES"
RUNGS = "ROCM_AUTOPATCH_RUNGS"
REPORT = "ROCM_AUTOPATCH_REPORT"
CACHE = "ROCM_AUTOPATCH_CACHE"
ALLOW_GRAPHS = "ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS"
COMPILE_IN_CAPTURE = "ROCM_AUTOPATCH_COMPILE_IN_CAPTURE"
WATCHDOG = "ROCM_AUTOPATCH_COMPILE_WATCHDOG"
LOG = "ROCM_AUTOPATCH_LOG"
KFD_TOPOLOGY = "ROCM_AUTOPATCH_KFD_TOPOLOGY"
CGROUP_ROOT = "ROCM_AUTOPATCH_CGROUP_ROOT"
OVERRIDE_PREFIX = "INDUCTOR_"  # INDUCTOR_<KEY>: typed by torch's config (overrides.py)
KEEP_TUNING = OVERRIDE_PREFIX + "MAX_AUTOTUNE"
# Read from the launcher's environment, not ours to document as knobs (not in the README).
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
TORCH_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
XDG_CACHE = "XDG_CACHE_HOME"  # where the user's cache directory is (the XDG rule)
# Internal: set by one of our processes for another, never by a user, never documented as
# knobs. A bisection hands each step its state and the change to try; the first process of a
# run that arms the compile report claims its path for the children it starts.
BISECT_STATE = "ROCM_AUTOPATCH_BISECT_STATE"  # torch's CompilerBisector state, for a step
BISECT_NAME = "ROCM_AUTOPATCH_BISECT_NAME"  # JSON: the application a step names (naming.py)
BISECT_CHANGE = "ROCM_AUTOPATCH_BISECT_CHANGE"  # JSON: the change a step tries (fixes.py)
REPORT_CLAIM = "_ROCM_AUTOPATCH_REPORT_CLAIM"  # "<pid> <path>": the report's first writer
INTERNAL = (BISECT_STATE, BISECT_NAME, BISECT_CHANGE, REPORT_CLAIM)

PROFILE_NAMES = ("safe", "perf")
LEVEL_NAMES = ("debug", "info", "warning", "error", "off")
VERIFY_WORDS = {**dict.fromkeys(FALSE_WORDS, "off"),
                **dict.fromkeys(("check",) + TRUE_WORDS, "check"), "fallback": "fallback"}

VARIABLES: Tuple[Variable, ...] = (
    Variable(MODE, _words({**dict.fromkeys(OFF_VALUES, "off"),
                           **dict.fromkeys((v for v in AUTO_VALUES if v), "auto"),
                           **dict.fromkeys(FORCE_VALUES, "force")}),
             "unset/`1`/`on`/`auto`; `0`/`off`; `force`", "auto",
             "ROCm builds only (default); off; any torch build (how we test on CPU and "
             "NVIDIA)", "every Python process (start-up); applied at `import torch`",
             "Using auto."),
    Variable(PROFILE, _words({p: p for p in PROFILE_NAMES}), "`safe`, `perf` (default `safe`)",
             "safe", "the tuning profile", "Inductor/Dynamo config at their import"),
    Variable(VERIFY, _words(VERIFY_WORDS),
             "unset/`0`/`off`; `check` (or `1`/`on`/`true`/`yes`); `fallback`", "off",
             "compare compiled graphs with eager: warn; warn and run eagerly",
             "every graph Inductor compiles",
             "Using off: the sentinel stays off (a check costs time: it is turned on by a "
             "word it knows only)."),
    Variable(VERIFY_CALLS, _at_least(1), "an integer >= 1 (default 1)", 1,
             "first calls of each graph always checked", "the numerics sentinel"),
    Variable(VERIFY_BUDGET, _share, "a share from 0 to 1 (default `0.01`); `0`: none", 0.01,
             "the sentinel's share of the program's wall time (sampled checks and value "
             "reads, all graphs together)",
             "the numerics sentinel"),
    Variable(VERIFY_DIR, _text, "a directory; `off` (default: beside the report, else "
             "`~/.cache/rocm-autopatch/repros`)", "",
             "where a graph found wrong gets its repro (`repro.py`, inputs, env.json)",
             "the numerics sentinel"),
    Variable(VERIFY_BISECT, _bisect, "`1`/`on` (default: 900 s); seconds (>= 10); `0`/`off`",
             BISECT_SECONDS,
             "under `fallback`, bisect a graph found wrong in the background at exit, for at "
             "most this long, and remember the fix", "the numerics sentinel",
             "Using 900 s (set 0 to turn it off)."),
    Variable(FIXES, _text, "a file; `off` (default: `~/.cache/rocm-autopatch/fixes.json`)", "",
             "where fixes found by `bisect` are remembered and read (`off`: neither)",
             "the numerics sentinel, `rocm-autopatch bisect`"),
    Variable(RUNGS, _text, "a file; `off` (default: `rungs.json` in `ROCM_AUTOPATCH_CACHE`'s "
             "directory, else `~/.cache/rocm-autopatch/rungs.json`)",
             "", "where the largest integer inputs (positions, token ids) at which each "
             "graph's checks passed are remembered, with a check's cost (for a graph "
             "without integer inputs, the cost alone), so that a later process starts its "
             "ladder there and sets its sampled checks' period without a check of its own "
             "(`off`: neither read nor written)",
             "the numerics sentinel"),
    Variable(REPORT, _text, "a path; `{rank}`, `{pid}` replaced", "",
             "write a compile report per process at exit", "processes that compile"),
    Variable(CACHE, _text, "a directory (unset: torch's defaults)", "",
             "keep the compile caches there, per torch, Triton and GPU (mount it: they "
             "survive the container and serve every rank)", "Inductor's and Triton's caches"),
    Variable(ALLOW_GRAPHS, _flag, "`1`/`0`", False, "keep Inductor CUDA graphs",
             "the profile's graph keys and torch.compile's modes", "CUDA graphs stay off."),
    Variable(COMPILE_IN_CAPTURE, _flag, "`1`/`0` (default)", False,
             "`1`: torch's own behaviour for compiles that start during graph capture",
             "frames compiled while a CUDA/HIP graph is captured",
             "Compiles inside capture run eagerly (set 1 for torch's behaviour)."),
    Variable(WATCHDOG, _seconds, "seconds (default `300`); `0` off", 300.0,
             "warn once when a single compile runs longer", "every frame compile"),
    Variable(LOG, _words({n: n for n in LEVEL_NAMES}),
             "`debug`, `info`, `warning`, `error`, `off` (default `warning`)", "warning",
             "how much it says on stderr (default: warnings, and the sentinel's verdict when "
             "it is on; `info`: a summary line too, rank 0 only; `error`/`off`: neither)",
             "our messages"),
    Variable(KFD_TOPOLOGY, _text, "a directory", "",
             "where the GPU architecture is read (tests point it at a fake)", "the probe"),
    Variable(CGROUP_ROOT, _text, "a directory", "",
             "where the CPU quota is read (tests point it at a fake)", "the probe"),
    Variable(RANK, _rank, "a non-negative integer", None,
             "this process's rank (set by torchrun, Slurm wrappers, accelerate)",
             "rank-0-only messages, `{rank}` in the report path",
             "It is not used: messages come as from any rank, the report is named by pid."),
    Variable(LOCAL_RANK, _rank, "a non-negative integer", None,
             "this process's rank on its host", "as RANK, where RANK is unset",
             "It is not used."),
    Variable(WORLD_SIZE, _rank, "a non-negative integer", None,
             "how many ranks the job has", "the compile report; above 1, each graph "
             "compiled once by the ranks of a machine (`config.compile_once`), and the "
             "sentinel's remembered rungs not read (`sentinel.scheduling.rungs`)",
             "It is not used."),
    Variable(TORCH_AUTOLOAD, _text, "`1` (torch's default) or anything else", "1",
             "torch's backend autoload (torch >= 2.5): rocm-autopatch's second start-up "
             "path", "`import torch`"),
)
def override_var(key: str) -> str:
    """The variable for Inductor ``key``: triton.cudagraphs -> INDUCTOR_TRITON__CUDAGRAPHS."""
    return OVERRIDE_PREFIX + key.upper().replace(".", "__")


BY_NAME: Dict[str, Variable] = {v.name: v for v in VARIABLES}
# Ours to document (the README's table): every ROCM_AUTOPATCH_* variable.
OURS = tuple(v for v in VARIABLES if v.name.startswith(MODE))
assert not set(INTERNAL) & set(BY_NAME), "an internal variable is not a user's knob"


class Reading(NamedTuple):
    value: Any
    raw: Optional[str]  # as set in the environment; None when unset
    problem: str = ""  # the warning to give for a bad value ("" when good or unset)


def read(name: str, environ: Optional[Mapping[str, str]] = None) -> Reading:
    """``name``'s value from the environment, parsed; never raises."""
    var = BY_NAME[name]
    raw = (os.environ if environ is None else environ).get(name)
    text = (raw or "").strip()
    if not text:
        return Reading(var.default, raw)
    try:
        return Reading(var.parse(text), raw)
    except (ValueError, OverflowError):
        return Reading(var.default, raw, f"{name}={raw!r} is not understood; accepted: "
                       f"{var.accepted.replace('`', '')}. "
                       f"{var.if_bad or f'Using {var.default!r}.'}")


def markdown() -> str:
    """The README's variables table, made from ``VARIABLES``."""
    rows = ["| variable | values | meaning |", "| --- | --- | --- |"]
    for var in OURS:
        rows.append(f"| `{var.name}` | {var.accepted} | {var.meaning} |")
    rows.append(f"| `{OVERRIDE_PREFIX}<KEY>` | by the key's type | set any Inductor config "
                f"key; `{KEEP_TUNING}=1` also keeps autotuning asked for in code |")
    return "\n".join(rows)


# ---- the process environment: read and written here only --------------------------------

def raw(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``name`` as set (unparsed: another tool's variable, or a value passed through);
    None when unset."""
    return (os.environ if environ is None else environ).get(name)


def names(prefix: str = "", suffix: str = "",
          environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """The variables set that start with ``prefix`` and end with ``suffix``, sorted."""
    return sorted(v for v in (os.environ if environ is None else environ)
                  if v.startswith(prefix) and v.endswith(suffix))


def environment(**extra: str) -> Dict[str, str]:
    """A copy of this process's environment with ``extra`` set: for a child process, or to
    audit the environment as the shell set it (torch's import adds variables)."""
    return {**os.environ, **extra}


def export(name: str, value: str, keep: bool = False) -> str:
    """Set ``name`` for this process and the children it starts (``keep``: unless already
    set); the value in force."""
    if keep:
        return os.environ.setdefault(name, value)
    os.environ[name] = value
    return value


def exported(name: str, value: str) -> ContextManager[Any]:
    """``name`` set to ``value`` for the time of a ``with`` block, then as it was."""
    from rocm_autopatch import patching

    return patching.swapped(os.environ, name, value, item=True)


def take(name: str) -> str:
    """``name``'s value, removed from the environment ("" when unset): what a parent handed
    this process alone, which the processes this one starts must not inherit."""
    return os.environ.pop(name, "")


def user_cache(*parts: str) -> str:
    """A path under the user's cache directory: ``$XDG_CACHE_HOME/rocm-autopatch`` (else
    ``~/.cache/rocm-autopatch``)."""
    cache = raw(XDG_CACHE) or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "rocm-autopatch", *parts)
