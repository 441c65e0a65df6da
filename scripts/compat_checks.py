"""Per-release check, run by scripts/compat.sh with ROCM_AUTOPATCH=force in each torch venv:
every profile key lands under the name this torch uses (read back in a new thread), the
compile guard rewrites, and a real compile still matches eager. Prints one JSON line."""

from __future__ import annotations

import json
import threading

import torch
import torch._dynamo.config as dc
import torch._inductor.config as ic

import rocm_autopatch

received = []
_init = torch._TorchCompileInductorWrapper.__init__


def _spy(self, mode, options, *args, **kwargs):
    received.append(mode)
    return _init(self, mode, options, *args, **kwargs)


torch._TorchCompileInductorWrapper.__init__ = _spy
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
x = torch.randn(4, 8)
compiled = torch.compile(model, mode="reduce-overhead")
close = bool(torch.allclose(compiled(x), model(x), atol=1e-5))
r = rocm_autopatch.report()
mods = {"inductor": ic, "dynamo": dc}


def read(entry):
    obj = mods[entry.key.split(".")[0]]
    for part in (entry.torch_key or entry.key.split(".", 1)[1]).split("."):
        obj = getattr(obj, part)
    return obj


seen = {}
t = threading.Thread(target=lambda: seen.update(
    {c.key: read(c) for c in r.config if c.status in ("applied", "unchanged")}))
t.start()
t.join()
print(json.dumps({
    "torch": torch.__version__, "compile_matches_eager": close, "mode_received": received,
    "config": {c.key: [c.status, c.torch_key or "", c.reason] for c in r.config},
    "new_thread_ok": all(seen[c.key] == c.wanted for c in r.config if c.key in seen),
    "errors": r.errors,
}))
