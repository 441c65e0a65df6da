"""The compile guard: every call form, on the real torch.compile, under ROCM_AUTOPATCH=force.

What torch *received* is read from ``torch._TorchCompileInductorWrapper``, the object the
real torch.compile builds from ``mode``/``options`` (spied on, not replaced).
"""

from __future__ import annotations

import json
import textwrap
from typing import Callable, Dict

import pytest
from conftest import Venv

from rocm_autopatch.guards import compile_options

SPY = """
import functools, json, torch
RECEIVED = []
_init = torch._TorchCompileInductorWrapper.__init__
def _spy(self, mode, options, *args, **kwargs):
    RECEIVED.append({"mode": mode, "options": options})
    return _init(self, mode, options, *args, **kwargs)
torch._TorchCompileInductorWrapper.__init__ = _spy
def eager(x):
    return torch.nn.functional.gelu(x) * 3 + 1
x = torch.randn(4, 8)
def check(fn):
    return bool(torch.allclose(fn(x), eager(x), atol=1e-6))
"""

FORMS = {
    "call": "out = check(torch.compile(eager, mode='reduce-overhead'))",
    "decorator_bare": "out = check(torch.compile(eager))",
    "decorator_mode": "out = check(torch.compile(mode='reduce-overhead')(eager))",
    "module_compile": """
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
ref = m(x); m.compile(mode='max-autotune'); out = bool(torch.allclose(m(x), ref, atol=1e-5))""",
    "compiler_compile": "out = check(torch.compiler.compile(eager, mode='reduce-overhead'))",
    "partial": "out = check(functools.partial(torch.compile, mode='reduce-overhead')(eager))",
    "from_import": "from torch import compile as c\nout = check(c(eager, mode='reduce-overhead'))",
    "options": "out = check(torch.compile(eager, options={'triton.cudagraphs': True, "
               "'epilogue_fusion': True}))",
    "lite_or_default": "out = check(torch.compile(eager, mode='default'))",
}
EXPECTED = {
    "call": [{"mode": "default", "options": None}],
    "decorator_bare": [{"mode": "default", "options": None}],  # torch turns None into default
    "decorator_mode": [{"mode": "default", "options": None}],
    "module_compile": [{"mode": "default", "options": None}],  # safe: no autotuning either
    "compiler_compile": [{"mode": "default", "options": None}],
    "partial": [{"mode": "default", "options": None}],
    "from_import": [{"mode": "default", "options": None}],
    "options": [{"mode": None, "options": {"epilogue_fusion": True}}],
    "lite_or_default": [{"mode": "default", "options": None}],
}
UNCHANGED = {  # without the guard (ROCM_AUTOPATCH=0) torch gets what was written
    "call": [{"mode": "reduce-overhead", "options": None}],
    "module_compile": [{"mode": "max-autotune", "options": None}],
    "options": [{"mode": None, "options": {"triton.cudagraphs": True, "epilogue_fusion": True}}],
}
REPEATED = """
for _ in range(3):
    f = torch.compile(eager, mode='reduce-overhead')
out = check(f)"""
COMBO = 'out = check(torch.compile(eager, options={"combo_kernels": True, ' \
    '"epilogue_fusion": True}))'
AUTOTUNE = """
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
ref = m(x)
a = torch.compile(m, mode="max-autotune")
b = torch.compile(m, mode="max-autotune-no-cudagraphs")
c = torch.compile(m, options={"max_autotune": True, "coordinate_descent_tuning": True,
                              "epilogue_fusion": True})
out = all(bool(torch.allclose(f(x), ref, atol=1e-5)) for f in (a, b, c))"""
PICKLED = """
import inspect, pickle
out = {"same": pickle.loads(pickle.dumps(torch.compile)) is torch.compile,
       "sig": str(inspect.signature(torch.compile)), "doc": torch.compile.__doc__[:60],
       "name": torch.compile.__name__}"""
NESTED = """
def inner(x):
    return torch.cos(x) + 1
def outer(x):
    y = torch.sin(x)
    return torch.compile(inner)(y) * 2
e = torch._dynamo.explain(outer)(torch.randn(8))
out = {"breaks": e.graph_break_count, "graphs": e.graph_count,
       "reasons": sorted({str(b.reason)[:80] for b in e.break_reasons})}"""
