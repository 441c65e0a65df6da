"""In a bisection child: what torch's bisector's application N of a subsystem is (the op
decomposed, the node lowered, the pass), where the running torch does not keep it where
the parent can read it (torch 2.11 keeps it in the child's memory).

It counts the applications as torch's ``CompilerBisector.disable_subsystem`` does (from
0, the calls for that stage and subsystem) and writes the N-th's name to a file; nothing
is disabled. The name is torch's own debug text where the call site gives one, else the
caller's ``op`` (a decomposition, ``torch/fx/experimental/proxy_tensor.py``
``maybe_handle_decomp``) or ``n`` (an FX node, ``torch/_inductor/graph.py``).
"""

from __future__ import annotations

import sys
from typing import Any


def install(backend: str, subsystem: str, number: int, out: str) -> None:
    from torch._inductor.compiler_bisector import CompilerBisector

    seen = [0]

    def disable_subsystem(cls: Any, name: str, system: str, debug_info: Any = None) -> bool:
        if name == backend and system == subsystem:
            if seen[0] == number:
                caller = sys._getframe(1).f_locals
                what = debug_info() if debug_info is not None else (
                    repr(caller["op"]) if "op" in caller else
                    repr(caller["n"]) if "n" in caller else "")
                with open(out, "w") as fh:
                    fh.write(str(what))
            seen[0] += 1
        return False

    CompilerBisector.disable_subsystem = classmethod(disable_subsystem)  # type: ignore
    # The stage under test: torch.compile takes the bisector's backend as its own.
    CompilerBisector.get_backend = classmethod(lambda cls: backend)  # type: ignore
