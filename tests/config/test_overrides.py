"""INDUCTOR_* parsing against the real torch 2.13 inductor config (in-process, no writes)."""

from __future__ import annotations

from typing import Any, Dict, Literal, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocm_autopatch import probe, torch_releases
from rocm_autopatch.config import overrides

pytestmark = pytest.mark.fast  # in this process: pytest -m fast

torch_config = pytest.importorskip("torch._inductor.config")


@given(st.text(max_size=12))
def test_parse_never_raises_anything_but_valueerror(raw: str) -> None:
    for kind in (bool, int, float, str, Literal[0, 1, 2, 3], Optional[bool], Optional[str]):
        try:
            value = overrides.parse(raw, kind)
        except ValueError as exc:
            assert str(exc)  # says what is accepted
        else:
            if kind is bool:
                assert isinstance(value, bool)
            if kind is int:
                assert isinstance(value, int) and value == int(raw.strip(), 10)


@given(st.integers(min_value=-10**9, max_value=10**9))
def test_int_round_trip(value: int) -> None:
    assert overrides.parse(str(value), int) == value


@pytest.mark.parametrize("raw, value", [("1", True), ("ON", True), ("yes", True),
                                        ("0", False), ("off", False), ("No", False)])
def test_bool_words(raw: str, value: bool) -> None:
    assert overrides.parse(raw, bool) is value


def test_never_evaluates() -> None:
    with pytest.raises(ValueError):
        overrides.parse("__import__('os').system('true')", int)


def test_every_inductor_key_has_an_env_name_nested_ones_with_double_underscore() -> None:
    keys = overrides.config_keys(torch_config)
    names = overrides.env_names(keys)
    assert set(names.values()) == set(keys)
    assert names["INDUCTOR_TRITON__CUDAGRAPHS"] == "triton.cudagraphs"
    assert names["INDUCTOR_COORD_DESCENT"] == "coordinate_descent_tuning"


def test_read_uses_the_running_torch_types_and_warns_once_per_bad_variable() -> None:
    warned = []
    found = overrides.read(torch_config, {
        "INDUCTOR_MAX_FUSION_SIZE": "128", "INDUCTOR_TRITON__MULTI_KERNEL": "1",
        "INDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS": "ATEN,TRITON", "INDUCTOR_FREEZING": "nah",
        "INDUCTOR_NOT_A_KEY": "1", "UNRELATED": "x"}, warn=lambda k, m: warned.append(m))
    assert found == {"max_fusion_size": (128, "INDUCTOR_MAX_FUSION_SIZE"),
                     "triton.multi_kernel": (1, "INDUCTOR_TRITON__MULTI_KERNEL"),
                     "max_autotune_gemm_backends": ("ATEN,TRITON",
                                                    "INDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS")}
    assert len(warned) == 2
    assert "INDUCTOR_FREEZING='nah'" in warned[0] and "a boolean" in warned[0]
    assert "INDUCTOR_NOT_A_KEY" in warned[1]


@pytest.mark.parametrize("target, name", [(90010, "gfx90a"), (90402, "gfx942"),
                                          (90500, "gfx950"), (110000, "gfx1100")])
def test_gfx_names(target: int, name: str) -> None:
    assert probe.gfx_name(target) == name


def test_kfd_topology_read_without_hip(tmp_path) -> None:
    for node, target in (("0", 0), ("1", 90402)):
        (tmp_path / node).mkdir()
        (tmp_path / node / "properties").write_text(
            f"cpu_cores_count 0\ngfx_target_version {target}\n")
    assert probe.gpu_archs(str(tmp_path)) == [
        {"node": "1", "arch": "gfx942", "gpu": "MI300X/MI300A/MI325X"}]
    assert probe.gpu_archs(str(tmp_path / "absent")) == []


def test_every_key_typed_with_a_union_accepts_none_and_its_members() -> None:
    """torch writes ``int | None`` (types.UnionType) for 90-odd keys: each takes "none"
    and a value of its plain member type (where that type can be written as text)."""
    import types
    import typing

    unions = 0
    for key in overrides.config_keys(torch_config):
        kind = overrides.key_type(torch_config, key)
        if typing.get_origin(kind) not in (typing.Union, getattr(types, "UnionType", None)):
            continue
        unions += 1
        args = typing.get_args(kind)
        if type(None) in args:
            assert overrides.parse("none", kind) is None, key
        if int in args:
            assert overrides.parse("3", kind) == 3, key
        if str in args:
            assert overrides.parse("text", kind) == "text", key
    declared = any(getattr(torch_releases.config_entry(torch_config, key), "value_type", None)
                   for key in overrides.config_keys(torch_config))
    # torch 2.13 has 93; a release that declares no types at run time (2.4) has those of
    # its None-default keys that its source types (``source_types``): 11 on 2.4.1
    assert unions > 50 if declared else unions > 5
    assert overrides.parse("1", overrides.key_type(torch_config, "compile_threads")) == 1


