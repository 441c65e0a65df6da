"""The compile report (ROCM_AUTOPATCH_REPORT): real compiles on the CPU, in subprocesses of
the installed wheel, and the doctor's job view of the files they write."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Dict, List

from conftest import ROOT, Venv, clean_env

# A deliberate graph break and a recompile; its modes are in its docstring.
SCRIPT = (ROOT / "scripts" / "compile_report_repro.py").read_text()
F_LINE = SCRIPT.splitlines().index("def f(x):") + 1  # where torch names the frame


def run(venv: Venv, tmp_path: Path, env: Dict[str, str], *args: str
        ) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    return subprocess.run([venv.python, str(script), *args], capture_output=True, text=True,
                          env=clean_env(ROCM_AUTOPATCH="force", **env), cwd=str(tmp_path),
                          timeout=600)


def doctor(venv: Venv, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv.path / "bin" / "rocm-autopatch"), "doctor", *args],
                          capture_output=True, text=True, env=clean_env(), timeout=300)


def files(directory: Path) -> List[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".json")


def test_report_of_a_graph_break_and_a_recompile(torch_venv: Venv, tmp_path: Path) -> None:
    out = tmp_path / "reports"
    proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": f"{out}/r-{{pid}}.json",
                                      "ROCM_AUTOPATCH_COMPILE_WATCHDOG": "0.001"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    pid = json.loads(proc.stdout.splitlines()[-1])["pid"]
    (path,) = files(out)
    assert path.name == f"r-{pid}.json"
    data = json.loads(path.read_text())
    # Everything report() has ...
    assert data["active"] and data["profile"] == "safe" and data["config"]
    assert data["activation"]["via"] == ".pth" and data["process"]["pid"] == pid
    c = data["compile"]
    # ... and what torch.compile did: f compiled twice (float32, then float64), each time
    # broken in two by the graph break (f and its resume function): 4 frames, 4 graphs.
    assert c["frames"] == 4 and c["graphs"] == 4
    assert c["graph_breaks"]["total"] == 2
    (gb,) = c["graph_breaks"]["top"]
    assert "graph_break()" in gb["reason"] and gb["count"] == 2
    assert gb["where"] == f"f ({tmp_path / 'job.py'}:{F_LINE})"
    assert c["recompiles"]["total"] == 2  # f and its resume function, for float64
    reasons = {r["where"].split(" (")[0]: r["reason"] for r in c["recompiles"]["top"]}
    assert "dtype mismatch" in reasons["f"] and "expected Float, actual Double" in reasons["f"]
    assert c["recompile_limit_hit"] == [] and c["failed"] == []
    assert c["seconds"] > 0 and c["slowest_frames"][0]["seconds"] <= c["seconds"]
    assert sum(f["compiles"] for f in c["slowest_frames"]) == 4
    assert c["cache"]["fxgraph_miss"] + c["cache"]["fxgraph_hit"] >= 1
    assert c["eager_in_capture"] == {"total": 0, "frames": {}}
    assert c["watchdog_warnings"] and c["watchdog_warnings"][0]["where"].startswith("f (")


def test_unset_means_no_file_no_exit_handler_nothing_loaded(torch_venv: Venv,
                                                            tmp_path: Path) -> None:
    unset = run(torch_venv, tmp_path, {})
    armed = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": str(tmp_path / "r.json")})
    a, b = (json.loads(p.stdout.splitlines()[-1]) for p in (unset, armed))
    assert (a["armed"], a["loaded"], b["armed"], b["loaded"]) == (False, False, True, True)
    assert b["atexit"] == a["atexit"] + 1  # exactly our one handler, only when asked
    assert [p.name for p in files(tmp_path)] == ["r.json"]


def test_two_ranks_and_the_doctors_job_view(torch_venv: Venv, tmp_path: Path) -> None:
    out = tmp_path / "job"
    for rank in ("0", "1"):
        proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": f"{out}/rank{{rank}}.json",
                                          "RANK": rank, "ROCM_AUTOPATCH_LOG": "info"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = [line for line in proc.stderr.splitlines() if "compile: " in line]
        if rank == "0":  # one line at exit, rank 0 only
            assert summary == [f"rocm-autopatch: INFO: compile: 4 graphs, 2 graph breaks, "
                               f"2 recompiles, {summary[0].split('recompiles, ')[1]}"]
            assert f"report: {out}/rank0.json" in summary[0]
        else:
            assert summary == []
    paths = [str(p) for p in files(out)]
    assert [Path(p).name for p in paths] == ["rank0.json", "rank1.json"]
    text = doctor(torch_venv, "--report", *paths)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "rocm-autopatch compile report: 2 processes"
    assert any(line.startswith("  rank 0 ") for line in lines)
    assert any(line.startswith("  rank 1 ") for line in lines)
    at = lines.index("Graph breaks (most processes first)") + 1
    assert lines[at].startswith("  x4 in 2 of 2: Call to `torch._dynamo.graph_break()`")
    assert lines[at + 1].startswith("      at f (")
    assert lines[-1] == "healthy"
    # Lines naming a file are printed whole (copyable); the rest fits 80 columns.
    assert max(len(line) for line in lines if str(tmp_path) not in line) <= 80
    view = json.loads(doctor(torch_venv, "--report", *paths, "--json").stdout)
    assert [p["rank"] for p in view["processes"]] == ["0", "1"]
    assert view["graph_breaks"][0]["processes"] == ["rank 0", "rank 1"]
    assert view["healthy"] is True and view["red_flags"] == []


def test_recompile_limit_hit_is_a_red_flag(torch_venv: Venv, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": str(path)}, "limit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    hits = json.loads(path.read_text())["compile"]["recompile_limit_hit"]
    assert len(hits) == 1 and hits[0]["where"].startswith("<lambda> (")
    view = doctor(torch_venv, "--report", str(path))
    assert view.returncode == 1
    assert "hit the recompile limit" in view.stdout and "<lambda>" in view.stdout


def test_forked_children_write_their_own_files(torch_venv: Venv, tmp_path: Path) -> None:
    for mode in ("fork", "mp"):
        out = tmp_path / mode
        proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": f"{out}/r.json"}, mode)
        assert proc.returncode == 0, proc.stderr[-3000:]
        parent = json.loads(proc.stdout.splitlines()[-1])["pid"]
        names = [p.name for p in files(out)]
        assert len(names) == 2 and "r.json" in names, names
        (child,) = [out / n for n in names if n != "r.json"]
        data = json.loads(child.read_text())
        assert child.name == f"r.{data['process']['pid']}.json"
        assert data["process"]["pid"] != parent
        # The child reports its own work: the float16 recompile, not the parent's compiles.
        assert data["compile"]["recompiles"]["total"] >= 1
        assert data["compile"]["frames"] == 2
        assert json.loads((out / "r.json").read_text())["process"]["pid"] == parent


def test_unwritable_path_warns_once_and_keeps_the_exit_status(torch_venv: Venv,
                                                              tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the report's directory would be
    proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": f"{blocker}/r.json",
                                      "EXIT": "3"})
    assert proc.returncode == 3
    assert json.loads(proc.stdout.splitlines()[-1])["armed"] is True
    warnings = [line for line in proc.stderr.splitlines() if "ROCM_AUTOPATCH_REPORT=" in line]
    assert len(warnings) == 1 and "cannot write the compile report" in warnings[0]
    assert "Traceback" not in proc.stderr


def test_doctor_refuses_a_file_that_is_not_a_report(torch_venv: Venv, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = doctor(torch_venv, "--report", str(bad), str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "not a compile report" in proc.stderr
