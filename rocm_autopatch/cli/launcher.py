"""``rocm-autopatch run [--profile P] -- python [flags] script.py|-m mod|-c code args...``

For processes where the .pth cannot run (``python -S``, an interpreter whose site-packages
are not processed). The launcher re-executes the same Python command with a short ``-c``
shim put in front of the target::

    python [flags] -c "<shim>" script.py args...

The shim appends the directory holding rocm-autopatch to the *end* of
``sys.path`` where it is missing, runs the start-up call, and then runs the target the way
the interpreter itself would: same ``sys.argv``, ``sys.path[0]``, ``__main__`` module,
exit status, and a traceback without our frames. Commands that are not a Python
interpreter (``torchrun``, ``accelerate``) are run unchanged: their Python processes get
the .pth as usual. ``os.execvpe`` replaces the launcher, so signals and exit status are
the target's own.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import types
from typing import List, NoReturn, Optional, Sequence, Tuple

# Python's own options: those that take a value, and the flags that don't.
_WITH_VALUE = "WX"
_FLAGS = "bBdEhiIOPqsSuvVx"
_LONG_WITH_VALUE = ("--check-hash-based-pycs",)
_PYTHON_NAME = re.compile(r"^(python|pypy)[\d.]*(-dbg)?$")


class UsageError(ValueError):
    pass


def split_python_command(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """``[python, flags..., target...]`` -> (interpreter + its flags, target + its args).

    The target starts at the script path, ``-m``, ``-c`` or ``-`` (stdin).
    """
    head, i = [argv[0]], 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return head, list(argv[i + 1:])
        if arg in _LONG_WITH_VALUE:
            head += argv[i:i + 2]
            i += 2
            continue
        if arg.startswith("--"):  # --help, --version, ...
            head.append(arg)
            i += 1
            continue
        if not arg.startswith("-") or arg == "-":
            return head, list(argv[i:])
        # A cluster such as -uS, -Wignore, -um mod, -c'code'.
        for j in range(1, len(arg)):
            letter = arg[j]
            if letter in "mc":
                if j > 1:
                    head.append(arg[:j])
                value = arg[j + 1:]
                rest = list(argv[i + 1:])
                return head, ([f"-{letter}", value] + rest if value else [f"-{letter}"] + rest)
            if letter in _WITH_VALUE:
                if j + 1 == len(arg):  # -W ignore: the value is the next argument
                    head += argv[i:i + 2]
                    i += 1
                else:
                    head.append(arg)
                break
            if letter not in _FLAGS:
                head.append(arg)  # unknown to us: pass it through untouched
                break
        else:
            head.append(arg)
        i += 1
    return head, []


def is_python(executable: str) -> bool:
    if _PYTHON_NAME.match(os.path.basename(executable)):
        return True
    try:
        return os.path.samefile(executable, sys.executable)
    except OSError:
        return False


def _import_dirs() -> List[str]:
    """Where rocm_autopatch and the start-up module live (for the shim's sys.path): the
    directories that hold them, never a directory inside the package (it would shadow a
    user's module named ``log`` or ``settings`` with ours)."""
    import _rocm_autopatch_start
    import rocm_autopatch

    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(rocm_autopatch.__file__))),
            os.path.dirname(os.path.abspath(_rocm_autopatch_start.__file__))]
    return list(dict.fromkeys(dirs))


def shim(dirs: Sequence[str]) -> str:
    # Expressions only: the shim must leave no names behind in __main__.
    return (f"[__import__('sys').path.append(d) for d in {list(dirs)!r} "
            "if d not in __import__('sys').path]; "
            "__import__('rocm_autopatch.cli.launcher').cli.launcher.run_target()")


def command(argv: Sequence[str]) -> List[str]:
    """The command the launcher executes for the user's ``argv``."""
    if not argv:
        raise UsageError("nothing to run; usage: rocm-autopatch run [--profile P] -- "
                         "python script.py args...")
    if argv[0] == "-m" or argv[0] == "-c" or argv[0].endswith(".py"):
        argv = [sys.executable, *argv]  # `rocm-autopatch run -- script.py`: this Python
    if not is_python(argv[0]):
        return list(argv)
    head, target = split_python_command(argv)
    if not target or target[0] == "-" or target[0] in ("-m", "-c") and len(target) < 2:
        # Nothing we can run in front of (an interactive session, stdin, --version...).
        return list(argv)
    return [*head, "-c", shim(_import_dirs()), *target]


