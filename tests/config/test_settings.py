"""The settings table, in this process: every variable's default, every bad value's one
warning (naming the variable and what it accepts), the README's table made from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rocm_autopatch import settings

pytestmark = pytest.mark.fast


ROOT = Path(__file__).resolve().parents[2]


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
    (settings.WATCHDOG, "inf"), (settings.WATCHDOG, "soon"), (settings.WATCHDOG, "-3"),
    (settings.ALLOW_GRAPHS, "2"), (settings.MODE, "banana"),
    (settings.RANK, "²"), (settings.RANK, "../escape"), (settings.RANK, "a/b"),
    (settings.RANK, "7" * 300), (settings.LOCAL_RANK, "-1"),
])
def test_a_bad_value_warns_with_the_name_and_what_is_accepted(name: str, raw: str) -> None:
    found = settings.read(name, {name: raw})
    var = settings.BY_NAME[name]
    assert found.value == var.default  # a misspelt value turns nothing on (issue 44)
    assert found.problem.startswith(f"{name}={raw!r} is not understood; accepted: ")
    assert var.accepted.replace("`", "") in found.problem


@pytest.mark.parametrize("raw, mode", [("1", "check"), ("yes", "check"), ("TRUE", "check"),
                                       ("on", "check"), ("check", "check"),
                                       ("fallback", "fallback"), ("0", "off"), ("no", "off"),
                                       ("off", "off")])
def test_verify_accepts_the_documented_words(raw: str, mode: str) -> None:
    # A value it does not know is the default, off (issue 44: a misspelt value once turned
    # the costly check on), and says so.
    misspelt = settings.read(settings.VERIFY, {settings.VERIFY: "maybe"})
    assert misspelt.value == "off" and "Using off" in misspelt.problem
    assert settings.read(settings.VERIFY, {settings.VERIFY: raw}) == (mode, raw, "")
    assert raw.lower() in settings.BY_NAME[settings.VERIFY].accepted or raw.lower() in (
        "0", "no", "off")


def test_torch_autoload_follows_torchs_own_rule() -> None:
    # torch/__init__.py: os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"
    assert settings.torch_autoload({}) and settings.torch_autoload({settings.TORCH_AUTOLOAD: "1"})
    assert not settings.torch_autoload({settings.TORCH_AUTOLOAD: ""})
    assert not settings.torch_autoload({settings.TORCH_AUTOLOAD: " 1"})

