"""The one way rocm-autopatch changes something torch exposes: wrap once, marked,
reversible; or swap for the time of a block.

``wrap(owner, name, make)`` replaces ``owner.name`` with ``make(original)``, a plain
function that carries the original's name, qualified name and doc, ``__wrapped__`` (so
``inspect.signature`` sees the original's) and our mark. A second ``wrap`` of the same
attribute (a second activation path, a reload) finds the mark and changes nothing.
``unwrap`` puts the original back, as typeguard's import hook can be uninstalled, so tests
can patch and restore inside one process. Each attribute has one owner module:
``torch.compile`` the compile guard, ``torch._dynamo.convert_frame._compile`` the
compile-frame hook, ``torch._inductor.compile_fx.compile_fx`` the numerics sentinel,
``capture_begin``/``capture_end`` of ``CUDAGraph`` and ``torch.accelerator.Graph`` the capture
policy (it counts captures for the sentinel), ``VecISA.check_build`` the caches,
``CachingAutotuner.coordinate_descent_tuning`` the coordinate-descent reuse,
``torch._inductor.compile_fx._compile_fx_inner`` the ranks' compile-once lock.

``swapped(owner, name, value)`` is the temporary twin: ``owner.name`` (or ``owner[name]``, a
mapping's item such as an environment variable) is ``value`` inside a ``with`` block and
what it was after it, absent again where it was absent, whatever the block raised. Every
change that must last only as long as one compile or one capture goes through it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator, List, Optional, Tuple

MARK = "__rocm_autopatch__"
_lock = threading.RLock()
_installed: List[Tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)
_ABSENT = object()


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


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any, item: bool = False) -> Iterator[Any]:
    """``owner.name`` (``owner[name]`` with ``item``) is ``value`` inside the block; the
    value it replaced is yielded. An attribute is read from the owner's own ``__dict__``
    where it has one, so that a class's ``classmethod`` or ``staticmethod`` object comes back
    as it was, not as the bound function ``getattr`` returns, and an inherited attribute is
    inherited again afterwards."""
    if item:
        before = owner.get(name, _ABSENT)
        owner[name] = value
    else:
        own = getattr(owner, "__dict__", None)
        before = own.get(name, _ABSENT) if own is not None else getattr(owner, name, _ABSENT)
        setattr(owner, name, value)
    try:
        yield None if before is _ABSENT else before
    finally:
        if before is not _ABSENT:
            if item:
                owner[name] = before
            else:
                setattr(owner, name, before)
        elif item:
            owner.pop(name, None)
        else:
            delattr(owner, name)
