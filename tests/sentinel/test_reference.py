"""The float64 reference as the sentinel runs it (a graph rewritten once, a cast before each
floating use) against the node-by-node interpreter it replaces, and the written region of
an input the judge sees (a static KV cache written one position per step)."""

from __future__ import annotations

from typing import Any, List

import pytest
from conftest import dynamo_graph

pytestmark = pytest.mark.fast


def _both(gm: Any, keep: List[Any], args: List[Any]) -> Any:
    """(rewritten run's output and kept values, the interpreter's)."""
    from rocm_autopatch.sentinel.runs import reference

    run = reference.Fp64Run(gm, keep)
    assert run.module is not None  # rewritten: no call_module in a Dynamo graph
    kept_fast: dict = {}
    fast = run(args, kept_fast)
    run.module = None  # the interpreter, as before the rewrite
    kept_slow: dict = {}
    slow = run(args, kept_slow)
    return (fast, kept_fast), (slow, kept_slow)


def test_the_rewritten_float64_run_is_the_interpreters_bit_for_bit() -> None:
    """Low-precision methods, dtype arguments, factory calls and argmax's operand: the
    rewritten graph computes what the interpreter did, in float64, and keeps the same
    values."""
    torch = pytest.importorskip("torch")

    def f(x: Any, w: Any) -> Any:
        h = torch.nn.functional.silu(x @ w).float()
        bias = torch.ones(h.shape[-1], dtype=torch.bfloat16)
        scores = (h + bias).to(torch.bfloat16) * 0.5
        return scores.float().argmax(-1), scores.sum(-1, dtype=torch.float32)

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, generator=gen).bfloat16()
    w = torch.randn(16, 32, generator=gen).bfloat16()
    gm = dynamo_graph(f, x, w)
    argmax = next(n for n in gm.graph.nodes if "argmax" in str(n.target))
    (fast, kept_fast), (slow, kept_slow) = _both(gm, [argmax.args[0]], [x, w])
    assert fast[1].dtype == torch.float64 and slow[1].dtype == torch.float64
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
    (value_fast,), (value_slow,) = kept_fast.values(), kept_slow.values()
    assert value_fast.dtype == torch.float64 and torch.equal(value_fast, value_slow)
    # and it is float64's answer, not bf16's: bf16 rounds the sums differently
    assert not torch.equal(fast[1], f(x, w)[1].double())


def test_the_float64_run_of_as_strided_reads_the_storage_around_the_view() -> None:
    """``as_strided`` of a view at an offset reads elements the view does not hold: the
    float64 run, rewritten and node by node, casts the whole storage and views it as the
    program's tensor is (a float64 copy of the view alone starts at offset 0, and read
    other elements: a reference no truth for such a graph)."""
    torch = pytest.importorskip("torch")

    x = torch.arange(40.0)[3:19].view(4, 4)[:, ::2]  # storage offset 3, strides (4, 2)
    gm = dynamo_graph(lambda t: torch.as_strided(t, (2, 2), (1, 1), 1) * 2, x)
    (fast, _), (slow, _) = _both(gm, [], [x])
    truth = torch.as_strided(x, (2, 2), (1, 1), 1).double() * 2  # elements 1-3 of the base
    assert fast[0].dtype == torch.float64 and torch.equal(fast[0], truth)
    assert torch.equal(slow[0], truth)
    assert not torch.equal(torch.as_strided(x.double(), (2, 2), (1, 1), 1) * 2, truth)


def test_the_rewritten_run_reads_the_state_swapped_into_the_graph() -> None:
    """Graphs that hold their own parameters (torch 2.4's Dynamo; FX traces) are run with the
    state a check swaps in (``numerics.bind_state``), not with what the module held."""
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel.runs import numerics, reference

    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((4,), 2.0))

        def forward(self, x: Any) -> Any:
            return x * self.weight

    gm = torch.fx.symbolic_trace(Scale())
    run = reference.Fp64Run(gm, [])
    assert run.module is not None
    names = list(numerics.held(gm))
    bound = numerics.bind_state(lambda *xs: run(list(xs), None), gm, names)
    out = bound(torch.ones(4), torch.full((4,), 3.0))
    assert out.dtype == torch.float64 and torch.equal(out, torch.full((4,), 3.0).double())
    assert torch.equal(gm.weight.detach(), torch.full((4,), 2.0))  # put back


