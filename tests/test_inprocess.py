"""Fast tests, in this process: the settings table, the patching idiom on the real
``torch.compile``, frames, the report schema and the job view. ``pytest -m fast`` runs these
and the other in-process tests (a contributor's inner loop); CI runs everything.

Nothing here installs a wheel or starts an interpreter. What is patched is put back by
``patching.unwrap_all`` (the idiom's undo), checked by the tests themselves.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from rocm_autopatch import cli, frames, patching, report_schema, report_view, selftest, settings

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parent.parent


# ---- settings ------------------------------------------------------------------------------

def test_readme_variables_table_is_the_settings_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert settings.markdown() in readme, "README's table differs from settings.markdown()"
    documented = set(re.findall(r"^\| `(ROCM_AUTOPATCH\w*)`", readme, re.MULTILINE))
    assert documented == {v.name for v in settings.OURS}


@pytest.mark.parametrize("var", settings.VARIABLES, ids=lambda v: v.name)
def test_every_variable_unset_gives_its_default_and_no_warning(var: settings.Variable) -> None:
    assert settings.read(var.name, {}) == settings.Reading(var.default, None, "")
    assert settings.read(var.name, {var.name: "  "}).problem == ""


@pytest.mark.parametrize("name, raw", [
    (settings.VERIFY, "maybe"), (settings.VERIFY_CALLS, "-2"), (settings.VERIFY_CALLS, "1.5"),
    (settings.PROFILE, "fast"), (settings.LOG, "loud"), (settings.WATCHDOG, "nan"),
    (settings.WATCHDOG, "inf"), (settings.ALLOW_GRAPHS, "2"), (settings.MODE, "banana"),
    (settings.RANK, "²"), (settings.RANK, "../escape"), (settings.RANK, "a/b"),
    (settings.RANK, "7" * 300), (settings.LOCAL_RANK, "-1"),
])
def test_a_bad_value_warns_with_the_name_and_what_is_accepted(name: str, raw: str) -> None:
    found = settings.read(name, {name: raw})
    var = settings.BY_NAME[name]
    assert found.value == var.default
    assert found.problem.startswith(f"{name}={raw!r} is not understood; accepted: ")
    assert var.accepted.replace("`", "") in found.problem


@pytest.mark.parametrize("raw, mode", [("1", "check"), ("yes", "check"), ("TRUE", "check"),
                                       ("on", "check"), ("check", "check"),
                                       ("fallback", "fallback"), ("0", "off"), ("no", "off")])
def test_verify_accepts_the_documented_words(raw: str, mode: str) -> None:
    assert settings.read(settings.VERIFY, {settings.VERIFY: raw}) == (mode, raw, "")
    assert raw.lower() in settings.BY_NAME[settings.VERIFY].accepted or raw.lower() in (
        "0", "no")


def test_torch_autoload_follows_torchs_own_rule() -> None:
    # torch/__init__.py: os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"
    assert settings.torch_autoload({}) and settings.torch_autoload({settings.TORCH_AUTOLOAD: "1"})
    assert not settings.torch_autoload({settings.TORCH_AUTOLOAD: ""})
    assert not settings.torch_autoload({settings.TORCH_AUTOLOAD: " 1"})


# ---- patching: the real torch.compile ------------------------------------------------------

def test_the_guard_wraps_torch_compile_once_and_unwraps_it() -> None:
    torch = pytest.importorskip("torch")
    from rocm_autopatch import compile_guard

    before = torch.compile
    assert not patching.ours(before)  # a CPU build: the package applied nothing here
    compile_guard.install(torch)
    try:
        guarded = torch.compile
        assert patching.ours(guarded) and patching.original_of(guarded) is before
        assert guarded.__module__ == before.__module__ and guarded.__name__ == "compile"
        compile_guard.install(torch)  # idempotent
        assert torch.compile is guarded
        seen: Dict[str, Any] = {}
        real = torch._TorchCompileInductorWrapper.__init__

        def spy(self: Any, mode: Any, options: Any, *rest: Any) -> None:
            seen.update(mode=mode, options=options)
            real(self, mode, options, *rest)

        torch._TorchCompileInductorWrapper.__init__ = spy
        try:
            f = torch.compile(lambda x: x * 2, mode="reduce-overhead")
        finally:
            torch._TorchCompileInductorWrapper.__init__ = real
        assert seen == {"mode": "default", "options": None}
        assert torch.equal(f(torch.ones(3)), torch.full((3,), 2.0))
    finally:
        assert patching.unwrap_all() == 1
    assert torch.compile is before


def test_unwrap_leaves_a_later_wrapper_of_someone_else_in_place() -> None:
    class Owner:
        @staticmethod
        def f() -> str:
            return "original"

    patching.wrap(Owner, "f", lambda original: lambda: "ours:" + original())
    assert Owner.f() == "ours:original"

    def theirs() -> str:
        return "theirs"

    Owner.f = theirs  # someone wrapped after us: ours is not put back over theirs
    assert patching.unwrap(Owner, "f") is False and Owner.f is theirs


# ---- frames --------------------------------------------------------------------------------

def test_user_site_is_this_file_and_line() -> None:
    here = frames.user_site()
    assert here is not None and here[0] == __file__ and here[2] == sys._getframe().f_code.co_name
    assert frames.label("/a/b.py", 3, "f") == "f (/a/b.py:3)"
    assert frames.in_library("/x/lib/python3.11/site-packages/transformers/m.py")
    assert not frames.in_library(__file__)


# ---- the report schema and the job view ----------------------------------------------------

def _report(pid: int, rank: Any = None, **compile_: Any) -> Dict[str, Any]:
    process = {"pid": pid, "rank": rank, "host": "h"}
    if "forked_from" in compile_:
        process["forked_from"] = compile_.pop("forked_from")
    data = report_view.normalise({"schema": report_schema.SCHEMA, "process": process,
                                  "compile": {"frames": 1, **compile_}})
    data["_file"] = f"r{pid}.json"
    return data


def test_empty_sections_are_not_a_report() -> None:
    for bad in ({"schema": 1, "process": {}, "compile": {}},
                {"schema": 2, "process": {"pid": 3}, "compile": {}}):
        with pytest.raises(report_schema.ReportError, match="empty sections"):
            report_view.normalise(bad)


def test_a_rank_that_is_not_a_number_does_not_break_the_view() -> None:
    reports = [_report(1, "²"), _report(2, "0"), _report(3, "../escape")]
    view = report_view.job(sorted(reports, key=report_view._order))
    assert [p["pid"] for p in view["processes"]] == [2, 1, 3] and view["healthy"]


def test_a_failed_compile_is_a_red_flag() -> None:
    failed = [{"where": "f (/a.py:3)", "error": "BackendCompilerFailed: boom", "count": 1}]
    view = report_view.job([_report(1, "0", failed=failed)])
    assert not view["healthy"] and "failed to compile" in view["red_flags"][0]


def test_only_ranks_of_a_job_are_compared() -> None:
    frame = [{"where": "f (/a.py:3)", "compiles": 1, "seconds": 1.0}]
    more = [{"where": "f (/a.py:3)", "compiles": 3, "seconds": 3.0}]
    parent_and_child = [_report(1, "0", slowest_frames=frame),
                        _report(2, "0", slowest_frames=more, forked_from=1)]
    assert report_view.diverging(parent_and_child) == []
    assert report_view.job(parent_and_child)["healthy"]
    no_ranks = [_report(1, None, slowest_frames=frame), _report(2, None, slowest_frames=more)]
    assert report_view.diverging(no_ranks) == []
    ranks = [_report(1, "0", slowest_frames=frame), _report(2, "1", slowest_frames=more)]
    (found,) = report_view.diverging(ranks)
    view = report_view.job(ranks)
    assert found["what"] == "compiles" and not view["healthy"]
    assert any("ranks diverge" in flag for flag in view["red_flags"])


def test_the_slowest_frames_show_backward_time() -> None:
    frame = [{"where": "f (/a.py:3)", "compiles": 1, "seconds": 5.0, "forward_seconds": 1.0,
              "backward_seconds": 4.0}]
    reports = [_report(1, "0", slowest_frames=frame)]
    text = "\n".join(report_view.render(report_view.job(reports), reports))
    assert "5.00 s x1" in text and "(backward 4.00 s)" in text


# ---- doctor and selftest text --------------------------------------------------------------

@pytest.mark.parametrize("name, audited", [
    ("VIRTUAL_ENV_PROMPT", False), ("OMP_NUM_THREADS", True), ("TRITON_CACHE_DIR", True),
    ("TORCHINDUCTOR_MAX_AUTOTUNE", True), ("ROCM_AUTOPATCH_VERIFY", True),
    ("PYTORCH_TUNABLEOP_ENABLED", True), ("COMPOSE_PROJECT", False)])
def test_the_doctor_audits_whole_words(name: str, audited: bool) -> None:
    assert cli.audited(name) is audited


def test_selftest_names_the_gpu_once() -> None:
    h100 = {"torch": "2.11.0", "cuda": "12.8", "gpu": "NVIDIA H100 80GB HBM3",
            "arch": "NVIDIA H100 80GB HBM3"}
    assert selftest.machine_line(h100).count("H100") == 1
    mi300 = {"torch": "2.11.0", "hip": "7.0", "gpu": "AMD Instinct MI300X", "arch": "gfx942"}
    assert selftest.machine_line(mi300).endswith("GPU: AMD Instinct MI300X (gfx942)")


# ---- structure -----------------------------------------------------------------------------

def test_the_package_has_no_import_cycle_outside_start_up() -> None:
    """Each module's imports of the package, read from its source (function-level imports
    included): the graph has no cycle, but for the start-up trio (``.pth`` trigger ->
    bootstrap -> importhook -> trigger), which is deliberate."""
    root = Path(__file__).resolve().parent.parent / "rocm_autopatch"
    graph = {}
    for path in root.rglob("*.py"):
        name = "rocm_autopatch." + ".".join(path.relative_to(root).with_suffix("").parts)
        name = name[:-len(".__init__")] if name.endswith(".__init__") else name
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("rocm_autopatch"):
                found.add(node.module) if node.module != "rocm_autopatch" else found.update(
                    f"rocm_autopatch.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("rocm_autopatch."))
        graph[name] = {m for m in found if m != name}
    cycles = []

    def visit(node: str, stack: list) -> None:
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        for nxt in graph.get(node, ()):
            visit(nxt, stack + [node])

    for start in graph:
        visit(start, [])
    assert cycles == [], cycles