GENERATE = """
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation import CompileConfig
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(cfg).eval()
ids = torch.randint(0, 128, (1, 6))
kw = dict(max_new_tokens=6, do_sample=False, cache_implementation="static")
plain = model.generate(ids, disable_compile=True, **kw)
cc = CompileConfig(); cc._compile_all_devices = True
compiled = model.generate(ids, compile_config=cc, **kw)
out = {"same": plain.tolist() == compiled.tolist(),
       "compiled": hasattr(model, "_compiled_call")}"""
BODIES = {**FORMS, "repeated": REPEATED, "combo": COMBO, "autotune": AUTOTUNE,
          "pickled": PICKLED, "nested": NESTED, "generate": GENERATE}


# The forms of one environment in one process (one interpreter importing torch, not one per
# form): each form in a block of its own lines of one script (its own call site), from a
# fresh Dynamo, its stderr after a marker line, its rewrites those the report gained in the
# block, an exception its own.
BLOCK = """
RECEIVED.clear(); torch._dynamo.reset(); out = None
print("@@ FORM", file=sys.stderr, flush=True)
try:
CODE
    ALL["FORM"] = {"out": out, "received": list(RECEIVED), "rewrites": rewrites()[done:]}
except Exception:
    ALL["FORM"] = {"error": traceback.format_exc()}
done = len(rewrites())
sys.stderr.flush()
"""
BATCH_REPORT = """
import sys, traceback, rocm_autopatch
ALL, done = {}, 0
def rewrites():
    r = rocm_autopatch.report()
    return [[w.before, w.after, w.call_site, w.count, w.reason] for w in r.compile_rewrites]
"""


