"""The core modules, in this process: the one patching idiom on the real ``torch.compile``
(wrapped once, unwrapped, another's later wrapper left in place) and frames (the user's
``file:line``). What is patched is put back by ``patching.unwrap_all``."""

from __future__ import annotations

import sys
from typing import Any, Dict

import pytest

from rocm_autopatch import frames, patching

pytestmark = pytest.mark.fast


def test_the_guard_wraps_torch_compile_once_and_unwraps_it() -> None:
    torch = pytest.importorskip("torch")
    from rocm_autopatch.guards import compile_options

    before = torch.compile
    assert not patching.ours(before)  # a CPU build: the package applied nothing here
    compile_options.install(torch)
    try:
        guarded = torch.compile
        assert patching.ours(guarded) and patching.original_of(guarded) is before
        assert guarded.__module__ == before.__module__ and guarded.__name__ == "compile"
        compile_options.install(torch)  # idempotent
        assert torch.compile is guarded
        seen: Dict[str, Any] = {}
        real = torch._TorchCompileInductorWrapper.__init__

        def spy(self: Any, mode: Any, options: Any, *rest: Any) -> None:
            seen.update(mode=mode, options=options)
            real(self, mode, options, *rest)

        torch._TorchCompileInductorWrapper.__init__ = spy
        try:
            f = torch.compile(lambda x: x * 2, mode="reduce-overhead")
        finally:
            torch._TorchCompileInductorWrapper.__init__ = real
        assert seen == {"mode": "default", "options": None}
        assert torch.equal(f(torch.ones(3)), torch.full((3,), 2.0))
    finally:
        assert patching.unwrap_all() == 1
    assert torch.compile is before


def test_unwrap_leaves_a_later_wrapper_of_someone_else_in_place() -> None:
    class Owner:
        @staticmethod
        def f() -> str:
            return "original"

    patching.wrap(Owner, "f", lambda original: lambda: "ours:" + original())
    assert Owner.f() == "ours:original"

    def theirs() -> str:
        return "theirs"

    Owner.f = theirs  # someone wrapped after us: ours is not put back over theirs
    assert patching.unwrap(Owner, "f") is False and Owner.f is theirs


def test_user_site_is_this_file_and_line() -> None:
    here = frames.user_site()
    assert here is not None and here[0] == __file__ and here[2] == sys._getframe().f_code.co_name
    assert frames.label("/a/b.py", 3, "f") == "f (/a/b.py:3)"
    assert frames.in_library("/x/lib/python3.11/site-packages/transformers/m.py")
    assert not frames.in_library(__file__)



def test_a_directory_lock_held_elsewhere_is_waited_for_only_a_bounded_time(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder that never lets go (a stopped process, a forked child that kept the lock)
    leaves the writer unserialised after ``WAIT``, never hung at its exit."""
    import fcntl
    import os

    from rocm_autopatch import files

    holder = os.open(str(tmp_path), os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another open file: it conflicts, even in-process
    monkeypatch.setattr(files.directory_lock, "WAIT", 0.2)
    lock = files.directory_lock(str(tmp_path))
    with lock:
        assert lock.fd is None  # entered without the lock: the write goes on unserialised
    os.close(holder)
    with lock:
        assert lock.fd is not None  # free again: taken
        with pytest.raises(BlockingIOError):
            other = os.open(str(tmp_path), os.O_RDONLY)
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(other)
