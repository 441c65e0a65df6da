"""The package's structure, read from its source: the concerns are folders, imports run one
way (nothing outside ``cli/`` imports it; start-up imports only core modules at import
time), no import cycle outside start-up, the size limits, the environment read in one
place, a docstring per module saying what it owns."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rocm_autopatch"
CONCERNS = {"startup", "config", "guards", "reporting", "sentinel", "cli"}
# The core: modules at the package's top, shared by every concern, plus the two that every
# concern reads (the settings, the change record).
CORE = {"rocm_autopatch", "rocm_autopatch.config", "rocm_autopatch.config.settings",
        "rocm_autopatch.reporting", "rocm_autopatch.reporting.record"} | {
    f"rocm_autopatch.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def _name(path: Path) -> str:
    name = "rocm_autopatch." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


MODULES = {_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path) -> List[Tuple[str, bool]]:
    """(module of the package imported, at import time?) for each import in ``path`` that
    runs; a name taken from a package is the submodule where it is one."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    typing_only = {id(n) for block in tree.body if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:  # annotations only: never imported when it runs
            continue
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] == "rocm_autopatch":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((sub if sub in MODULES else node.module, id(node) in top))
        elif isinstance(node, ast.Import):
            found += [(a.name, id(node) in top) for a in node.names
                      if a.name.split(".")[0] == "rocm_autopatch"]
    return found


def _graph(at_import_only: bool = False) -> Dict[str, Set[str]]:
    return {name: {m for m, top in _imports(path) if m != name and (top or not at_import_only)}
            for name, path in MODULES.items()}


def test_the_package_has_no_import_cycle_outside_start_up() -> None:
    """Every import of the package, function-level ones included: no cycle. The start-up
    trio's loop (``.pth`` trigger -> bootstrap -> finder -> trigger) runs through
    ``_rocm_autopatch_start``, outside the package, on purpose."""
    graph = _graph()
    cycles = []

    def visit(node: str, stack: List[str]) -> None:
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        for nxt in graph.get(node, ()):
            visit(nxt, stack + [node])

    for start in graph:
        visit(start, [])
    assert cycles == [], cycles


def test_the_concerns_are_folders_and_the_top_holds_only_the_core() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == CONCERNS
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert top == {"files", "frames", "log", "patching", "probe", "text", "torch_releases"}


def test_nothing_outside_the_command_line_imports_it() -> None:
    outside = {name: sorted(m for m in deps if m.startswith("rocm_autopatch.cli"))
               for name, deps in _graph().items()
               if not name.startswith("rocm_autopatch.cli") and name != "rocm_autopatch.__main__"}
    assert {k: v for k, v in outside.items() if v} == {}


def test_start_up_imports_only_core_modules_when_it_loads() -> None:
    """At import time start-up loads the core and itself; every other module it reaches
    is imported inside the hook that needs it, once torch is there."""
    wrong = {name: sorted(deps - CORE - {m for m in MODULES if m.startswith(
        "rocm_autopatch.startup")}) for name, deps in _graph(at_import_only=True).items()
        if name.startswith("rocm_autopatch.startup")}
    assert {k: v for k, v in wrong.items() if v} == {}


def test_no_module_class_or_function_outgrows_its_limit() -> None:
    """A module of at most 450 lines, a class of 200, a function of 60."""
    over = []
    for name, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > 450:
            over.append((name, text.count("\n")))
        for node in ast.walk(ast.parse(text)):
            limit = 200 if isinstance(node, ast.ClassDef) else 60 if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
            if limit and node.end_lineno - node.lineno + 1 > limit:
                over.append((f"{name}.{node.name}", node.end_lineno - node.lineno + 1))
    assert over == []


def test_the_environment_is_read_in_one_module_of_the_package() -> None:
    """``os.environ`` and friends only in ``config/settings.py`` (ruff's TID251 holds the
    same line; this says where it stands): every other module asks the settings."""
    touching = sorted(name for name, path in MODULES.items()
                      if any(isinstance(n, ast.Attribute) and n.attr in (
                          "environ", "environb", "getenv", "putenv", "unsetenv")
                          and isinstance(n.value, ast.Name) and n.value.id == "os"
                          for n in ast.walk(ast.parse(path.read_text()))))
    assert touching == ["rocm_autopatch.config.settings"]


def test_every_module_says_what_it_owns() -> None:
    missing = [name for name, path in MODULES.items()
               if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()]
    assert missing == []
