"""The report schema and the job view (``doctor --report``), in this process: empty
sections, ranks that are not numbers, failed compiles, only ranks compared, backward time."""

from __future__ import annotations

from typing import Any, Dict

import pytest

from rocm_autopatch import sentinel
from rocm_autopatch.reporting import schema, view

pytestmark = pytest.mark.fast
view.register(sentinel.view_part())  # as the doctor does before reading reports


def _report(pid: int, rank: Any = None, **compile_: Any) -> Dict[str, Any]:
    process = {"pid": pid, "rank": rank, "host": "h"}
    if "forked_from" in compile_:
        process["forked_from"] = compile_.pop("forked_from")
    data = view.normalise({"schema": schema.SCHEMA, "process": process,
                           "compile": {"frames": 1, **compile_}})
    data["_file"] = f"r{pid}.json"
    return data


def test_empty_sections_are_not_a_report() -> None:
    for bad in ({"schema": 1, "process": {}, "compile": {}},
                {"schema": 2, "process": {"pid": 3}, "compile": {}}):
        with pytest.raises(schema.ReportError, match="empty sections"):
            view.normalise(bad)


def test_a_rank_that_is_not_a_number_does_not_break_the_view() -> None:
    reports = [_report(1, "²"), _report(2, "0"), _report(3, "../escape")]
    job = view.job(sorted(reports, key=view._order))
    assert [p["pid"] for p in job["processes"]] == [2, 1, 3] and job["healthy"]


def test_a_failed_compile_is_a_red_flag() -> None:
    failed = [{"where": "f (/a.py:3)", "error": "BackendCompilerFailed: boom", "count": 1}]
    job = view.job([_report(1, "0", failed=failed)])
    assert not job["healthy"] and "failed to compile" in job["red_flags"][0]


def test_only_ranks_of_a_job_are_compared() -> None:
    frame = [{"where": "f (/a.py:3)", "compiles": 1, "seconds": 1.0}]
    more = [{"where": "f (/a.py:3)", "compiles": 3, "seconds": 3.0}]
    parent_and_child = [_report(1, "0", slowest_frames=frame),
                        _report(2, "0", slowest_frames=more, forked_from=1)]
    assert view.diverging(parent_and_child) == []
    assert view.job(parent_and_child)["healthy"]
    no_ranks = [_report(1, None, slowest_frames=frame), _report(2, None, slowest_frames=more)]
    assert view.diverging(no_ranks) == []
    ranks = [_report(1, "0", slowest_frames=frame), _report(2, "1", slowest_frames=more)]
    (found,) = view.diverging(ranks)
    job = view.job(ranks)
    assert found["what"] == "compiles" and not job["healthy"]
    assert any("ranks diverge" in flag for flag in job["red_flags"])


def test_the_slowest_frames_show_backward_time() -> None:
    frame = [{"where": "f (/a.py:3)", "compiles": 1, "seconds": 5.0, "forward_seconds": 1.0,
              "backward_seconds": 4.0}]
    reports = [_report(1, "0", slowest_frames=frame)]
    text = "\n".join(view.render(view.job(reports), reports))
    assert "5.00 s x1" in text and "(backward 4.00 s)" in text



def test_a_graph_judged_wrong_on_one_rank_only_is_a_divergence() -> None:
    """The two-GPU job (issue 35): a miscompile on rank 1 only, DDP's pieces sharing one
    compile id. The view says the ranks disagree, once per graph, with each rank's
    verdicts; ranks that agree (both passed, both wrong) do not diverge."""
    where = "f (/a.py:3)"

    def ranked(pid: int, rank: str, statuses: list) -> Dict[str, Any]:
        data = _report(pid, rank, slowest_frames=[{"where": where, "compiles": 1}])
        data["verify"] = {"mode": "check", "graphs": [
            {"graph": "4/0", "where": where, "status": s} for s in statuses]}
        return data

    one_rank = [ranked(1, "0", ["passed", "passed"]), ranked(2, "1", ["failed", "passed"])]
    (found,) = view.diverging(one_rank)
    assert found["what"] == "verdict" and found["processes"] == ["rank 1"]
    assert found["reason"] == "rank 0: passed, passed; rank 1: failed, passed"
    job = view.job(one_rank)
    assert any(f.startswith(f"ranks diverge: graph 4/0 of {where} computes wrong numbers in "
                            "rank 1 only") for f in job["red_flags"])
    assert "judged wrong in rank 1 only" in "\n".join(view.render(job, one_rank))
    assert view.diverging([ranked(1, "0", ["passed"]), ranked(2, "1", ["passed"])]) == []
    assert view.diverging([ranked(1, "0", ["failed"]), ranked(2, "1", ["failed"])]) == []
