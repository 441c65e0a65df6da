"""The backward pass of a checked call: the compiled graph's gradients against eager's, with
a float64 reference, for the same seeded random upstream gradients.

Each run is of the graph again on detached aliases of the inputs (no copy; no hook of the
program's tensors fires; nothing accumulates into ``.grad``) and on copies of what it
writes. Checked only where the forward passed and the gradients fit in memory.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from rocm_autopatch.sentinel.judging import judge
from rocm_autopatch.sentinel.judging.status import FAILED
from rocm_autopatch.sentinel.runs import memory, numerics, reference
from rocm_autopatch.sentinel.runs.graph import Graph

# Where a graph holds its module's tensors itself (numerics.held), why its compiled
# code cannot be run again on copies of them for a backward check.
HELD = ("the graph holds its module's parameters and buffers itself "
        "(torch._dynamo.config.inline_inbuilt_nn_modules off, the default on torch 2.4), so "
        "its compiled code cannot be run on copies of them")


def check(graph: Graph, flat: List[Any], pre: Any, res: Any, boxed: bool) -> str:
    """The backward verdict, in words: "passed (...)", "failed: ...", "not checked: ..."
    or "not applicable: ..."."""
    import torch

    outs = [o for o in numerics.leaves(res) if isinstance(o, torch.Tensor)]
    if not any(o.requires_grad for o in outs):
        return "not applicable: no output requires grad"
    count = len(graph.placeholders)
    if any(i >= count for i in pre.indices):
        return f"not checked: {HELD}, and it updates some (they would advance twice)"
    held = any(x.requires_grad for x in flat[count:])
    wanted = [i for i, x in enumerate(flat[:count]) if isinstance(x, torch.Tensor)
              and x.requires_grad and x.is_floating_point()]
    if not wanted:
        return f"not checked: {HELD}" if held else "not applicable: no input requires grad"
    need = sum(flat[i].numel() * (2 * flat[i].element_size() + 16) for i in wanted)
    room = memory.free_bytes(flat[wanted[0]].device)
    if room is not None and need > room * memory.SHARE:
        return (f"not checked: the float64 reference gradients would need "
                f"{need / 2**30:.1f} GiB, more than half of the {room / 2**30:.1f} GiB "
                "free")

    def compiled(*inputs: Any) -> Any:
        inputs = inputs[:count]  # it reads what it holds itself
        return graph.compiled(list(inputs)) if boxed else graph.compiled(*inputs)

    try:
        with numerics.quiet():
            got, upstream = _grads(compiled, flat, pre, wanted, None, False)
            eager, _ = _grads(graph.eager_run, flat, pre, wanted, upstream, False)
            eager64, _ = _grads(graph.fp64_run, flat, pre, wanted, upstream, True)
    except Exception as exc:  # noqa: BLE001 - not checkable here: say so
        memory.release()
        return f"not checked: {type(exc).__name__}: {str(exc).strip()[:200]}"
    bad = judge.compare(eager, got, eager64, judge.TOL_BACKWARD, strict=False).bad
    if not bad:
        return f"passed ({len(wanted)} gradients" + (
            "; not those of the parameters the graph holds itself)" if held else ")")
    m = bad[0]
    return (f"{FAILED}: gradient {m.index} (shape {list(m.shape)}, {m.dtype}): "
            + judge.error_figure(m))


def _grads(run: Any, flat: List[Any], pre: Any, wanted: List[int],
           upstream: Optional[List[Any]], fp64: bool) -> Tuple[List[Any], List[Any]]:
    """(d(sum(out * g))/d(input) for the ``wanted`` inputs, the ``g`` used). ``g`` is drawn
    once, seeded, from a private generator (the program's random streams are untouched),
    in each output's dtype; every run gets the same values, each in a copy of its own."""
    import torch

    made = pre.make(fp64=fp64)
    inputs = []
    for i, x in enumerate(flat):
        if i in made:
            x = made[i]
        elif i in wanted:
            x = (reference.to_fp64(x.detach()) if fp64 else x.detach()).requires_grad_()
        inputs.append(x)
    with torch.enable_grad():
        outs = [o for o in numerics.leaves(run(*inputs))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        if upstream is None:
            generator = torch.Generator(device=outs[0].device).manual_seed(0)
            upstream = [torch.randn(o.shape, generator=generator, device=o.device,
                                    dtype=torch.float32).to(o.dtype) for o in outs]
        if len(upstream) != len(outs):
            raise RuntimeError("the runs disagree on which outputs require grad")
        # Each run gets its own copy of ``g``: a compiled backward may write into the
        # gradients it is handed (Inductor reuses their buffers), and the next run would
        # judge against what it left there (seen with DDP's compiled pieces).
        grads = torch.autograd.grad(outs, [inputs[i] for i in wanted],
                                    [reference.to_fp64(g) if fp64 else g.clone()
                                     for g in upstream], allow_unused=True)
    return list(grads), upstream
