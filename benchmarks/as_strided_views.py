"""torch's OpInfo samples of ``as_strided`` (both variants, the first three samples, fp32),
called as ``opinfo_corpus.py`` calls them (each compiled fresh, sizes and strides passed as
arguments), eager against compiled, with static and dynamic shapes; the sentinel's
verdicts where it is on. Run it with ``ROCM_AUTOPATCH=0`` for torch alone:

    ROCM_AUTOPATCH=0 python benchmarks/as_strided_views.py [cuda|cpu]

On an H200 with torch 2.11 the ``partial_views`` samples with an explicit
``storage_offset`` compile wrong with ``dynamic=True`` (pytorch/pytorch#139628,
BENCHMARKS.md, "torch's OpInfo samples under check").
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any, Dict, List

import torch
from torch.testing._internal.common_methods_invocations import op_db


def main() -> None:
    warnings.filterwarnings("ignore")
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    rows: List[Dict[str, Any]] = []
    for op in (o for o in op_db if o.name == "as_strided"):
        samples = list(op.sample_inputs(device, torch.float32, requires_grad=False))[:3]
        for dynamic in (False, True):
            for k, sample in enumerate(samples):
                torch._dynamo.reset()

                def call(x: Any, *a: Any, _op: Any = op, _kw: Any = sample.kwargs) -> Any:
                    return _op(x, *a, **_kw)

                with torch.no_grad():
                    eager = call(sample.input, *sample.args)
                    compiled = torch.compile(call, dynamic=dynamic)(sample.input, *sample.args)
                rows.append({"variant": op.variant_test_name, "dynamic": dynamic, "sample": k,
                             "input_offset": sample.input.storage_offset(),
                             "kwargs": str(sample.kwargs), "same": torch.equal(eager, compiled),
                             "max_diff": float((eager - compiled).abs().max())})
    try:
        import rocm_autopatch

        verdicts = [g.get("status") for g in
                    (rocm_autopatch.report().verify or {}).get("graphs", [])]
    except ImportError:
        verdicts = []
    print(json.dumps({"device": device, "torch": torch.__version__, "rows": rows,
                      "verdicts": verdicts}))


if __name__ == "__main__":
    main()