def test_a_graph_that_calls_modules_keeps_the_interpreter() -> None:
    """``call_module`` nodes need their parameters cast too: the interpreter does that."""
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel.runs import reference

    model = torch.nn.Sequential(torch.nn.Linear(8, 8)).bfloat16()
    gm = torch.fx.symbolic_trace(model)
    run = reference.Fp64Run(gm, [])
    assert run.module is None
    x = torch.randn(2, 8).bfloat16()
    out = run([x], None)
    want = x.double() @ model[0].weight.double().t() + model[0].bias.double()
    assert out.dtype == torch.float64 and torch.allclose(out, want, rtol=0, atol=1e-12)


def _cache(rows: int = 64) -> Any:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    return torch.zeros(1, 2, rows, 16, dtype=torch.bfloat16), \
        torch.randn(1, 2, 1, 16, generator=gen, dtype=torch.float64)


def test_the_judge_sees_the_positions_a_decode_step_wrote() -> None:
    """A static KV cache written at one position: the judge compares that position (the
    rest is the state before the call in every run), and a compiled step that writes the
    wrong position is still caught."""
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel.judging import judge
    from rocm_autopatch.sentinel.regions import written_regions

    before, exact = _cache()
    eager, compiled, fp64 = before.clone(), before.clone(), before.double()
    eager[:, :, 5:6] = exact.bfloat16()
    compiled[:, :, 5:6] = exact.bfloat16()
    fp64[:, :, 5:6] = exact
    ((r, c, f),) = written_regions([(before, eager, compiled, fp64)])
    assert r.shape == c.shape == f.shape == (32,)  # 2 heads x 16 at position 5
    assert torch.equal(f, exact.flatten())
    assert judge.compare([r], [c], [f], judge.TOL_FORWARD).bad == []
    wrong = before.clone()
    wrong[:, :, 6:7] = exact.bfloat16()  # one position late
    ((r, c, f),) = written_regions([(before, eager, wrong, fp64)])
    assert r.numel() == 64  # both positions
    (found,) = judge.compare([r], [c], [f], judge.TOL_FORWARD).bad
    assert found.index == 0


def _written_at_5(layers: int) -> List[Any]:
    """A decode step's caches, each written at position 5: (before, eager, compiled, float64,
    the exact values); the second's compiled copy in other strides (the same values: judged
    in logical order)."""
    found = []
    for layer in range(layers):
        before, exact = _cache()
        eager, compiled, fp64 = before.clone(), before.clone(), before.double()
        eager[:, :, 5:6] = compiled[:, :, 5:6] = exact.bfloat16()
        fp64[:, :, 5:6] = exact
        if layer == 1:
            compiled = compiled.transpose(1, 3).contiguous().transpose(1, 3)
        found.append((before, eager, compiled, fp64, exact))
    return found


def test_caches_of_one_shape_are_judged_where_any_of_them_was_written() -> None:
    """A decode step's caches, alike in shape and dtype, found in one synchronisation: each
    judged at the positions any of them changed; one written a position late is caught,
    and a cache of another shape keeps its own positions; strides do not matter."""
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel.judging import judge
    from rocm_autopatch.sentinel.regions import written_regions

    items = []
    for layer, (before, eager, compiled, fp64, exact) in enumerate(_written_at_5(4)):
        if layer == 2:
            compiled = before.clone()
            compiled[:, :, 6:7] = exact.bfloat16()  # one position late
        items.append((before, eager, compiled, fp64))
    other, exact = _cache(rows=8)
    written = other.clone()
    written[:, :, 1:2] = exact.bfloat16()
    items.append((other, written, written.clone(), other.double().index_copy(
        2, torch.tensor([1]), exact)))
    regions = written_regions(items)
    assert [r[0].numel() for r in regions] == [64, 64, 64, 64, 32]
    verdict = judge.compare([r[0] for r in regions], [r[1] for r in regions],
                            [r[2] for r in regions], judge.TOL_FORWARD)
    assert [m.index for m in verdict.bad] == [2]


