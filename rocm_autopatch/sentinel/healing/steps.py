"""One step of a bisection: a run of a repro's ``repro.py`` without rocm-autopatch, under a
time limit, with the bisector's state and the change to try, and its verdict.

Each step is an interpreter of its own: torch's compiler keeps global state (lowerings
registered, tables cached) that one step must not hand the next. For a GPU graph it is a
fresh interpreter. For a CPU graph it is a fork of one interpreter that has imported torch
and its compiler and nothing else (``step_server``): the import is most of a step's time there
(a step of the README demo's graph: 8.4 s fresh, 3.7 s forked, on a 2-core CPU), and
forking after ``import torch`` is what torch's own DataLoader workers do. A GPU build is
not forked: a device runtime initialised before a fork is unusable in the child, and which
imports touch the runtime cannot be proved for every build (HIP included) here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from rocm_autopatch import settings

STEP_SECONDS = 600.0  # one run of the repro (a compile)

# Caches keyed on the graph and settings, not on the bisector's state or the change tried,
# would serve one step's compile to the next; torch's kernel caches (C++ and Triton, keyed by
# the kernel's source and compile flags) stay on, in the bisection's own directory, seeded
# with links to the program's kernels (``seed``). Step 1 in an empty directory took 19.9 s
# to compile the README demo's graph on a 2-core CPU; a later step 7.1 s.
GRAPH_CACHES_OFF = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
                    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0",
                    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "0",
                    # Dynamo's record of which dimensions changed (pgo.py), kept per frame
                    "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_LOCAL_PGO": "0",
                    "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0"}

# What a step sets in the environment that repro.py's own pins must not undo (torch writes
# the program's TORCH*, TRITON*, INDUCTOR* variables into a repro; ``repro._fill`` makes
# these defaults): the caches above, where kernels go, and the knobs' variables
# (``bisect.KNOBS``, tested).
STEP_VARIABLES = frozenset({*GRAPH_CACHES_OFF, "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
                            "TRITON_HIP_USE_BLOCK_PINGPONG", "AMDGCN_USE_BUFFER_OPS"})

CHILD = "rocm_autopatch.sentinel.healing.step_child"  # one step, in a fresh interpreter (-m)
SERVER = "rocm_autopatch.sentinel.healing.step_server"  # the warm interpreter of a CPU graph (-m)

VERDICTS = ("REPRODUCED", "not reproduced")  # how repro.py's runner ends (repro.RUNNER)


class OutOfTime(Exception):
    pass


PINNED = re.compile(r"^os\.environ\.setdefault\('TORCHINDUCTOR_CACHE_DIR', (.+)\)$", re.MULTILINE)


def program_kernels(repro: str) -> Optional[str]:
    """The Inductor cache directory ``repro`` pins (the program's, ``repro._fill``) where it
    exists on this machine: there the program's compile left the graph's kernels. None where
    the repro names none, or a directory this machine lacks (a repro sent from elsewhere)."""
    try:
        with open(repro) as handle:
            found = PINNED.search(handle.read())
        where = ast.literal_eval(found.group(1)) if found else None
    except (OSError, ValueError, SyntaxError):
        return None
    return where if isinstance(where, str) and os.path.isdir(where) else None


SEED_FILES = 100_000  # at most this many of the program's files are linked (a second or so)


def seed(program: Optional[str], kernels: str) -> int:
    """``kernels`` (the bisection's own cache) made a tree of hard links to the files of
    ``program``'s, so that the first step finds the graph's kernels built (a kernel is found
    by its source and compile flags: a step that changes what is generated builds its own,
    in ``kernels``). Links, not the program's directory itself: the steps' kernels and the
    configurations they tune under a knob stay out of the program's cache and go with the
    bisection; torch's own bisector state there (``bisect/``, its command line's) and lock
    files are left out; torch and Triton replace a cache file by renaming a new one over
    it, never writing through a link. Stops at the first file it cannot link (another
    user's, another file system): the rest is built. Returns the files linked."""
    os.makedirs(kernels, exist_ok=True)
    if program is None:
        return 0
    linked = 0
    for root, dirs, names in os.walk(program):
        if root == program:
            dirs[:] = [d for d in dirs if d != "bisect"]
        here = os.path.join(kernels, os.path.relpath(root, program))
        try:
            os.makedirs(here, exist_ok=True)
            for name in names:
                if name.endswith(".lock") or linked >= SEED_FILES:
                    continue
                os.link(os.path.join(root, name), os.path.join(here, name))
                linked += 1
        except OSError:
            return linked
    return linked


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
        self.kernels = os.path.join(self.state, "inductor")  # Triton's go under it too
        seed(program_kernels(self.repro), self.kernels)
        self.fork = device == "cpu" and hasattr(os, "fork")
        self.server: Optional[subprocess.Popen] = None
        self.forked = 0  # steps run as forks of the warm interpreter
        self.answered = 0  # questions answered without a run (``known``)

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
        step = {settings.BISECT_STATE: bisector}
        argv = [self.repro]
        if name:
            step[settings.BISECT_NAME] = json.dumps(name)
        if change and change["kind"] == "config":
            argv.append(f"{change['key']}={change['value']!r}")
        elif change:
            step[settings.BISECT_CHANGE] = json.dumps(change)
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

    def known(self, what: str, answer: str) -> None:
        """A question whose answer is known without a run: said in the log, not run."""
        self.answered += 1
        self.log.write(f"\n---- not run: {what}\n{answer}\n")
        self.log.flush()

    def _base_env(self) -> Dict[str, str]:
        return settings.environment(ROCM_AUTOPATCH="0", PYTHONDONTWRITEBYTECODE="1",
                                    **GRAPH_CACHES_OFF, TORCHINDUCTOR_CACHE_DIR=self.kernels)

    def _fresh(self, step: Dict[str, str], argv: List[str], timeout: float) -> tuple:
        try:
            proc = subprocess.run([sys.executable, "-m", CHILD, *argv],
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
                    [sys.executable, "-m", SERVER], env=self._base_env(),
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
