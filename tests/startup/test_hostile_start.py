"""Start-up under hostile conditions, through the installed wheel (issue 23): torch
imported through ``importlib.util.LazyLoader``, a full stderr (``2>/dev/full``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import Venv, clean_env

FORCE = {"ROCM_AUTOPATCH": "force"}


if sys.platform != "linux":  # /dev/full, fork and /proc are Linux's
    pytestmark = pytest.mark.skip("Linux only")


def test_torch_imported_through_a_lazy_loader_is_guarded(torch_venv: Venv) -> None:
    """importlib.util.LazyLoader runs torch's body at its first attribute access: the hooks
    saw a module that looked imported and had neither torch.version nor torch.compile."""
    code = """
import importlib.util, json, sys
spec = importlib.util.find_spec("torch")
spec.loader = importlib.util.LazyLoader(spec.loader)
torch = importlib.util.module_from_spec(spec)
sys.modules["torch"] = torch
spec.loader.exec_module(torch)
f = torch.compile(lambda x: x + 1, mode="reduce-overhead")
ok = bool((f(torch.ones(2)) == 2).all())
import rocm_autopatch
r = rocm_autopatch.report()
print(json.dumps({"active": r.active, "ok": ok,
                  "guarded": hasattr(torch.compile, "__rocm_autopatch__"),
                  "rewrites": [w.after for w in r.compile_rewrites]}))
"""
    out = torch_venv.json(code, env=FORCE)
    assert out == {"active": True, "ok": True, "guarded": True,
                   "rewrites": [{"mode": "default"}]}


def test_a_full_stderr_changes_no_exit_status(torch_venv: Venv) -> None:
    """``2>/dev/full`` with a warning due: the text stayed in stderr's buffer and the final
    flush at exit failed (exit 120). PYTHONUNBUFFERED, which the tests set, hid it."""
    env = {k: v for k, v in clean_env(**FORCE, ROCM_AUTOPATCH_PROFILE="junk").items()
           if k != "PYTHONUNBUFFERED"}
    for code in ("import torch, torch._inductor.config",
                 "import torch; torch.compile(lambda x: x, mode='max-autotune')"):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([torch_venv.python, "-c", code], stderr=full,
                                  env=env, timeout=300, cwd=str(torch_venv.path))
        assert proc.returncode == 0, code