def test_caches_stacked_in_chunks_give_what_each_compared_alone_gives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU inputs of one shape are compared and gathered stacked, a few at a time (one
    launch per chunk, not per input; stacking forced here, on the CPU): the regions are
    those of the inputs taken one by one, in each input's own logical order whatever its
    strides, for chunks of one, of several and of all, and one by one as on the CPU; a
    float64 copy of another dtype is gathered alone."""
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel import regions
    from rocm_autopatch.sentinel.runs import footprint

    items = []
    for layer, (before, eager, compiled, fp64, _) in enumerate(_written_at_5(5)):
        if layer == 3:
            compiled[:, :, 9:10] += 1  # one written where no other was
        if layer == 4:
            fp64 = fp64.float()  # (not the float64 run's dtype: gathered alone)
        items.append((before, eager, compiled, fp64))
    monkeypatch.setattr(regions, "STACK_ON_CPU", True)  # (on the CPU: one by one)
    union = _union(items)
    assert union.numel() == 2 * 32  # positions 5 and 9 (any input's writes count)
    size = items[0][0].numel() * items[0][0].element_size()
    for chunk in (1, 2, 5, 0):  # one input a stack, two (and a last one alone), all; CPU
        monkeypatch.setattr(footprint, "STACK_BYTES", chunk * size)
        monkeypatch.setattr(regions, "STACK_ON_CPU", chunk > 0)
        found = regions.written_regions(items)
        for k, region in enumerate(found):
            want = [torch.take(x, union) for x in items[k][1:]]
            assert all(a.dtype == b.dtype and torch.equal(a, b)
                       for a, b in zip(region, want)), (chunk, k)


def _union(items: List[Any]) -> Any:
    changed = None
    for before, eager, compiled, _ in items:
        here = (eager != before) | (compiled != before)
        changed = here if changed is None else changed | here
    return changed.flatten().nonzero().squeeze(1)


def test_an_input_written_whole_or_not_at_all_is_judged_whole() -> None:
    pytest.importorskip("torch")
    from rocm_autopatch.sentinel.regions import written_regions

    before, _ = _cache()
    (same,) = written_regions([(before, before.clone(), before.clone(), before.double())])
    assert same[0].shape == before.shape
    everywhere = before + 1
    (whole,) = written_regions([(before, everywhere, everywhere.clone(),
                                 everywhere.double())])
    assert whole[1].shape == before.shape


def test_the_reference_runs_use_inference_mode_unless_the_graph_refuses_it() -> None:
    """Eager and float64 run in inference mode (no autograd bookkeeping per op), on copies
    of what the graph writes. A graph that fails there (here: it reads a version counter,
    which inference tensors lack) is run again under ``no_grad`` on fresh copies, and from
    then on: what the failed run wrote is not seen. Running out of memory is not retried."""
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel import compare
    from rocm_autopatch.sentinel.runs import memory, snapshot
    from rocm_autopatch.sentinel.runs.graph import Graph

    def writes(x: Any, cache: Any) -> Any:
        cache.add_(1)
        return x.sin()

    def refuses(x: Any, cache: Any) -> Any:
        cache.add_(1)
        return x.sin() + (x * 2)._version

    x, cache = torch.randn(4), torch.zeros(4)
    flat = [x, cache]
    pre = snapshot.Snapshot(flat, frozenset({1}))
    for fn, inference in ((writes, True), (refuses, False)):
        graph = Graph(torch.fx.symbolic_trace(fn), fn, "t/0", "test", "check", 1, 0.01)
        eager_inputs, inputs64, ref, ref64, _ = compare.reference_runs(graph, flat, pre)
        assert graph.inference_mode is inference and ref.is_inference() is inference
        assert torch.equal(eager_inputs[1], torch.ones(4)), fn.__name__  # written once
        assert inputs64[1].dtype == torch.float64 and torch.equal(cache, torch.zeros(4))
        assert ref64.dtype == torch.float64
    assert torch.allclose(torch.sin(x.double()), compare.reference_runs(
        Graph(torch.fx.symbolic_trace(writes), writes, "t/1", "test", "check", 1, 0.01),
        flat, pre)[3])

    def too_large(x: Any, cache: Any) -> Any:  # 4 TiB: the allocator refuses it
        # (a method of x: torch 2.4's symbolic_trace runs torch.empty on a proxy's size)
        return x + x.new_empty(x.shape[0] * 2**38)[:4]

    # running out of memory says nothing of inference mode: raised, not retried, not flipped
    graph = Graph(torch.fx.symbolic_trace(too_large), too_large, "t/2", "test", "check", 1,
                  0.01)
    with pytest.raises(RuntimeError, match="allocate") as raised:
        compare.reference_runs(graph, flat, pre)
    assert memory.out_of_memory(raised.value) and graph.inference_mode


def test_the_references_call_the_graph_as_a_function_hooks_unseen_nothing_printed(
        capfd: pytest.CaptureFixture) -> None:
    """The sentinel's runs of a graph are not calls of the module: the program's global
    module hooks (here a pre-hook) never see them, and a run that raises (on an H200 a capture of
    ``cholesky``, which synchronises: "operation not permitted when stream is capturing")
    prints nothing. Called as a module, torch prints the failing line and a traceback on
    stderr before raising (torch/fx/graph_module.py ``_WrappedCall``): 30 lines per graph
    in torch's OpInfo run on the H200, the graph passing all the same."""
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel.runs import numerics
    from rocm_autopatch.sentinel.runs.graph import Graph

    gm = dynamo_graph(lambda x: torch.linalg.cholesky(x) * 2, torch.eye(3))
    graph = Graph(gm, gm, "t/0", "test", "check", 1, 0.01)
    seen: List[Any] = []
    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: seen.append(type(module).__name__))
    try:
        fine = graph.eager_run(torch.eye(3) * 4)
        analysis = numerics.analyse(graph.eager_run, [torch.eye(3)])
        assert analysis.error == "" and analysis.mutated == frozenset()
        with pytest.raises(torch.linalg.LinAlgError):  # not positive-definite
            graph.eager_run(-torch.eye(3))
        assert seen == [] and "FX-traced" not in capfd.readouterr().err
        with pytest.raises(torch.linalg.LinAlgError):  # what the module call does
            gm(-torch.eye(3))
        assert seen and "Call using an FX-traced Module" in capfd.readouterr().err
    finally:
        hook.remove()
    assert torch.equal(fine[0], torch.eye(3) * 4)  # a Dynamo graph returns a tuple
    # a lazy graph module (its code made at its first call) runs as a function too
    from torch.fx._lazy_graph_module import _LazyGraphModule

    from rocm_autopatch.sentinel.runs.graph import as_function

    lazy = _LazyGraphModule.from_graphmodule(gm)
    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: seen.append("lazy"))
    try:
        assert torch.equal(as_function(lazy)(torch.eye(3) * 4)[0], torch.eye(3) * 4)
    finally:
        hook.remove()
    assert "lazy" not in seen


