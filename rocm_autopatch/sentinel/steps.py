"""One step of a bisection: a run of a repro's ``repro.py`` without rocm-autopatch, under a
time limit, with the bisector's state and the change to try, and its verdict.

Each step is an interpreter of its own: torch's compiler keeps global state (lowerings
registered, tables cached) that one step must not hand the next. For a GPU graph it is a
fresh interpreter. For a CPU graph it is a fork of one interpreter that has imported torch
and its compiler and nothing else (``SERVER``): the import is most of a step's time there
(a step of the README demo's graph: 8.4 s fresh, 3.7 s forked, on a 2-core CPU), and
forking after ``import torch`` is what torch's own DataLoader workers do. A GPU build is
not forked: a device runtime initialised before a fork is unusable in the child, and which
imports touch the runtime cannot be proved for every build (HIP included) here.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

STEP_SECONDS = 600.0  # one run of the repro (a compile)

# Caches keyed on the graph and settings, not on the bisector's state or the change tried,
# would serve one step's compile to the next; torch's kernel caches (C++ and Triton, keyed by
# the kernel's source) stay on. Step 1 without them took 19.9 s to compile the README demo's
# graph on a 2-core CPU; a later step 7.1 s.
GRAPH_CACHES_OFF = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
                    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0",
                    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "0",
                    # Dynamo's record of which dimensions changed (pgo.py), kept per frame
                    "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_LOCAL_PGO": "0",
                    "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0"}

# A step reads the bisector's state from the directory the bisecting process writes it to
# (torch reads it from its Inductor cache directory, which a repro sets to the program's),
# and applies a change that is not an Inductor setting (those go on repro.py's command line,
# after the settings the repro makes itself), then runs the repro.
BOOT = """\
import json, os, runpy, sys
state = os.environ.pop("ROCM_AUTOPATCH_BISECT_STATE", "")
if state:
    from torch._inductor import compiler_bisector as cb
    cb.CompilerBisector.in_process_cache = state
    cb.CompilerBisector.bisection_enabled = cb.get_is_bisection_enabled()
name = json.loads(os.environ.pop("ROCM_AUTOPATCH_BISECT_NAME", "null"))
if name:
    from rocm_autopatch.sentinel import naming
    naming.install(**name)
change = json.loads(os.environ.pop("ROCM_AUTOPATCH_BISECT_CHANGE", "null"))
if change:
    from rocm_autopatch.sentinel import fixes
    applied = fixes.applied({"change": change})  # held: collected, it would undo itself
    applied.__enter__()
path = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(path, run_name="__main__")
"""

# The warm interpreter of a CPU graph's steps: one request a line on stdin ({"env", "argv",
# "cwd", "output", "timeout"}), one answer a line on stdout ({"rc"}: None when it timed out).
# Each step runs in a forked child in a session of its own; what the child leaves running
# (Inductor's compile workers) goes with it.
SERVER = """\
import json, os, signal, sys, time, traceback
for name in ("torch", "torch._dynamo", "torch._functorch.aot_autograd",
             "torch._inductor.compile_fx", "torch._inductor.lowering",
             "torch._inductor.compiler_bisector"):
    try:
        __import__(name)
    except Exception:
        pass