def _typed_by_the_source_only() -> Dict[str, Any]:
    """{key: the type its source declares} for the keys that default to None and that the
    running torch keeps no type for (2.4: ``cpp.simdlen``; 2.13: the ``cuda`` keys
    inherited from ``cutlass``)."""
    from rocm_autopatch.config import source_types

    found = {}
    for key in overrides.config_keys(torch_config):
        entry = torch_releases.config_entry(torch_config, key)
        untyped = getattr(entry, "value_type", type(None)) is type(None)
        read = source_types.declared(torch_config, key)
        if untyped and getattr(torch_config, key) is None and read is not None:
            found[key] = read
    return found


def test_types_read_from_the_source_are_those_torch_declares() -> None:
    """Where torch keeps its config's types (>= 2.6, pytorch#139833), the types
    ``source_types`` reads from the config's source are the same, key by key, except where
    torch lost one: a key a config class inherits (``class cuda(cutlass)``), typed by its
    default (NoneType, or ``str`` for a ``Literal`` of strings)."""
    import typing

    from rocm_autopatch.config import source_types

    entries = torch_releases.config_entries(torch_config) or {}
    kept = {k: getattr(e, "value_type", None) for k, e in entries.items()}
    if not any(kept.values()):
        pytest.skip("this torch keeps no config types at run time (before 2.6)")
    same, lost = 0, []
    for key, kind in kept.items():
        read = source_types.declared(torch_config, key)
        if read is None:
            continue
        if read == kind:
            same += 1
        else:
            plain = {type(a) for a in typing.get_args(read)}
            assert kind is type(None) or (typing.get_origin(read) is typing.Literal
                                          and plain == {kind}), (key, read, kind)
            lost.append(key)
    assert same > 200 and kept["cpp.simdlen"] == source_types.declared(torch_config,
                                                                         "cpp.simdlen")
    # callables and pass objects are not read: no type, the key stays unsettable
    assert source_types.declared(torch_config, "post_grad_custom_pre_pass") is None
    only = _typed_by_the_source_only()
    assert set(only) == {k for k in lost if kept[k] is type(None)}
    for key in only:  # each lost None-default key now takes a value from the environment
        var = overrides.var_name(key)
        kind = overrides.key_type(torch_config, key)
        raw = "4" if int in typing.get_args(kind) else "text"
        found = overrides.read(torch_config, {var: raw}, warn=lambda k, m: pytest.fail(m))
        assert found[key][0] == overrides.parse(raw, kind) is not None, key


def test_inductor_compile_threads_override_reaches_torch(torch_venv) -> None:
    """An ``int | None`` key set from the environment, through the installed wheel; and a
    None-default key whose type only the config's source has (torch 2.4: ``cpp.simdlen``;
    2.13: the ``cuda`` keys inherited from ``cutlass``), where this torch has one."""
    import typing

    extra = next(({"key": key, "var": overrides.var_name(key)}
                  for key, read in _typed_by_the_source_only().items()
                  if int in typing.get_args(read)), {})
    code = ("import json, sys, torch._inductor.config as ic, rocm_autopatch\n"
            "e = next(c for c in rocm_autopatch.report().config\n"
            "         if c.key == 'inductor.compile_threads')\n"
            "extra = ic.get_config_copy().get(sys.argv[1]) if sys.argv[1] else None\n"
            "print(json.dumps({'value': ic.compile_threads, 'source': e.source,"
            " 'extra': extra, 'status': e.status,"
            " 'warnings': rocm_autopatch.report().warnings}))")
    env = {"ROCM_AUTOPATCH": "force", "INDUCTOR_COMPILE_THREADS": "1"}
    if extra:
        env[extra["var"]] = "4"
    out = torch_venv.json(code, extra.get("key", ""), env=env)
    assert out["value"] == 1 and out["source"] == "override"
    assert out["status"] in ("applied", "unchanged") and out["warnings"] == []
    assert out["extra"] == (4 if extra else None)
