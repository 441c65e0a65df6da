"""The one way rocm-autopatch wraps something torch exposes: wrap once, marked, reversible.

``wrap(owner, name, make)`` replaces ``owner.name`` with ``make(original)``, a plain
function that carries the original's name, qualified name and doc, ``__wrapped__`` (so
``inspect.signature`` sees the original's) and our mark. A second ``wrap`` of the same
attribute (a second activation path, a reload) finds the mark and changes nothing.
``unwrap`` puts the original back, as typeguard's import hook can be uninstalled, so tests
can patch and restore inside one process. Each attribute has one owner module:
``torch.compile`` the compile guard, ``torch._dynamo.convert_frame._compile`` the
compile-frame hook, ``torch._inductor.compile_fx.compile_fx`` the numerics sentinel,
``CUDAGraph.capture_end`` the capture policy.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, Optional, Tuple

MARK = "__rocm_autopatch__"
_lock = threading.RLock()
_installed: List[Tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)


def ours(fn: Any) -> bool:
    """Is ``fn`` a wrapper of ours?"""
    return getattr(fn, MARK, None) is True


def original_of(fn: Any) -> Any:
    """What our wrapper ``fn`` wraps (``fn`` itself when it is not ours)."""
    return fn.__wrapped__ if ours(fn) else fn


def wrap(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]],
         like_original: bool = False) -> Optional[Any]:
    """``owner.name`` wrapped by ``make(original)``, once; the wrapper in place (None where
    ``owner`` has no callable ``name``). ``like_original`` also takes the original's module
    and attributes: for a public function pickled by reference (``torch.compile``)."""
    with _lock:
        current = getattr(owner, name, None)
        if current is None or not callable(current):
            return None
        if ours(current):
            return current
        wrapper = make(current)
        functools.update_wrapper(
            wrapper, current, updated=("__dict__",) if like_original else (),
            assigned=("__module__", "__name__", "__qualname__", "__doc__") if like_original
            else ("__name__", "__qualname__", "__doc__"))
        setattr(wrapper, MARK, True)
        setattr(owner, name, wrapper)
        _installed.append((owner, name, current, wrapper))
        return wrapper


def unwrap(owner: Any, name: str) -> bool:
    """Put the original of ``owner.name`` back where our wrapper is there; True if it was."""
    with _lock:
        current = getattr(owner, name, None)
        for i, (o, n, original, wrapper) in enumerate(_installed):
            if o is owner and n == name:
                del _installed[i]
                if current is wrapper:
                    setattr(owner, name, original)
                    return True
        return False


def unwrap_all() -> int:
    """Undo every wrap of this process, newest first; how many were undone."""
    with _lock:
        done = 0
        for owner, name, _original, _wrapper in reversed(list(_installed)):
            done += unwrap(owner, name)
        return done