BOOT = sys.argv[1]
for line in sys.stdin:
    ask = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            out = os.open(ask["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.environ.update(ask["env"])
            os.chdir(ask["cwd"])
            sys.argv = ["-c", *ask["argv"]]
            try:
                exec(compile(BOOT, "<bisect step>", "exec"), {"__name__": "__main__"})
                code = 0
            except SystemExit as done:
                if isinstance(done.code, int) or done.code is None:
                    code = done.code or 0
                else:
                    print(done.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
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
    sys.stdout.write(json.dumps({"rc": rc}) + "\\n")
    sys.stdout.flush()
"""

VERDICTS = ("REPRODUCED", "not reproduced")  # how repro.py's runner ends (repro.RUNNER)


class OutOfTime(Exception):
    pass


class Runner:
    """Runs the repro, one step at a time, within the limits; says where it is."""

    def __init__(self, folder: str, limit: float, say: Callable[[str], None],
                 log_file: Any, device: Optional[str] = None) -> None:
        self.repro = os.path.join(folder, "repro.py")
        self.deadline = time.monotonic() + limit
        self.start = time.monotonic()
        self.say = say
        self.log = log_file
        self.steps = 0
        self.last = ""  # the last step's last line of output, and how it ended
        self.verdict = False  # whether that step ended with repro.py's verdict
        self.state = tempfile.mkdtemp(prefix="rocm-autopatch-bisect-")
        self.kernels = os.path.join(self.state, "inductor")  # Triton's goes under it too
        self.fork = device == "cpu" and hasattr(os, "fork")
        self.server: Optional[subprocess.Popen] = None
        self.forked = 0  # steps run as forks of the warm interpreter

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def good(self, what: str, change: Optional[Dict[str, Any]] = None,
             bisector: str = "", name: Optional[Dict[str, Any]] = None) -> bool:
        """Whether the repro matches eager in this step (exit status 0)."""
        left = self.deadline - time.monotonic()
        if left <= 1:
            raise OutOfTime()
        self.steps += 1
        self.say(f"rocm-autopatch bisect: step {self.steps} ({self.elapsed():.0f} s): {what}")
        step = {"ROCM_AUTOPATCH_BISECT_STATE": bisector}
        argv = [self.repro]
        if name:
            step["ROCM_AUTOPATCH_BISECT_NAME"] = json.dumps(name)
        if change and change["kind"] == "config":
            argv.append(f"{change['key']}={change['value']!r}")
        elif change:
            step["ROCM_AUTOPATCH_BISECT_CHANGE"] = json.dumps(change)
        if change and change["kind"] == "env":
            # Triton's key need not know the variable: its kernels are built afresh.
            step["TRITON_CACHE_DIR"] = tempfile.mkdtemp(dir=self.state)
        self.log.write(f"\n---- step {self.steps}: {what}\n")
        self.log.flush()
        timeout = min(left, STEP_SECONDS)
        answer = self._forked(step, argv, timeout) if self.fork else None
        if answer is None:
            answer = self._fresh(step, argv, timeout)
        output, rc = answer
        self._output(output, "the step timed out" if rc is None else f"exit status {rc}")
        if rc is None and time.monotonic() >= self.deadline - 1:
            raise OutOfTime()
        return rc == 0

    def _base_env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update({"ROCM_AUTOPATCH": "0", "PYTHONDONTWRITEBYTECODE": "1", **GRAPH_CACHES_OFF,
                    "TORCHINDUCTOR_CACHE_DIR": self.kernels})
        return env

    def _fresh(self, step: Dict[str, str], argv: List[str], timeout: float) -> tuple:
        try:
            proc = subprocess.run([sys.executable, "-c", BOOT, *argv],
                                  env={**self._base_env(), **step}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, cwd=os.path.dirname(self.repro),
                                  timeout=timeout)
        except subprocess.TimeoutExpired as timed_out:
            return timed_out.output, None
        return proc.stdout, proc.returncode

    def _forked(self, step: Dict[str, str], argv: List[str], timeout: float
                ) -> Optional[tuple]:
        """The step as a fork of the warm interpreter; None where that interpreter cannot
        serve it (it failed to start or died): the step then runs fresh, as do the rest."""
        output = os.path.join(self.state, "step.out")
        try:
            if self.server is None:
                self.server = subprocess.Popen(
                    [sys.executable, "-c", SERVER, BOOT], env=self._base_env(),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    cwd=os.path.dirname(self.repro), start_new_session=True)
            assert self.server.stdin is not None and self.server.stdout is not None
            self.server.stdin.write((json.dumps({
                "env": step, "argv": argv, "cwd": os.path.dirname(self.repro),
                "output": output, "timeout": timeout}) + "\n").encode())
            self.server.stdin.flush()
            # The server's own limit is the step's; this one is for a server that hangs.
            ready, _, _ = select.select([self.server.stdout], [], [], timeout + 60)
            line = self.server.stdout.readline() if ready else b""
            rc = json.loads(line)["rc"]
            with open(output, "rb") as fh:
                text = fh.read()
        except (OSError, ValueError, KeyError, AssertionError) as exc:
            self.log.write(f"(the warm interpreter could not run the step: {exc!r}; the "
                           "steps run in fresh interpreters from here)\n")
            self.fork = False
            self._stop_server()
            return None
        self.forked += 1
        return text, rc

    def _stop_server(self) -> None:
        if self.server is not None:
            try:
                os.killpg(self.server.pid, signal.SIGKILL)
            except OSError:
                pass
            self.server.wait()
            self.server = None

    def _output(self, output: Optional[bytes], status: str) -> None:
        """The child's output goes to the log; its verdict line (else its last line) is kept
        for the answer."""
        text = (output or b"").decode(errors="replace")
        self.log.write(f"{text}({status})\n")
        self.log.flush()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        # repro.py's runner ends with its verdict; without one, the step failed to run
        said = [line for line in lines if line.startswith(VERDICTS)]
        self.verdict = bool(said)
        last = (said or lines or ["no output"])[-1]
        self.last = f"{last[:300]} ({status})"

    def close(self) -> None:
        self._stop_server()
        shutil.rmtree(self.state, ignore_errors=True)