def _batch(venv: Venv, forms: Dict[str, str], **env: str) -> Dict[str, tuple]:
    """{form: (what it got, its stderr)}, every form run in one process."""
    code = SPY + (BATCH_REPORT if env.get("ROCM_AUTOPATCH") != "0" else
                  "import sys, traceback\nALL, done = {}, 0\ndef rewrites():\n    return []\n")
    for form, body in forms.items():
        code += BLOCK.replace("FORM", form).replace("CODE", textwrap.indent(body, "    "))
    proc = venv.run(code + "print(json.dumps(ALL))", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    said = {name: text for name, _, text in (part.partition("\n") for part in
                                              ("\n" + proc.stderr).split("\n@@ ")[1:])}
    return {form: (got[form], said[form]) for form in forms}


FORCE = {"ROCM_AUTOPATCH": "force"}
# The forms each environment's one process runs (a form in an environment not here runs
# alone, in a process of its own).
PLAN = [(FORCE, list(BODIES)),
        ({"ROCM_AUTOPATCH": "0"}, [*UNCHANGED, "pickled", "nested"]),
        ({**FORCE, "ROCM_AUTOPATCH_PROFILE": "perf"}, ["combo", "autotune"])]


@pytest.fixture(scope="module")
def forms(torch_venv: Venv) -> Callable[..., tuple]:
    """``forms(form, **env)``: (what ``form`` got, its stderr), from the one process of
    ``env`` that runs every form ``PLAN`` gives ``env``; fails with the form's exception."""
    done: Dict[tuple, Dict[str, tuple]] = {}

    def get(form: str, **env: str) -> tuple:
        names = next((n for e, n in PLAN if e == env and form in n), [form])
        key = (tuple(sorted(env.items())), tuple(names))
        if key not in done:
            done[key] = _batch(torch_venv, {n: BODIES[n] for n in names}, **env)
        out, said = done[key][form]
        assert "error" not in out, out["error"][-3000:]
        return out, said

    return get


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_call_form_reaches_torch_rewritten(forms: Callable[..., tuple],
                                                 form: str) -> None:
    out, stderr = forms(form, **FORCE)
    assert out["out"] is True  # compiled result equals eager
    assert out["received"] == EXPECTED[form]
    rewrote = form not in ("decorator_bare", "lite_or_default")
    warnings = [ln for ln in stderr.splitlines() if "runs as torch.compile(" in ln]
    if rewrote:
        assert len(out["rewrites"]) == 1 and out["rewrites"][0][3] == 1  # once, not twice
        assert out["rewrites"][0][2].startswith("<string>:")  # the caller, not torch
        assert len(warnings) == 1 and "ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS=1" in warnings[0]
    else:
        assert out["rewrites"] == [] and warnings == []


@pytest.mark.parametrize("form", sorted(UNCHANGED))
def test_without_the_package_torch_gets_what_was_written(forms: Callable[..., tuple],
                                                         form: str) -> None:
    out, _ = forms(form, ROCM_AUTOPATCH="0")
    assert out["received"] == UNCHANGED[form]


def test_escape_hatch_keeps_cuda_graph_modes(forms: Callable[..., tuple]) -> None:
    out, _ = forms("call", **FORCE, ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS="1")
    assert out["received"] == [{"mode": "reduce-overhead", "options": None}]
    assert out["rewrites"] == []


def test_repeated_calls_are_counted_and_logged_once(forms: Callable[..., tuple]) -> None:
    out, stderr = forms("repeated", **FORCE)
    assert [w[3] for w in out["rewrites"]] == [3]
    assert stderr.count("runs as torch.compile(") == 1


@pytest.mark.parametrize("kwargs", [
    {"backend": "eager", "mode": "reduce-overhead"},
    {"backend": "eager", "mode": "max-autotune"},
    {"backend": "aot_eager", "options": {"triton.cudagraphs": True}},
    {"backend": "cudagraphs"},
    {"backend": lambda gm, inputs: gm, "mode": "max-autotune"},   # vLLM-style callable
    {"mode": "lite"}, {"mode": "no-such-mode"}, {"mode": "default"},
    {"options": {"triton.cudagraphs": False, "max_autotune": False}},
    {"options": {"guard_filter_fn": print}},           # an option we don't know: untouched
    {"mode": "default", "recompile_limit": 4},          # newer kwargs pass through
])
@pytest.mark.fast
def test_rewrite_leaves_other_backends_and_modes_alone(kwargs: dict) -> None:
    for allowed in (compile_options.Policy(False, False), compile_options.Policy(False, True)):
        assert compile_options.rewrite(kwargs, allowed) is None


P = compile_options.Policy
# (what was asked, policy) -> what torch gets, what was removed. policy: graphs, tuning.
TABLE = [
    ({"mode": "max-autotune"}, P(False, False), {"mode": "default"}, ("graphs", "tuning")),
    ({"mode": "max-autotune"}, P(False, True), {"mode": "max-autotune-no-cudagraphs"},
     ("graphs",)),
    ({"mode": "max-autotune"}, P(True, False), {"mode": "reduce-overhead"}, ("tuning",)),
    ({"mode": "max-autotune-no-cudagraphs"}, P(False, False), {"mode": "default"},
     ("tuning",)),
    ({"mode": "reduce-overhead"}, P(False, True), {"mode": "default"}, ("graphs",)),
    ({"options": {"max_autotune": True, "epilogue_fusion": False}}, P(False, False),
     {"options": {"epilogue_fusion": False}}, ("tuning",)),
    ({"options": {"coordinate_descent_tuning": 1, "max_autotune_gemm": True,
                  "max_autotune_pointwise": True}}, P(False, False), {"options": None},
     ("tuning",)),
    ({"options": {"max_autotune": True, "triton.cudagraphs": True}}, P(False, True),
     {"options": {"max_autotune": True}}, ("graphs",)),
    ({"options": {"combo_kernels": True, "epilogue_fusion": True}}, P(False, False, False),
     {"options": {"epilogue_fusion": True}}, ("combo",)),
    ({"options": {"combo_kernels": True}}, P(False, False, True), None, ()),
]


@pytest.mark.parametrize("asked, allowed, gets, removed", TABLE)
@pytest.mark.fast
def test_rewrite_table(asked: dict, allowed, gets: dict, removed: tuple) -> None:
    assert compile_options.rewrite(asked, allowed) == ((gets, removed) if gets else None)


@pytest.mark.parametrize("env, kept", [
    ({}, False), ({"INDUCTOR_COMBO_KERNELS": "1"}, True),
    ({"ROCM_AUTOPATCH_PROFILE": "perf"}, True)])
def test_combo_kernels_asked_for_in_code(forms: Callable[..., tuple], env: dict,
                                         kept: bool) -> None:
    """On a torch before 2.14 (the suite's 2.13) safe drops per-call combo kernels, saying
    why with the reports; INDUCTOR_COMBO_KERNELS=1 and perf keep them (spied on what
    reaches Inductor)."""
    out, stderr = forms("combo", **FORCE, **env)
    asked = {"combo_kernels": True, "epilogue_fusion": True}
    assert out["out"] is True
    if kept:
        assert out["received"] == [{"mode": None, "options": asked}] and not out["rewrites"]
        return
    assert out["received"] == [{"mode": None, "options": {"epilogue_fusion": True}}]
    (rewrite,) = out["rewrites"]
    assert "pytorch#168937" in rewrite[4] and "pytorch#187269" in rewrite[4]
    (warning,) = [ln for ln in stderr.splitlines() if "runs as torch.compile(" in ln]
    assert "INDUCTOR_COMBO_KERNELS=1" in warning


@pytest.mark.parametrize("env, received", [
    ({}, [{"mode": "default", "options": None}, {"mode": "default", "options": None},
          {"mode": None, "options": {"epilogue_fusion": True}}]),
    ({"ROCM_AUTOPATCH_PROFILE": "perf"},
     [{"mode": "max-autotune-no-cudagraphs", "options": None},
      {"mode": "max-autotune-no-cudagraphs", "options": None},
      {"mode": None, "options": {"max_autotune": True, "coordinate_descent_tuning": True,
                                 "epilogue_fusion": True}}]),
    ({"INDUCTOR_MAX_AUTOTUNE": "1"},  # the escape hatch keeps per-call tuning under safe
     [{"mode": "max-autotune-no-cudagraphs", "options": None},
      {"mode": "max-autotune-no-cudagraphs", "options": None},
      {"mode": None, "options": {"max_autotune": True, "coordinate_descent_tuning": True,
                                 "epilogue_fusion": True}}]),
    ({"INDUCTOR_MAX_AUTOTUNE": "1", "ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS": "1"},
     [{"mode": "max-autotune", "options": None},
      {"mode": "max-autotune-no-cudagraphs", "options": None},
      {"mode": None, "options": {"max_autotune": True, "coordinate_descent_tuning": True,
                                 "epilogue_fusion": True}}]),
])
def test_autotuning_asked_for_in_code(forms: Callable[..., tuple], env: dict,
                                      received: list) -> None:
    """Spied on what reaches Inductor: safe removes tuning from every source; perf and
    INDUCTOR_MAX_AUTOTUNE=1 keep it (without graphs unless those are allowed too)."""
    out, stderr = forms("autotune", **FORCE, **env)
    assert out["out"] is True and out["received"] == received
    warnings = [ln for ln in stderr.splitlines() if "runs as torch.compile(" in ln]
    assert len(warnings) == len(out["rewrites"])  # one per call site
    if not env:
        assert len(warnings) == 3
        assert all("ROCm/pytorch#3548" in w and "INDUCTOR_MAX_AUTOTUNE=1" in w
                   for w in warnings)
        assert all(r[4] and "pytorch#193735" in r[4] for r in out["rewrites"])
        assert "ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS=1" in warnings[0]  # max-autotune: graphs too
        assert "ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS" not in warnings[1]
    if env.get("ROCM_AUTOPATCH_ALLOW_CUDAGRAPHS"):
        assert out["rewrites"] == [] and warnings == []


def test_environment_autotuning_stays_neutralised_under_perf(torch_venv: Venv) -> None:
    """TORCHINDUCTOR_MAX_AUTOTUNE=1 from a container image is invisible to the script's
    author: neutralised in both profiles (only per-call tuning is kept under perf)."""
    code = "import json, torch, torch._inductor.config as ic\n" \
           "print(json.dumps([ic.max_autotune, ic.max_autotune_pointwise]))"
    for profile in ("safe", "perf"):
        out = torch_venv.json(code, env={"ROCM_AUTOPATCH": "force",
                                         "ROCM_AUTOPATCH_PROFILE": profile,
                                         "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
                                         "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE": "1"})
        assert out == [False, False], profile


def test_guard_is_pickled_and_inspected_like_the_original(
        forms: Callable[..., tuple]) -> None:
    (guarded, _), (plain, _) = forms("pickled", **FORCE), forms("pickled", ROCM_AUTOPATCH="0")
    assert guarded["out"] == plain["out"] and guarded["out"]["same"] is True


def test_compile_inside_a_compiled_region_adds_no_graph_break(
        forms: Callable[..., tuple]) -> None:
    assert forms("nested", **FORCE)[0]["out"] == forms("nested", ROCM_AUTOPATCH="0")[0]["out"]


def test_hugging_face_generate_with_reduce_overhead_compile(torch_venv: Venv,
                                                            forms: Callable[..., tuple]
                                                            ) -> None:
    """transformers calls torch.compile(mode='reduce-overhead') inside generate()."""
    torch_venv.needs("transformers")
    out, _ = forms("generate", **FORCE)
    assert out["out"]["same"] is True and out["out"]["compiled"] is True
    (rewrite,) = out["rewrites"]
    assert rewrite[0]["mode"] == "reduce-overhead" and rewrite[1]["mode"] == "default"
    assert "transformers" in rewrite[2]