def test_the_subgraphs_of_higher_order_ops_are_called_as_functions_too() -> None:
    """``cond`` calls its branches, subgraphs of the graph, as modules: the program's
    global module hooks saw the sentinel's eager and float64 runs of them (2 and 1 calls
    here), and a branch that raised printed torch's traceback. Now they are called as the
    graph is for the sentinel's runs, and as modules again after: the program's own calls
    of them still reach its hooks."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "cond"):
        pytest.skip("this torch has no torch.cond")
    from rocm_autopatch.sentinel.runs.graph import Graph

    def branches(x: Any) -> Any:
        return torch.cond(x.sum() > 0, lambda y: y.sin() * 2, lambda y: y.cos(), (x,)) + 1

    gm = dynamo_graph(branches, torch.ones(3))
    assert [name for name, _ in gm.named_children()] == ["cond_true_0", "cond_false_0"]
    graph = Graph(gm, gm, "t/0", "test", "check", 1, 0.01)
    seen: List[Any] = []
    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: seen.append(type(module).__name__))
    try:
        (fp64,) = graph.fp64_run(torch.ones(3, dtype=torch.float64))  # the rewrite first
        (eager,) = graph.eager_run(torch.ones(3))
        (again,) = graph.fp64_run(-torch.ones(3, dtype=torch.float64))
        assert seen == []
        gm(torch.ones(3))  # the program's own call: its hooks see the graph and its branch
        assert seen == ["GraphModule", "GraphModule"], seen
        # a lazy branch (its code made at its first call) is given back as it was too
        from torch.fx._lazy_graph_module import _LazyGraphModule

        gm.cond_true_0 = _LazyGraphModule.from_graphmodule(gm.cond_true_0)
        graph.eager_run(torch.ones(3))
        seen.clear()
        gm(torch.ones(3))
        assert seen == ["GraphModule", "GraphModule"], seen  # the lazy branch seen too
    finally:
        hook.remove()
    assert torch.allclose(eager.double(), fp64) and torch.allclose(again, (-torch.ones(3,
                          dtype=torch.float64)).cos() + 1)


def _grouped(monkeypatch: pytest.MonkeyPatch) -> Any:
    """torch's grouped GEMM with its float64 stand-in taken away: a real ATen op with no
    float64 kernel on this CPU ("Expected mat_a to be Float32, BFloat16 or Float16")."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no grouped GEMM")
    from rocm_autopatch.sentinel.runs import stand_ins

    monkeypatch.setattr(stand_ins, "STAND_INS", {})
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 16, generator=gen, dtype=torch.bfloat16)
    b = torch.randn(2, 16, 8, generator=gen, dtype=torch.bfloat16)
    return torch, a, b, torch.tensor([3, 8], dtype=torch.int32)


