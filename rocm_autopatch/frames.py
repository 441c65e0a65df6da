"""Frames: turning a stack or a code object into the user's file:line.

The one place that names where something happened, as torch's own logs and structured
trace name it: a frame label ``f (file.py:12)``, the user's innermost frame on the stack
(skipping torch, rocm-autopatch, and with ``libraries`` any installed package), and the
test for an installed package's file.
"""

from __future__ import annotations

import os
import re
import sys
import types
from typing import Any, Dict, Optional, Tuple

import _rocm_autopatch_start

Where = Tuple[str, int, str]  # (file, line, function)
OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep
_START = os.path.splitext(os.path.abspath(_rocm_autopatch_start.__file__))[0]
LIBRARY_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_STDLIB_WRAPPERS = (os.sep + "functools.py", os.sep + "contextlib.py")


def label(filename: str, line: int, name: str) -> str:
    """How a compiled frame is named everywhere a user reads it: ``f (file.py:12)``."""
    return f"{name} ({filename}:{line})"


def short(filename: str) -> str:
    """``filename`` as a user reads it in a warning: an installed package's from the
    package on (``transformers/utils/generic.py``), one below the working directory
    relative to it, one below the home directory from ``~``; anything else whole."""
    for part in LIBRARY_DIRS:
        if part in filename:
            return filename.rsplit(part, 1)[1]
    here = os.getcwd() + os.sep
    if filename.startswith(here):
        return filename[len(here):]
    home = os.path.expanduser("~")
    if home not in ("~", os.sep) and filename.startswith(home + os.sep):
        return "~" + filename[len(home):]
    return filename


def shortened(text: str) -> str:
    """``text`` with each absolute path in it ``short``: how a warning names a frame."""
    return _PATH.sub(lambda found: short(found.group(0)), text)


_PATH = re.compile(r"/[^\s:()]+")


def in_library(filename: str) -> bool:
    """Is ``filename`` an installed package's (site-packages, dist-packages)?"""
    return any(part in filename for part in LIBRARY_DIRS)


def torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(getattr(torch, "__file__", None) or "/nonexistent/torch") + os.sep


def _ours_or_torch(filename: str, torch: str) -> bool:
    return (filename.startswith(torch) or filename.startswith(OURS)
            or filename.startswith(_START) or filename.startswith("<frozen ")
            or filename.endswith(_STDLIB_WRAPPERS))


def user_site(libraries: bool = False, depth: int = 1) -> Optional[Where]:
    """(file, line, function) of the innermost caller on this thread's stack that is
    neither torch, rocm-autopatch nor a stdlib wrapper (functools, contextlib), nor, with
    ``libraries``, any installed package: as torch's "start compiling" stack shows it;
    None when there is none."""
    torch = torch_dir()
    frame: Optional[types.FrameType] = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (_ours_or_torch(filename, torch) or libraries and in_library(filename)):
            return filename, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def site_text(libraries: bool = False) -> str:
    """``file:line`` of ``user_site``; "<unknown>" when there is none."""
    found = user_site(libraries, depth=2)
    return f"{found[0]}:{found[1]}" if found else "<unknown>"


def compiled_frame(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Where:
    """(file, first line, name) of the frame Dynamo's ``_compile`` was called for. A frame
    of torch's own (``inner`` in ``torch/_dynamo/external_utils.py`` for a compiled module,
    the wrapper of a lazily compiled backward) is named by the user's call that reached it,
    as torch's structured trace does."""
    code = args[0] if args else kwargs.get("code")
    if not isinstance(code, types.CodeType):
        return "<unknown>", 0, "<unknown>"
    found = code.co_filename, code.co_firstlineno, code.co_name
    if code.co_filename.startswith(torch_dir()):
        return user_site(depth=2) or found
    return found
