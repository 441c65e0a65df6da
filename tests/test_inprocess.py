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

from rocm_autopatch import frames, patching
from rocm_autopatch.cli import doctor, selftest
from rocm_autopatch.config import settings
from rocm_autopatch.reporting import schema, view

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
    assert found.value == (var.default if var.instead is None else var.instead)
    assert found.problem.startswith(f"{name}={raw!r} is not understood; accepted: ")
    assert var.accepted.replace("`", "") in found.problem


@pytest.mark.parametrize("raw, mode", [("1", "check"), ("yes", "check"), ("TRUE", "check"),
                                       ("on", "check"), ("check", "check"),
                                       ("fallback", "fallback"), ("0", "off"), ("no", "off")])
def test_verify_accepts_the_documented_words(raw: str, mode: str) -> None:
    # A value it does not know checks (the user asked for something): it says so.
    assert settings.read(settings.VERIFY, {settings.VERIFY: "maybe"}).value == "check"
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
    from rocm_autopatch.guards import compile_options

    before = torch.compile
    assert not patching.ours(before)  # a CPU build: the package applied nothing here
    compile_options.install(torch)
    try:
        guarded = torch.compile
        assert patching.ours(guarded) and patching.original_of(guarded) is before
        assert guarded.__module__ == before.__module__ and guarded.__name__ == "compile"
        compile_options.install(torch)  # idempotent
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


# ---- doctor and selftest text --------------------------------------------------------------

@pytest.mark.parametrize("name, audited", [
    ("VIRTUAL_ENV_PROMPT", False), ("OMP_NUM_THREADS", True), ("TRITON_CACHE_DIR", True),
    ("TORCHINDUCTOR_MAX_AUTOTUNE", True), ("ROCM_AUTOPATCH_VERIFY", True),
    ("PYTORCH_TUNABLEOP_ENABLED", True), ("COMPOSE_PROJECT", False)])
def test_the_doctor_audits_whole_words(name: str, audited: bool) -> None:
    assert doctor.audited(name) is audited


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


# ---- the sentinel's judge: the false alarms and misses of issue 24, value by value ---------

def _judge(eager: Any, compiled: Any, fp64: Any, derived: Any = None) -> Any:
    from rocm_autopatch.sentinel import judge

    return judge.compare([eager], [compiled], [fp64], judge.TOL_FORWARD, derived)


def test_an_argmax_tie_broken_the_other_way_is_not_a_miscompile() -> None:
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel import judge

    logits64 = torch.tensor([[1.0, 3.0, 3.0 + 1e-4, 0.5], [2.0, 0.1, 0.2, 0.3]],
                            dtype=torch.float64)
    eager, tie = torch.tensor([1, 0]), torch.tensor([2, 0])  # 3.0 vs 3.0001 in bf16: a tie
    how = {0: judge.Derived("argmax", [logits64], torch.bfloat16, -1, False)}
    found = _judge(eager, tie, tie, how)
    assert found.bad == [] and found.torch_failed == [0]  # torch's criterion: a false alarm
    wrong = torch.tensor([3, 0])  # 0.5 is no tie with 3.0
    (bad,) = _judge(eager, wrong, wrong, how).bad
    assert bad.rule == "integer" and "not a tie" in bad.detail


def test_an_integer_off_by_one_is_caught() -> None:
    torch = pytest.importorskip("torch")
    pages = torch.arange(1000, 5000, dtype=torch.int64)
    off = pages.clone()
    off[7] += 1
    found = _judge(pages, off, pages)
    assert [m.rule for m in found.bad] == ["integer"] and found.torch_failed == []


def test_fp16_overflow_to_inf_is_the_right_rounding() -> None:
    torch = pytest.importorskip("torch")
    exact = torch.tensor([70000.0, 1.0, -2.0], dtype=torch.float64)  # beyond fp16's 65504
    eager = torch.tensor([65504.0, 1.0, -2.0], dtype=torch.float16)  # rounded three times
    compiled = exact.to(torch.float16)  # rounded once: inf
    assert torch.isinf(compiled[0])
    assert _judge(eager, compiled, exact).bad == []
    nan = compiled.clone()
    nan[1] = float("nan")  # but a NaN where float64 is 1.0 is wrong
    (bad,) = _judge(eager, nan, exact).bad
    assert bad.rule == "non-finite" and bad.nonfinite == 1


def test_a_few_wrong_values_among_millions_are_caught() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    exact = torch.randn(16 * 2**20, dtype=torch.float64, generator=gen)
    eager = exact.to(torch.bfloat16)  # in bf16 eager's own rounding hides them from an RMSE
    compiled = eager.clone()
    compiled[torch.randperm(exact.numel(), generator=gen)[:16]] = 0.0
    found = _judge(eager, compiled, exact)
    assert [m.rule for m in found.bad] == ["localized"] and found.torch_failed == []
    assert " of 16777216 elements off float64" in found.bad[0].detail  # a zero is no error


def _noisy(exact: Any, ulps: float, gen: Any, bias: float = 0.0) -> Any:
    """``exact`` with a rounding-like relative error of about ``ulps`` bf16 units, and a
    relative ``bias`` (a kernel that computes 1% too much), rounded to bf16."""
    torch = pytest.importorskip("torch")
    eps = torch.finfo(torch.bfloat16).eps
    noise = torch.randn(exact.shape, dtype=torch.float64, generator=gen) * ulps * eps
    return (exact * (1 + bias + noise)).to(torch.bfloat16)


def test_a_systematic_bf16_bias_is_caught_and_rounding_noise_is_not() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(1)
    exact = torch.randn(2**20, dtype=torch.float64, generator=gen)
    eager = _noisy(exact, 4.0, gen)  # eager rounds at every op: its error has grown
    healthy = _noisy(exact, 3.0, gen)  # a fused kernel rounds less
    assert _judge(eager, healthy, exact).bad == []
    biased = _noisy(exact, 3.0, gen, bias=0.01)  # SiLU 1% too large, seen at the output
    found = _judge(eager, biased, exact)
    assert [m.rule for m in found.bad] == ["systematic"] and found.torch_failed == []


def test_overlapping_views_stay_overlapping_in_the_references_copies() -> None:
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel import numerics

    buffer = torch.arange(10.0)
    a, b = buffer[0:6], buffer[4:10]  # share elements 4 and 5
    snap = numerics.Snapshot([a, b, torch.ones(2)], frozenset({0}))
    assert snap.indices == {0, 1}
    for fp64 in (False, True):
        copies = snap.make(fp64=fp64)
        copies[0].add_(100)
        assert copies[1][0].item() == 104 and copies[1][2].item() == 6
        assert copies[0].dtype == (torch.float64 if fp64 else torch.float32)
    a.add_(1)
    snap.restore([a, b])
    assert torch.equal(buffer, torch.arange(10.0))
