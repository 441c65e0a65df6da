"""The package's structure, read from its source: the concerns are folders on floors, and
every import runs down (no arrow back up, no cycle outside start-up); the sentinel is
entered through its door and its wings stand on floors of their own; the size limits; the
environment read in one place; a docstring per module saying what it owns.

Floors, from the ground up (a module may import its own floor and those below it):
the ground (the top-level modules every concern shares: the settings, the change record,
our messages...), ``reporting`` (a sink: the concerns hand it their records), ``config``,
``guards``, ``sentinel``, ``startup`` (wires the concerns to torch's imports), ``cli``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rocm_autopatch"
FLOORS = ("ground", "reporting", "config", "guards", "sentinel", "startup", "cli")
CONCERNS = set(FLOORS[1:])
GROUND = {"files", "frames", "log", "patching", "probe", "record", "settings", "text",
          "torch_releases"}
# The sentinel's wings, from the ground up; its own top (``watch``, ``check``,
# ``report_part``) stands above them and the door (``sentinel/__init__``) above that.
WINGS = ("scheduling", "judging", "runs", "healing")
WING_FLOOR = {"scheduling": 0, "judging": 0, "runs": 1, "healing": 2}
MOST_MODULES = 12  # in one package folder, its __init__ included


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


def floor(module: str) -> int:
    """The floor a module of the package stands on (``__main__`` above the command line)."""
    parts = module.split(".")
    if parts[1:] == ["__main__"]:
        return len(FLOORS)
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in CONCERNS else 0


def test_the_concerns_are_folders_and_the_top_holds_only_the_ground() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == CONCERNS
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert top == GROUND


def test_every_import_runs_down_a_floor_or_stays_on_it() -> None:
    """No arrow from a lower floor to a higher one, function-level imports included: the
    report imports none of the concerns, the ground none of the floors above it."""
    up = sorted(f"{a} -> {b}" for a, deps in _graph().items() for b in deps
                if floor(b) > floor(a))
    assert up == []


def test_the_sentinel_is_entered_through_its_door() -> None:
    """Outside the sentinel, only ``rocm_autopatch.sentinel`` itself is imported."""
    inside = "rocm_autopatch.sentinel."
    through_a_wall = sorted(f"{a} -> {b}" for a, deps in _graph().items() for b in deps
                            if b.startswith(inside) and not a.startswith(inside)
                            and a != "rocm_autopatch.sentinel")
    assert through_a_wall == []


def _sentinel_floor(module: str) -> int:
    """Inside the sentinel: its wings (``WING_FLOOR``), then its top, then the door."""
    parts = module.split(".")[2:]
    if not parts:
        return 5
    return WING_FLOOR[parts[0]] if parts[0] in WINGS else 4


def test_the_sentinel_s_wings_import_down_and_never_its_top() -> None:
    sentinel = {a: {b for b in deps if b.startswith("rocm_autopatch.sentinel")}
                for a, deps in _graph().items() if a.startswith("rocm_autopatch.sentinel")}
    up = sorted(f"{a} -> {b}" for a, deps in sentinel.items() for b in deps
                if _sentinel_floor(b) > _sentinel_floor(a))
    assert up == []
    assert {p.name for p in (PACKAGE / "sentinel").iterdir()
            if (p / "__init__.py").is_file()} == set(WINGS)


def test_no_package_folder_holds_more_than_twelve_modules() -> None:
    crowded = {str(folder.relative_to(ROOT)): n for folder in [PACKAGE, *PACKAGE.rglob("*")]
               if (folder / "__init__.py").is_file()
               and (n := len(list(folder.glob("*.py")))) > MOST_MODULES}
    assert crowded == {}


def test_nothing_outside_the_command_line_imports_it() -> None:
    outside = {name: sorted(m for m in deps if m.startswith("rocm_autopatch.cli"))
               for name, deps in _graph().items()
               if not name.startswith("rocm_autopatch.cli") and name != "rocm_autopatch.__main__"}
    assert {k: v for k, v in outside.items() if v} == {}


def test_start_up_imports_only_the_ground_when_it_loads() -> None:
    """At import time start-up loads the ground and itself; every other module it reaches
    is imported inside the hook that needs it, once torch is there."""
    wrong = {name: sorted(m for m in deps if floor(m) != 0
                          and not m.startswith("rocm_autopatch.startup"))
             for name, deps in _graph(at_import_only=True).items()
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
    """``os.environ`` and friends only in ``settings.py`` (ruff's TID251 holds the
    same line; this says where it stands): every other module asks the settings."""
    touching = sorted(name for name, path in MODULES.items()
                      if any(isinstance(n, ast.Attribute) and n.attr in (
                          "environ", "environb", "getenv", "putenv", "unsetenv")
                          and isinstance(n.value, ast.Name) and n.value.id == "os"
                          for n in ast.walk(ast.parse(path.read_text()))))
    assert touching == ["rocm_autopatch.settings"]


def test_every_module_says_what_it_owns() -> None:
    missing = [name for name, path in MODULES.items()
               if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()]
    assert missing == []


# Module paths kept in strings and text: the bootstrap's table, the launcher's shim,
# ``[project.scripts]``, ``-m`` targets, hook names in warnings, and the docs' file paths.
# CHANGELOG.md is history (it names modules as they were) and is not read.
_DOTTED = re.compile(r"(?<![\w./-])((?:_rocm_autopatch_start|rocm_autopatch)(?:\.\w+)+|"
                     r"_rocm_autopatch_start)(?::(\w+))?")
_PATH = re.compile(r"(?<![\w./-])((?:rocm_autopatch/)?(?:startup|config|guards|reporting|"
                   r"sentinel|cli)/[\w/]*\.py|(?:benchmarks|scripts|tests|examples)/[\w/]+"
                   r"\.(?:py|sh))")
TORCHS = ("benchmarks/dynamo/",)  # paths in torch's repository, cited as such
TEXTS = ["pyproject.toml", "README.md", "TESTING.md", "BENCHMARKS.md",
         "_rocm_autopatch_start.py", ".ci/run"]


def _defines(path: Path) -> Set[str]:
    tree = ast.parse(path.read_text())
    names = {"__file__", "__name__", "__version__", "__path__"}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolves(dotted: str, attr: str) -> bool:
    """``rocm_autopatch.<module>[.<name>][:<attr>]``: a module of ours, and what follows it defined
    there (``X.py``, ``X.pth`` and ``X.start`` name files at the checkout's root)."""
    if (ROOT / dotted).is_file():
        return not attr
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        path = MODULES.get(module) or (ROOT / f"{module}.py" if cut == 1 else None)
        if path is not None and path.is_file():
            rest = parts[cut:] + ([attr] if attr else [])
            return not rest or rest[0] in _defines(path)
    return False


def test_every_module_path_kept_in_a_string_resolves() -> None:
    code = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
            *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*"),
            *(ROOT / "examples").glob("*.py")]
    texts = [*(ROOT / "docs").glob("*.md"), *(ROOT / t for t in TEXTS)]
    bases = (ROOT, PACKAGE, ROOT / "tests")
    broken = []
    for path in code + texts:
        text = path.read_text()
        broken += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in _DOTTED.finditer(text)
                   if not _resolves(m.group(1), m.group(2) or "")]
        if path in texts or path.parent == PACKAGE or PACKAGE in path.parents:
            broken += [f"{path.relative_to(ROOT)}: {m.group(1)}" for m in _PATH.finditer(text)
                       if not m.group(1).startswith(TORCHS) and not any(
                           (base / m.group(1)).exists() for base in bases)]
    assert sorted(set(broken)) == []


def test_every_import_of_the_package_names_what_is_there() -> None:
    """``from rocm_autopatch.<module> import a`` in the package, the tests, the benchmarks,
    the scripts and the examples: ``a`` is a submodule or a name that module defines (a move
    that left a benchmark importing a module from where it was fails here, not on a GPU)."""
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
               *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.py"),
               *(ROOT / "examples").glob("*.py")]
    broken = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "rocm_autopatch":
                broken += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{a.name}"
                           for a in node.names if not _resolves(node.module, a.name)
                           and f"{node.module}.{a.name}" not in MODULES]
    assert broken == []