def main(argv: Sequence[str], profile: Optional[str]) -> NoReturn:
    from rocm_autopatch import settings  # here: the target process imports this module

    env = settings.environment()
    if profile:
        env[settings.PROFILE] = profile
    new = command(argv)
    try:
        os.execvpe(new[0], new, env)
    except OSError as exc:
        from _rocm_autopatch_start import say

        say(f"rocm-autopatch run: cannot run {new[0]!r}: {exc.strerror}\n")
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)


# ---- in the target process, called by the shim -------------------------------------------


def _strip_our_frames(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """Drop this module's frames from the top: what is left is what Python would show."""
    ours = run_target.__code__.co_filename
    while tb is not None and tb.tb_frame.f_code.co_filename == ours:
        tb = tb.tb_next
    return tb


def _set_path0(value: str) -> None:
    # Under -I / -P the interpreter puts nothing in front of sys.path: neither do we.
    if sys.flags.isolated or getattr(sys.flags, "safe_path", False):
        return
    if sys.path and sys.path[0] == "":
        sys.path[0] = value


def _run_script(path: str, main: types.ModuleType) -> None:
    import runpy

    if os.path.isdir(path) or not path.endswith((".py", ".pyw")) and _is_zip(path):
        if not _has_main(path):
            _exit_as_python(f"can't find '__main__' module in {os.path.abspath(path)!r}", 1)
        _set_path0(path)  # a directory or zip with __main__.py, as the interpreter does
        runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
        return
    from importlib.machinery import SourceFileLoader

    _set_path0(os.path.dirname(os.path.realpath(path)))
    filename = os.path.abspath(path)
    try:
        with open(filename, "rb") as f:
            source = f.read()
    except OSError as exc:
        _exit_as_python(f"can't open file {filename!r}: [Errno {exc.errno}] {exc.strerror}", 2)
    code = compile(source, filename, "exec", dont_inherit=True)
    main.__dict__.update(__file__=filename, __cached__=None,
                         __loader__=SourceFileLoader("__main__", filename))
    exec(code, main.__dict__)


def _exit_as_python(message: str, status: int) -> None:
    """What the interpreter itself says and does when it cannot run its script."""
    from _rocm_autopatch_start import say

    program = (getattr(sys, "orig_argv", None) or [sys.executable])[0]
    say(f"{program}: {message}\n")
    raise SystemExit(status)


def _has_main(path: str) -> bool:
    if os.path.isdir(path):
        return any(os.path.exists(os.path.join(path, f"__main__{ext}"))
                   for ext in (".py", ".pyc"))
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return any(n in archive.namelist() for n in ("__main__.py", "__main__.pyc"))


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


def run_target() -> None:
    """Run the target named in ``sys.argv[1:]`` as the interpreter itself would."""
    import _rocm_autopatch_start

    _rocm_autopatch_start.start("launcher")  # where the .pth already ran: recorded, no more
    target = sys.argv[1:]
    main = sys.modules["__main__"]
    try:
        if target[0] == "-m":
            import runpy

            sys.argv = ["-m", *target[2:]]  # runpy puts the module's path in argv[0]
            _set_path0(os.getcwd())
            runpy._run_module_as_main(target[1], alter_argv=True)  # type: ignore[attr-defined]
        elif target[0] == "-c":
            sys.argv = ["-c", *target[2:]]
            exec(compile(target[1], "<string>", "exec", dont_inherit=True), main.__dict__)
        else:
            sys.argv = list(target)
            _run_script(target[0], main)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported exactly as the interpreter would
        tb = _strip_our_frames(exc.__traceback__)
        # The default hook prints exc.__traceback__ whatever it is given: set it too.
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        if isinstance(exc, KeyboardInterrupt):  # die of SIGINT, as Python does
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)
