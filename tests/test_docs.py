"""Every command in README.md and docs/*.md runs: so none can go stale.

Each ```bash block is run as written, line after line in one shell (a later line may read
what an earlier one wrote), in a scratch directory holding the ``train.py`` and the
``mypkg.serve`` module the commands name, with the venv under test first on ``PATH`` and
ROCm behaviour forced (as on a ROCm machine; a command that sets ``ROCM_AUTOPATCH`` keeps
its own). The README's two fresh-machine commands are the exception: the test command is
what ``.ci/run`` runs (CI runs it on every submission), and the demo command runs as
written on a fresh copy of the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Tuple

import pytest
from conftest import ROOT, Venv, clean_env

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRESH = "python3.11 -m venv .venv && "  # the README's two fresh-machine commands
TRAIN = """import sys, torch
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
compiled = torch.compile(model)
print(float(compiled(torch.randn(8, 16)).sum()), sys.argv[1:])
"""


def blocks() -> List[Tuple[str, str]]:
    """(where, the block's commands) for every ```bash block."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in re.finditer(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            line = text[:match.start()].count("\n") + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", match.group(1)))
    return found


ORDINARY = [(where, body) for where, body in blocks() if not body.startswith(FRESH)]


def test_every_block_is_found_and_the_fresh_machine_commands_are_the_readmes() -> None:
    fresh = [body.strip() for _, body in blocks() if body.startswith(FRESH)]
    assert len(fresh) == 2 and len(ORDINARY) >= 7
    test_command = next(c for c in fresh if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()  # CI runs the README's command


@pytest.mark.parametrize("where, body", ORDINARY, ids=[w for w, _ in ORDINARY])
def test_documented_commands_run(torch_venv: Venv, tmp_path: Path, where: str,
                                 body: str) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "serve.py").write_text("import torch\nprint('served')\n")
    env = clean_env(ROCM_AUTOPATCH="force", HOME=str(tmp_path),
                    PATH=f"{torch_venv.path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], capture_output=True,
                          text=True, cwd=str(tmp_path), env=env, timeout=900)
    assert proc.returncode == 0, f"{where}\n{body}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, f"{where}\n{proc.stderr[-3000:]}"


@pytest.mark.heavy(300)
def test_the_readme_demo_runs_as_written_on_a_fresh_copy(tmp_path: Path) -> None:
    (demo,) = [body.strip() for _, body in blocks()
               if body.startswith(FRESH) and "demo.py" in body]
    copy = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=str(ROOT),
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    proc = subprocess.run(["bash", "-e", "-c", demo], capture_output=True, text=True,
                          cwd=str(copy), env=clean_env(), timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "ran as mode='default'" in out  # the unchanged script made safe
    assert "WRONG, and nothing says so" in out  # the miscompile, without the package
    assert "warning(s) name the graph(s)" in out  # check
    assert "correct: the graphs that differ run eagerly" in out  # fallback
    # When the sentinel warns: bisected, the step named, the fix remembered and used.
    assert "Inductor's lowering of node relu (application " in out
    assert "fix remembered: True" in out
    # One bug, its shapes sharing a fingerprint: one repro, one bisection, every shape healed.
    assert "the fallback run wrote 1 repro directory" in out
    healed = re.search(r"correct; (\d+) graphs? compiled with the remembered fix, checked and "
                       r"run compiled\n", out)
    assert healed and int(healed.group(1)) >= 1, out[-1500:]
