"""Shared test fixtures: the real wheel, installed in a real virtual environment.

The venv with torch 2.13 is made once and cached under ``.cache/`` (or
``ROCM_AUTOPATCH_TEST_VENV``); each test session builds the wheel from this checkout and
reinstalls it there, so every subprocess test runs the real .pth from site-packages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCH_PIN = "torch==2.13.0"
# Variables that would change what rocm-autopatch or torch do; tests set them explicitly.
SCRUB = ("ROCM_AUTOPATCH", "TORCHINDUCTOR_", "INDUCTOR_", "PYTHONPATH", "TORCH_COMPILE",
         "RANK", "LOCAL_RANK", "PYTHONSTARTUP")


def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUB)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class Venv:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = str(path / "bin" / "python")
        out = subprocess.run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True)
        self.site = Path(out.stdout.strip())

    def run(self, code: str, *args: str, env: Optional[Dict[str, str]] = None,
            flags: List[str] = (), timeout: int = 600, cwd: Optional[str] = None
            ) -> subprocess.CompletedProcess:
        # Not from the checkout: `-c` puts the working directory first on sys.path, and the
        # source tree's package would shadow the installed wheel.
        return subprocess.run([self.python, *flags, "-c", code, *args], capture_output=True,
                              text=True, env=clean_env(**(env or {})), timeout=timeout,
                              cwd=cwd or str(self.path))

    def json(self, code: str, **kwargs) -> dict:
        """Run ``code``; its last stdout line is JSON. Fails with stderr on a crash."""
        proc = self.run(code, **kwargs)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])


def pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *args], check=True, env=clean_env())


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(ROOT)], check=True,
                   env=clean_env())
    (found,) = out.glob("rocm_autopatch-*.whl")
    return found


def make_venv(path: Path, packages: List[str]) -> None:
    marker = path / ".ready"
    wanted = " ".join(packages)
    if marker.exists() and marker.read_text() == wanted:
        return
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    if packages:
        pip(str(path / "bin" / "python"), *packages)
    marker.write_text(wanted)


@pytest.fixture(scope="session")
def torch_venv(wheel: Path) -> Iterator[Venv]:
    """A venv with torch 2.13 (cached across sessions) and this checkout's wheel."""
    path = Path(os.environ.get("ROCM_AUTOPATCH_TEST_VENV", ROOT / ".cache" / "venv-torch"))
    make_venv(path, [TORCH_PIN, "numpy", "transformers"])
    pip(str(path / "bin" / "python"), "--force-reinstall", "--no-deps", str(wheel))
    yield Venv(path)
