"""Doctor text at 80 columns: a path or a key phrase is never split, whatever its length
(where a line wrapped once depended on the temporary directory's depth)."""

from __future__ import annotations

import pytest

from rocm_autopatch.reporting import view
from rocm_autopatch.text import Verbatim, fit, keep

pytestmark = pytest.mark.fast  # in this process: pytest -m fast


def _report(where: str) -> dict:
    return view.normalise({"schema": 2, "process": {"pid": 7, "rank": "0"},
                           "compile": {"recompile_limit_hit": [{"where": where, "count": 2}]}})


def test_red_flag_keeps_its_phrase_and_path_whole_at_every_depth() -> None:
    for depth in range(1, 121):
        where = f"<lambda> (/{'d' * depth}/job.py:30)"
        reports = [_report(where)]
        (flag,) = view.red_flags(reports, mark=keep)
        text = fit(f"! {flag}")
        lines = text.splitlines()
        assert any("hit the recompile limit" in line for line in lines), (depth, text)
        assert any(where in line for line in lines), (depth, text)
        # Only a line holding the unbreakable path may pass 80 columns.
        assert all(len(line) <= 80 or where in line for line in lines), (depth, text)
        # What --json carries is plain text: no no-break spaces.
        (plain,) = view.red_flags(reports)
        assert "\u00a0" not in plain and "hit the recompile limit" in plain


def test_fit_wraps_at_spaces_and_prints_verbatim_lines_as_they_are() -> None:
    long = "word " * 30
    assert all(len(line) <= 80 for line in fit(long).splitlines())
    path = "/" + "p" * 100
    assert fit(Verbatim("  " + path)) == "  " + path
    assert fit(f"  see {keep('a kept phrase')} " + "x " * 40).count("a kept phrase") == 1
