"""A check whose references run beside the program, its verdict read at a later call.

Under ``check`` the program's result is the compiled one whatever the verdict, so nothing it
does needs to wait for one. Where a shape's references are captured (``replay``), no
gradient is checked and every input the replay reads in place has a version counter (an
inference tensor has none: a write to it could not be seen), a check launches them and
returns: on the program's stream, after the compiled call, the call's outputs and the
inputs it wrote are copied (the program may write or free them next); then, on the
sentinel's own stream, behind an event, the captured references replay on the state
before the call (the snapshot). A later call of the graph reads the verdict once the
sentinel's stream has passed its event (``finished``, a query that never waits); a check
that falls due first, and the process's exit, wait for it (``sentinel.pending``).

What a deferred check must not get wrong, and how:
- the program's stream never waits for the sentinel's, and the references and the judge
  make no host synchronisation at the call (the magnitudes read before it still do); the
  compiled call is not timed there (the schedule keeps the time measured at checks
  judged at the call);
- inputs a replay copies (those that are not parameters, up to ``replay.COPY_BYTES`` each,
  and those seen to move) are copied at the call, on the program's stream; the rest
  (parameters, a large cache the graph does not write) are read where they are, later
  than the call: an input whose version counter moved before the verdict (the program
  wrote it in place: a weight updated between calls) voids the check, which is said and
  not judged, and that input is copied from the shape's next capture on; a write that
  bypasses the counter (``.data``, a kernel writing through a raw pointer) cannot be seen,
  so a deferred verdict that differs raises no alarm: the graph's next call is checked at
  the call, and only that verdict counts;
- the inputs and copies stay referenced until the verdict, so no memory they use is handed
  to the program while the sentinel's stream still reads it;
- the copies are bounded: outputs and written inputs together at most ``COPY_SHARE`` of
  the device's memory, else the check is judged at the call as before.
``fallback`` never defers: the program's result depends on the verdict there.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, FrozenSet, Iterator, List, Optional

import torch

from rocm_autopatch.sentinel.runs import capturing, numerics

# The copies a deferred check holds (outputs, written inputs): at most this share of the
# device's memory; past it the check is judged at the call.
COPY_SHARE = 0.01


def copy_bytes(res: Any, flat: List[Any], mutated: FrozenSet[int]) -> int:
    """What the copies of a call's outputs and written inputs take."""
    values = [x for x in numerics.leaves(res) if isinstance(x, torch.Tensor)]
    values += [flat[i] for i in mutated if isinstance(flat[i], torch.Tensor)]
    return sum(x.numel() * x.element_size() for x in values)


class Later:
    """One deferred check's work on the device, launched after the compiled call."""

    def __init__(self, captured: Any, device: Any) -> None:
        self.captured = captured
        self.device = device
        self.stream = torch.cuda.current_stream(device)
        self.side = capturing.capture_stream(device)
        self.done = torch.cuda.Event()
        self.runs: Any = None
        self.outputs: List[Any] = []
        self.after: Dict[int, Any] = {}
        self.versions: List[Optional[int]] = []
        self.launch_seconds = 0.0  # host time the launch took, the compiled call left out

    def affordable(self, res: Any, flat: List[Any], mutated: FrozenSet[int]) -> bool:
        """Do the copies of ``res`` and the written inputs fit within ``COPY_SHARE``?"""
        room = torch.cuda.get_device_properties(self.device).total_memory
        return copy_bytes(res, flat, mutated) <= COPY_SHARE * room

    def launch(self, res: Any, flat: List[Any], pre: Any, mutated: FrozenSet[int]) -> None:
        """After the compiled call: copy what the program may change, replay the references
        on the sentinel's stream behind it."""
        began = time.perf_counter()
        self.outputs = [x.detach().clone() if isinstance(x, torch.Tensor) else x
                        for x in numerics.leaves(res)]
        self.after = {i: flat[i].detach().clone() for i in sorted(mutated)}
        self.captured.take(flat)  # ids, positions: copied before the program moves on
        ready = torch.cuda.Event()
        ready.record(self.stream)
        with capturing.STREAM_LOCK:
            self.side.wait_event(ready)
            with torch.cuda.stream(self.side):
                self.runs = self.captured.run(pre)
            self.done.record(self.side)
        self.versions = numerics.versions(flat)
        self.launch_seconds = time.perf_counter() - began

    def finished(self) -> bool:
        """Has the sentinel's stream passed this check's work (never waits)?"""
        return bool(self.done.query())

    def wait(self, seconds: float = 0.0) -> bool:
        """Wait for this check's work (at most ``seconds`` where given: at exit, a program
        whose stream is stuck must not hang there); was it done?"""
        if not seconds:
            self.done.synchronize()
            return True
        deadline = time.perf_counter() + seconds
        while not self.done.query():
            if time.perf_counter() > deadline:
                return False
            time.sleep(0.001)
        return True

    @contextlib.contextmanager
    def judging(self) -> Iterator[None]:
        """Where the judge runs: on the sentinel's stream, whose work is done (its reads of
        the statistics wait for nothing of the program's), no other thread's work beside."""
        with capturing.STREAM_LOCK, torch.cuda.stream(self.side):
            yield

    def release(self) -> None:
        """After the verdict: nothing of the sentinel's still reads what is let go now (the
        judge's last work; its own reads have waited for the rest)."""
        if self.done.query():
            self.side.synchronize()

    def overwritten(self, flat: List[Any]) -> List[int]:
        """Inputs the references read in place that the program wrote since the call (the
        written ones are read from the snapshot, the copied ones were copied at the call;
        an input that aliases a written one is read from the snapshot too)."""
        return sorted(i for i in numerics.changed(flat, self.versions)
                      if i in self.captured.read)
