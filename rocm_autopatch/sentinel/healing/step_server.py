"""The warm interpreter of a CPU graph's bisection: imports torch and its compiler once,
then runs each step in a fork of itself.

``python -m rocm_autopatch.sentinel.healing.step_server``: one request a line on stdin (``{"env",
"argv", "cwd", "output", "timeout"}``), one answer a line on stdout (``{"rc"}``: None when
the step ran past its time). Each step is a forked child in a session of its own, its
output in the file ``output``; past its time it is killed with its session, and what it
left running (Inductor's compile workers) goes with it. Forking after ``import torch`` is
what torch's own DataLoader workers do; a GPU build is never served here (``steps``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from typing import Any, Dict, Optional

from rocm_autopatch import settings
from rocm_autopatch.sentinel.healing import step_child

# What every step would import: most of a step's time when run fresh.
WARM = ("torch", "torch._dynamo", "torch._functorch.aot_autograd",
        "torch._inductor.compile_fx", "torch._inductor.lowering",
        "torch._inductor.compiler_bisector")


def _child(ask: Dict[str, Any]) -> None:
    """In the fork: the step, its output to its file; never returns."""
    code = 1
    try:
        os.setsid()
        out = os.open(ask["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        for name, value in ask["env"].items():
            settings.export(name, value)
        os.chdir(ask["cwd"])
        try:
            step_child.main(ask["argv"])
            code = 0
        except SystemExit as done:
            if isinstance(done.code, int) or done.code is None:
                code = done.code or 0
            else:
                print(done.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the step's failure is its verdict
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(ask: Dict[str, Any]) -> Optional[int]:
    """One step: its exit status, or None when it ran past ``ask["timeout"]``."""
    pid = os.fork()
    if pid == 0:
        _child(ask)
    deadline = time.monotonic() + ask["timeout"]
    rc = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if rc is None:
        os.waitpid(pid, 0)
    return rc


def _warm() -> None:
    """Import what every step would, and pick the CPU's vector ISA once for all of them.

    Inductor picks it at a CPU graph's first compile by building a probe library for each
    ISA the CPU names and loading it in a child Python (``torch/_inductor/cpu_vec_isa.py``,
    ``valid_vec_isa_list``): about 2 s of a 5-6 s step here. The answer depends only on the
    machine and torch's build, and the forks inherit it.
    """
    for name in WARM:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a step imports what it needs itself
            pass
    try:
        from torch._inductor import cpu_vec_isa

        cpu_vec_isa.valid_vec_isa_list()
    except Exception:  # noqa: BLE001 - a step that needs it picks it itself
        pass


def main() -> None:
    _warm()
    for line in sys.stdin:
        sys.stdout.write(json.dumps({"rc": serve(json.loads(line))}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
