"""The compile report (ROCM_AUTOPATCH_REPORT): real compiles on the CPU, in subprocesses of
the installed wheel, held to torch's own log of the same run (``TORCH_LOGS=graph_breaks,
recompiles``, whose lines carry each process's id), and the doctor's job view of the files
they write."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from conftest import ROOT, Venv, clean_env, doctor

# A deliberate graph break and a recompile, and the other programs named in its docstring.
SCRIPT = (ROOT / "scripts" / "compile_report_repro.py").read_text()
BREAK_LINE = SCRIPT.splitlines().index("    torch._dynamo.graph_break()") + 1
LOGS = "graph_breaks,recompiles"
# torch's log line: "V1123 11:38:55.413000 12846 torch/_dynamo/guards.py:5396] [0/1]
# [__recompiles] Recompiling function f in /path/job.py:15"
LOG_LINE = re.compile(r"^[A-Z]\d{4} \S+ (\d+) \S+\] \[[^\]]*\] \[__(graph_breaks|recompiles)\] "
                      r"(.*)$", re.MULTILINE)


def run(venv: Venv, tmp_path: Path, env: Dict[str, str], *args: str,
        **popen: object) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    return subprocess.run([venv.python, str(script), *args], capture_output=True, text=True,
                          env=clean_env(ROCM_AUTOPATCH="force", **env),
                          cwd=str(popen.pop("cwd", tmp_path)), timeout=600, **popen)


def files(directory: Path) -> List[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".json")


@pytest.fixture(scope="module")
def armed(torch_venv: Venv, tmp_path_factory: pytest.TempPathFactory
          ) -> Tuple[Path, subprocess.CompletedProcess]:
    """The script as it is, with ROCM_AUTOPATCH_REPORT naming r.json in a folder of its own:
    (the folder, the process), run once for the tests that read a plain armed run."""
    folder = tmp_path_factory.mktemp("armed")
    proc = run(torch_venv, folder, {"ROCM_AUTOPATCH_REPORT": str(folder / "r.json")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return folder, proc


def torch_log(stderr: str) -> Dict[int, Dict[str, Counter]]:
    """Per process id: graph breaks by file:line and recompiles by "name (file:line)", as
    torch logged them."""
    found: Dict[int, Dict[str, Counter]] = defaultdict(
        lambda: {"breaks": Counter(), "recompiles": Counter()})
    for pid, kind, text in LOG_LINE.findall(stderr):
        # torch prefixes every line of a record: its first line names the event.
        if kind == "graph_breaks" and text.startswith("Graph break"):
            where = re.search(r"in user code at (.+):(\d+)$", text)
            found[int(pid)]["breaks"][f"{where[1]}:{where[2]}"] += 1
        elif text.startswith("Recompiling function "):
            name, file, line = re.match(r"Recompiling function (\S+) in (.+):(\d+)$",
                                        text).groups()
            found[int(pid)]["recompiles"][f"{name} ({file}:{line})"] += 1
    return found


def ours(report: dict) -> Dict[str, Counter]:
    c = report["compile"]
    return {"breaks": Counter({b["where"]: b["count"] for b in c["graph_breaks"]["top"]}),
            "recompiles": Counter({r["where"]: 0 for r in c["recompiles"]["top"]})
            + Counter(_recompiles(c))}


def _recompiles(c: dict) -> Counter:
    out: Counter = Counter()
    for r in c["recompiles"]["top"]:
        out[r["where"]] += r["count"]
    return out


def agree(report: dict, logged: Dict[str, Counter]) -> None:
    mine = ours(report)
    c = report["compile"]
    assert mine["breaks"] == logged["breaks"], (mine["breaks"], logged["breaks"])
    assert mine["recompiles"] == logged["recompiles"], (mine["recompiles"],
                                                        logged["recompiles"])
    assert c["graph_breaks"]["total"] == sum(logged["breaks"].values())
    assert c["recompiles"]["total"] == sum(logged["recompiles"].values())


@pytest.mark.parametrize("mode", ["", "kinds", "limit"])
def test_counts_and_lines_agree_with_torchs_own_log(torch_venv: Venv, tmp_path: Path,
                                                    mode: str) -> None:
    out = tmp_path / "reports"
    proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": f"{out}/r-{{pid}}.json",
                                      "TORCH_LOGS": LOGS}, *([mode] if mode else []))
    assert proc.returncode == 0, proc.stderr[-3000:]
    pid = json.loads(proc.stdout.splitlines()[-1])["pid"]
    (path,) = files(out)
    report = json.loads(path.read_text())
    logged = torch_log(proc.stderr)
    assert set(logged) == {pid}
    agree(report, logged[pid])
    c = report["compile"]
    if mode == "":
        (gb,) = c["graph_breaks"]["top"]
        assert gb["where"] == f"{tmp_path / 'job.py'}:{BREAK_LINE}" and gb["count"] == 2
        assert gb["reason"] == "Call to `torch._dynamo.graph_break()`"
        assert gb["hints"] and gb["explanation"]
        assert c["frames"] == 4 and c["graphs"] == 4
        reasons = {r["where"].split(" (")[0]: r["reason"] for r in c["recompiles"]["top"]}
        assert "dtype mismatch" in reasons["f"] and "expected Float, actual Double" in reasons["f"]
    if mode == "kinds":
        reasons = {b["reason"] for b in c["graph_breaks"]["top"]}
        assert "Data-dependent branching" in reasons  # counters["graph_break"] misses it
        assert "Call to `torch._dynamo.graph_break()`" in reasons
        lines = SCRIPT.splitlines()

        def line_of(text: str, after: int = 0) -> str:
            number = next(i for i, ln in enumerate(lines, 1) if text in ln) + after
            return f"{tmp_path / 'job.py'}:{number}"

        by_line = {b["where"]: b for b in c["graph_breaks"]["top"]}
        # The exact line of each: the branch, print, the two untraceable calls, and the
        # graph_break() inside the nested function (the line after "def inner").
        assert set(by_line) == {line_of("if x.sum() > 0:"), line_of('print("tracing"'),
                                line_of("t = time.time()"), line_of("zlib.crc32("),
                                line_of("    def inner(x):", after=1)}
        # Told apart by torch's explanation, which names the function (its wording differs
        # per release: 2.13 "trace the builtin `time.time.`", 2.15 "graph breaks on
        # `time.time()`").
        clock = by_line[line_of("t = time.time()")]["explanation"]
        crc = by_line[line_of("zlib.crc32(")]["explanation"]
        assert "time.time" in clock and "zlib.crc32" in crc and clock != crc
        assert "print" in by_line[line_of('print("tracing"')]["explanation"]
        assert c["recompiles"]["total"] == 5  # dtype (2 frames), shape, int argument, global
        why = " ".join(r["reason"] for r in c["recompiles"]["top"])
        assert "dtype mismatch" in why and "size mismatch" in why and "FACTOR" in why
    if mode == "limit":  # and the doctor's view of it flags it red
        (hit,) = c["recompile_limit_hit"]
        assert hit["where"].startswith("<lambda> (")
        view = doctor(torch_venv, "--report", str(path))
        assert view.returncode == 1
        assert "hit the recompile limit" in view.stdout and "<lambda>" in view.stdout
    assert c["recompile_limit_hit"] == [] or mode == "limit"
    assert c["failed"] == [] and c["unknown"] == {}


def test_a_training_step_counts_the_backward_compile(torch_venv: Venv, tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    # A fresh cache: from a warm one torch loads the backward instead of compiling it.
    proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": str(path),
                                      "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")},
               "train")
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch_says = json.loads(proc.stdout.splitlines()[-1])["torch_backward_compiles"]
    c = json.loads(path.read_text())["compile"]
    assert c["backward"]["compiles"] == torch_says == 1
    assert c["backward"]["seconds"] > 0
    assert c["seconds"] == pytest.approx(c["forward_seconds"] + c["backward"]["seconds"],
                                         abs=0.002)
    (frame,) = c["backward"]["frames"]
    assert frame["where"] == c["slowest_frames"][0]["where"]  # the forward's frame
    assert "external_utils" not in frame["where"]  # the user's call site, not torch's inner


@pytest.mark.parametrize("mode", ["fork", "mp", "forkserver", "fork_late"])
def test_every_child_writes_its_own_report_of_its_own_work(torch_venv: Venv, tmp_path: Path,
                                                           mode: str) -> None:
    out = tmp_path / mode
    proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": f"{out}/r.json",
                                      "TORCH_LOGS": LOGS}, mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(p.read_text()) for p in files(out)]
    pids = [r["process"]["pid"] for r in reports]
    # forkserver: the parent compiles nothing, so only the child writes.
    assert len(reports) == (1 if mode == "forkserver" else 2), [p.name for p in files(out)]
    assert len(set(pids)) == len(pids)
    logged = torch_log(proc.stderr)
    for report in reports:
        c = report["compile"]
        # Each process's counts are its own: torch's log lines of that pid, and its graphs.
        agree(report, logged[report["process"]["pid"]])
        assert c["frames"] >= 1 and c["graphs"] == c["frames"]
    names = [p.name for p in files(out)]
    assert any(re.fullmatch(r"r\.\d+\.json", n) for n in names)


def test_a_process_that_compiles_nothing_writes_no_report(torch_venv: Venv,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": str(path),
                                      "ROCM_AUTOPATCH_LOG": "info"}, "nothing")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["armed"] is True
    assert not path.exists() and "compile: " not in proc.stderr


def test_unset_means_no_file_no_exit_handler_nothing_loaded(
        torch_venv: Venv, tmp_path: Path, armed: Tuple[Path, subprocess.CompletedProcess]
        ) -> None:
    unset = run(torch_venv, tmp_path, {})
    folder, asked = armed
    a, b = (json.loads(p.stdout.splitlines()[-1]) for p in (unset, asked))
    assert (a["armed"], a["loaded"], b["armed"], b["loaded"]) == (False, False, True, True)
    assert b["atexit"] == a["atexit"] + 1  # exactly our one handler, only when asked
    assert files(tmp_path) == [] and [p.name for p in files(folder)] == ["r.json"]


def test_two_ranks_and_the_doctors_job_view(torch_venv: Venv, tmp_path: Path) -> None:
    out = tmp_path / "job"
    for rank in ("0", "1"):
        proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": f"{out}/rank{{rank}}.json",
                                          "RANK": rank, "ROCM_AUTOPATCH_LOG": "info",
                                          **({"EXTRA": "1"} if rank == "1" else {})})
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
    assert text.returncode == 1, text.stderr  # ranks that diverge are a red flag
    lines = text.stdout.splitlines()
    assert lines[0] == "rocm-autopatch compile report: 2 processes"
    assert any(line.startswith("  rank 0 ") for line in lines)
    at = lines.index("Graph breaks (most processes first; as torch logs them)") + 1
    assert lines[at].startswith("  x")
    assert "Call to `torch._dynamo.graph_break()`" in lines[at]
    assert lines[at + 1] == f"      at {tmp_path / 'job.py'}:{BREAK_LINE}"
    # rank 1 recompiled f for float16 alone: the view names the frame and the guard.
    at = lines.index("Where ranks diverge (a rank that recompiles alone can hang collectives)")
    diverging = "\n".join(lines[at:])
    assert "recompiled in rank 1 only (not rank 0):" in diverging
    assert "expected Float, actual Half" in diverging or "actual Half" in diverging
    assert lines[-1] != "healthy" and any(ln.startswith("! ranks diverge: ") for ln in lines)
    # Lines naming a file are printed whole (copyable); the rest fits 80 columns.
    assert max(len(line) for line in lines if str(tmp_path) not in line) <= 80
    view = json.loads(doctor(torch_venv, "--report", *paths, "--json").stdout)
    assert [p["rank"] for p in view["processes"]] == ["0", "1"]
    assert view["graph_breaks"][0]["processes"] == ["rank 0", "rank 1"]
    assert any(d["processes"] == ["rank 1"] for d in view["diverging"])
    assert view["healthy"] is False and all("ranks diverge" in f for f in view["red_flags"])


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


@pytest.mark.parametrize("kind", ["device", "symlink", "fifo", "directory"])
def test_what_is_not_a_regular_file_is_never_replaced(torch_venv: Venv, tmp_path: Path,
                                                      kind: str) -> None:
    target = tmp_path / "target"
    if kind == "device":
        target = Path("/dev/null")
    elif kind == "symlink":
        (tmp_path / "elsewhere").write_text("kept")
        target.symlink_to(tmp_path / "elsewhere")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    before = os.lstat(target)
    proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": str(target)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), kind
    (warning,) = [ln for ln in proc.stderr.splitlines() if "ROCM_AUTOPATCH_REPORT=" in ln]
    assert "only a regular file or a new path is written" in warning
    assert not list(tmp_path.glob(".rap-*")) and not list(target.parent.glob(".rap-*"))
    if kind == "symlink":
        assert (tmp_path / "elsewhere").read_text() == "kept"


def test_a_long_name_is_written_and_a_failed_write_leaves_nothing(torch_venv: Venv,
                                                                  tmp_path: Path) -> None:
    long_name = tmp_path / ("r" * 245 + ".json")  # 250 characters: legal, at the limit
    proc = run(torch_venv, tmp_path, {"ROCM_AUTOPATCH_REPORT": str(long_name)})
    assert proc.returncode == 0 and long_name.exists(), proc.stderr[-2000:]
    full = tmp_path / "full"
    full.mkdir()

    def small_disk() -> None:  # writes past 4 kB fail as on a full disk (EFBIG)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    # The eager backend writes no file of its own: only the report meets the limit.
    code = "import torch; torch.compile(lambda x: x + 1, backend='eager')(torch.ones(2))"
    proc = subprocess.run([torch_venv.python, "-c", code], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=300, preexec_fn=small_disk,
                          env=clean_env(ROCM_AUTOPATCH="force",
                                        ROCM_AUTOPATCH_REPORT=str(full / "r.json")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(full.iterdir()) == []  # no partial report, no temporary file
    said = [ln for ln in proc.stderr.splitlines() if "cannot write the compile report" in ln]
    assert len(said) == 1 and "File too large" in said[0]


def test_a_relative_path_is_resolved_when_the_package_activates(torch_venv: Venv,
                                                                tmp_path: Path) -> None:
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    code = ("import os, sys, torch; os.chdir(sys.argv[1]); "  # Hydra changes directory
            "torch.compile(lambda x: x + 1)(torch.ones(2))")
    proc = subprocess.run([torch_venv.python, "-c", code, str(elsewhere)], capture_output=True,
                          text=True, cwd=str(start), timeout=300,
                          env=clean_env(ROCM_AUTOPATCH="force",
                                        ROCM_AUTOPATCH_REPORT="reports/r.json"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (start / "reports" / "r.json").exists() and not (elsewhere / "reports").exists()


def test_the_job_view_shows_what_is_readable_and_names_what_is_not(
        torch_venv: Venv, tmp_path: Path, armed: Tuple[Path, subprocess.CompletedProcess]
        ) -> None:
    good = armed[0] / "r.json"
    bad = {
        "empty.json": '{"schema": 2, "process": {}, "compile": {}}',
        "other.json": '{"schema": 99, "process": {}, "compile": {}}',
        "nested.json": "[" * 100000 + "]" * 100000,
        "text.json": "not json",
        "typed.json": '{"schema": 2, "process": {"pid": 1}, "compile": {"graph_breaks": 3}}',
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    paths = [str(good)] + [str(tmp_path / n) for n in bad]
    view = doctor(torch_venv, "--report", *paths)
    assert view.returncode == 0, view.stdout + view.stderr  # healthy, some files unreadable
    assert "Traceback" not in view.stdout + view.stderr
    assert "compile report: 1 process" in view.stdout  # the armed run's only
    for name in bad:  # empty sections are not a process (docs/report.md)
        assert name in view.stderr and name in view.stdout, name
    assert "schema 99" in view.stdout and "empty sections" in view.stderr  # stdout wraps
    data = json.loads(doctor(torch_venv, "--report", *paths, "--json").stdout)
    assert len(data["unreadable"]) == 5 and len(data["processes"]) == 1
    none = doctor(torch_venv, "--report", *[str(tmp_path / n) for n in bad])
    assert none.returncode == 2 and "no readable compile report" in none.stderr


def test_a_torchrun_job_writes_one_report_per_rank_and_none_for_the_launcher(
        torch_venv: Venv, tmp_path: Path) -> None:
    """torchrun's own process imports torch and compiles nothing: no third report, and the
    exit line never says "None"."""
    (tmp_path / "train.py").write_text(
        "import torch\ntorch.compile(lambda x: x.sin() + 1)(torch.ones(4))\n")
    out = tmp_path / "reports"
    proc = torch_venv.torchrun("--nproc-per-node", "2", "train.py", cwd=str(tmp_path),
                               timeout=600, env={"ROCM_AUTOPATCH": "force",
                                                 "ROCM_AUTOPATCH_LOG": "info",
                                                 "ROCM_AUTOPATCH_REPORT": f"{out}/{{rank}}.json"})
    assert proc is not None, "the 2-rank job ran past 600 s"
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in files(out)] == ["0.json", "1.json"]
    lines = [ln for ln in proc.stderr.splitlines() if "compile: " in ln]
    assert len(lines) == 1 and "None" not in lines[0]  # rank 0 only
    assert lines[0].startswith("rocm-autopatch: INFO: compile: 1 graphs, 0 graph breaks")


@pytest.mark.fast
def test_torch_2_4s_wording_gives_the_reason_torch_raised() -> None:
    # torch < 2.5 logs "Graph break: from user code at:" and the user stack, with the reason
    # only in the record's exc_info (torch/_dynamo/symbolic_convert.py, 2.4.1, line 534).
    # The reason was the stack's first line until compat.sh showed it on 2.4.1; that run now
    # gives torch's reasons (TESTING.md). Record as 2.4.1 logged it for a print():

    from rocm_autopatch.reporting import breaks

    class Unsupported(RuntimeError):  # torch._dynamo.exc.Unsupported's name and text
        pass

    message = ('Graph break: from user code at:\n'
               '  File "/job/p.py", line 3, in outer\n    return inner(x)\n'
               '  File "/job/p.py", line 7, in inner\n    print("tracing")\n')
    error = Unsupported("builtin: print [<class 'ConstantVariable'>] True")
    found = breaks.parse_break(message, error)
    assert (found["file"], found["line"]) == ("/job/p.py", 7)
    assert found["reason"] == "Unsupported: builtin: print [<class 'ConstantVariable'>] True"
    # torch >= 2.5 states the reason in the message itself; the exception adds nothing.
    newer = ("Graph break in user code at /job/p.py:7\nGraph Break Reason: Unsupported: "
             "builtin: print\nUser code traceback:\n  File \"/job/p.py\", line 7, in inner\n")
    assert breaks.parse_break(newer, error)["reason"] == "Unsupported: builtin: print"
