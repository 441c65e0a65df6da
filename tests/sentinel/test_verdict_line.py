"""The sentinel's verdict line at exit, through the installed wheel: said when it is on,
at the levels that show it."""

from __future__ import annotations

import pytest
from conftest import Venv

FORCE = {"ROCM_AUTOPATCH": "force"}


def ours(stderr: str) -> list:
    return [ln for ln in stderr.splitlines() if ln.startswith("rocm-autopatch")]


CHECKED = "import torch\nf = torch.compile(lambda x: torch.relu(x) * 2)\nf(torch.randn(8))\n"


# "yes" and the other words of check are read in test_settings (a process here each: 42).
@pytest.mark.parametrize("value, log, said", [("check", "", True), ("fallback", "info", True),
                                              ("check", "off", False)])
def test_the_sentinel_says_what_it_checked_at_exit(torch_venv: Venv, value: str, log: str,
                                                   said: bool) -> None:
    proc = torch_venv.run(CHECKED, env={**FORCE, "ROCM_AUTOPATCH_VERIFY": value,
                                        "ROCM_AUTOPATCH_LOG": log})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in ours(proc.stderr) if "ROCM_AUTOPATCH_VERIFY=" in ln]
    mode = "fallback" if value == "fallback" else "check"
    assert lines == ([f"rocm-autopatch: ROCM_AUTOPATCH_VERIFY={mode}: 1 graph compiled: "
                      "1 passed, 0 wrong, 0 not compared"] if said else [])
    assert proc.stdout == ""