def test_an_op_without_a_float64_kernel_runs_in_float32_and_the_rest_in_float64(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first rewritten run fails and says to run again (it may have written inputs);
    the run again goes op by op, narrows the op to float32 and gives the answer; from then
    on the graph runs rewritten with the op narrowed, the rest in float64."""
    torch, a, b, offs = _grouped(monkeypatch)
    from rocm_autopatch.sentinel.runs import reference

    def f(a: Any, b: Any, offs: Any) -> Any:
        return torch._grouped_mm(a, b, offs=offs).sin() * 2

    with pytest.raises(RuntimeError, match="Double"):
        torch._grouped_mm(a.double(), b.double(), offs=offs)  # what the stand-in covered
    gm = dynamo_graph(f, a, b, offs)
    run = reference.Fp64Run(gm, [])
    rewritten = run.module
    with pytest.raises(reference.RunAgain, match="RuntimeError"):
        run([a, b, offs], None)
    assert run.narrowed == {} and run.module is rewritten  # nothing learnt in the handler
    want = torch._grouped_mm(a.float(), b.float(), offs=offs).double().sin() * 2
    (out,) = run([a, b, offs], None)  # op by op (a Dynamo graph returns a tuple)
    (name, dtype), = run.narrowed.items()
    assert "grouped_mm" in name and dtype == torch.float32 and run.module is not rewritten
    assert out.dtype == torch.float64 and torch.equal(out, want)
    assert torch.equal(run([a, b, offs], None)[0], want)  # rewritten, narrowed
    run.module = None  # the interpreter (graphs that call modules, forced choices)
    assert torch.equal(run([a, b, offs], None)[0], want)


def test_an_op_that_writes_its_arguments_is_never_narrowed() -> None:
    """Run narrower, an in-place or ``out=`` op would write a narrowed copy and leave the
    float64 value as it was: such ops keep their failure (the check says why)."""
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel.runs.reference import _writes

    x = torch.zeros(2)
    assert _writes(torch.ops.aten.index_copy_, {}) and _writes(torch.ops.aten.add_.Tensor, {})
    assert _writes(torch.Tensor.add_, {}) and _writes(torch.add, {"out": x})
    assert not _writes(torch.ops.aten.add.Tensor, {}) and not _writes(torch.add, {})
    assert not _writes(torch.Tensor.__add__, {})


def test_a_check_through_a_narrowed_op_advances_state_once_and_still_catches_a_bug(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The whole check: the state the graph writes advances once (the failed run's writes
    are thrown away), the healthy graph passes and its record says which op ran narrower;
    a wrong compiled graph is still judged wrong: its bf16 values are coarser than the
    float32 the op ran in, so all the judge's rules hold them to the reference."""
    torch, a, b, offs = _grouped(monkeypatch)
    from rocm_autopatch.sentinel import check
    from rocm_autopatch.sentinel.runs.graph import Graph

    monkeypatch.setenv("ROCM_AUTOPATCH_VERIFY_DIR", "off")

    def f(cache: Any, a: Any, b: Any, offs: Any) -> Any:
        cache.add_(1)
        return torch._grouped_mm(a, b, offs=offs).sin() + cache

    def wrong(cache: Any, a: Any, b: Any, offs: Any) -> Any:
        return f(cache, a, b, offs) * 1.05

    entries = {}
    for name, compiled in (("healthy", f), ("wrong", wrong)):
        cache = torch.zeros(8, 8, dtype=a.dtype)
        args = (cache, a, b, offs)
        gm = dynamo_graph(f, torch.zeros_like(cache), a, b, offs)
        graph = Graph(gm, compiled, "t/0", "test", "check", 1, 0.01)
        with torch.no_grad():
            check.call(graph, args, {})
        assert torch.equal(cache, torch.ones_like(cache)), name  # once
        entries[name] = graph.entry
        said = capsys.readouterr().err
        assert ("computes wrong numbers" in said) is (name == "wrong"), (name, said)
    healthy = entries["healthy"]
    assert healthy["status"] == "passed", healthy
    assert healthy["judge"]["reference_precision"].startswith("_grouped_mm in float32")
    assert entries["wrong"]["status"] == "failed"


def test_values_no_finer_than_a_narrowed_op_are_held_to_a_floored_criterion() -> None:
    """Where an op of the reference ran no finer than a value it reaches, our rules are off
    for that value and torch's criterion judges it, eager's error taken as at least half a
    unit of that precision: a reference that is eager to the bit (the narrowed op read the
    graph's inputs as eager did) would otherwise reject any compiled code that rounds
    otherwise. Values it does not reach, or coarser than it, keep every rule."""
    torch = pytest.importorskip("torch")
    from rocm_autopatch.sentinel.judging import judge

    narrowed = judge.Allowance(0.0, "", torch.bfloat16, "op in bfloat16", frozenset({0}))
    assert not narrowed.truth_for(torch.bfloat16, 0) and narrowed.truth_for(torch.bfloat16, 1)
    assert not narrowed.truth_for(torch.float32, 0)
    assert judge.Allowance(0.0, "", torch.float32).truth_for(torch.bfloat16, 0)
    gen = torch.Generator().manual_seed(0)
    truth = torch.randn(4096, generator=gen, dtype=torch.float64)
    # the reference is eager to the bit; compiled rounds 5% of elements one unit otherwise
    eager = truth.bfloat16()
    compiled = eager.clone()
    some = torch.rand(4096, generator=gen) < 0.05
    compiled[some] = (eager[some].double() * (1 + 2 ** -7)).bfloat16()
    same_as_eager = eager.double()
    unfloored = judge.compare([eager], [compiled], [same_as_eager], judge.TOL_FORWARD)
    assert [m.rule for m in unfloored.bad] == ["torch's criterion"]
    assert judge.compare([eager], [compiled], [same_as_eager], judge.TOL_FORWARD,
                         allowed=narrowed).bad == []
    # a bias of 0.6 units: our bias rule sees it, torch's criterion does not
    biased = (truth * (1 + 0.6 * 2 ** -7)).bfloat16()
    (bad,) = judge.compare([eager], [biased], [truth], judge.TOL_FORWARD).bad
    assert bad.rule == "systematic" and bad.torch_ok
    finer = judge.Allowance(0.0, "", torch.float32, "op in float32")  # finer than bf16
    assert judge.compare([eager], [biased], [truth], judge.TOL_FORWARD, allowed=finer).bad
    assert judge.compare([eager], [biased], [truth], judge.TOL_FORWARD,
                         allowed=narrowed).bad == []  # reached: torch's criterion alone
    assert judge.compare([truth.bfloat16()] * 2, [biased] * 2, [truth] * 2,
                         judge.TOL_FORWARD, allowed=narrowed).bad[0].index == 1  # unreached
    wrong = (truth * 1.05).bfloat16()  # a bug: caught either way
    (bad,) = judge.compare([eager], [wrong], [same_as_eager], judge.TOL_FORWARD,
                           allowed=narrowed).bad
    assert "half a unit of bfloat16" in bad.detail


def test_only_the_values_a_narrowed_op_reaches_are_its(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph's record of what ran narrower, and which of its outputs that reaches: an
    output computed from the grouped GEMM, not one computed from its inputs alone."""
    torch, a, b, offs = _grouped(monkeypatch)
    from rocm_autopatch.sentinel.runs import reference
    from rocm_autopatch.sentinel.runs.graph import Graph

    def f(a: Any, b: Any, offs: Any) -> Any:
        return torch._grouped_mm(a, b, offs=offs).sin(), a * 2

    gm = dynamo_graph(f, a, b, offs)
    graph = Graph(gm, gm, "t/0", "test", "check", 1, 0.01)
    assert graph.narrowing([]) == (None, "", None)
    with pytest.raises(reference.RunAgain):
        graph.fp64_run(a, b, offs)
    graph.fp64_run(a, b, offs)
    coarsest, said, reached = graph.narrowing([])
    assert coarsest == torch.float32 and reached == frozenset({0})
    assert said == "_grouped_mm in float32 (its float64 call failed)"
