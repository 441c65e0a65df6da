"""What following a decode loop's integer input at every call would cost on a GPU, without a
synchronisation (issue 43, item 2: a crossing that cannot fall between two reads).

    python benchmarks/integer_follow_cost.py [--calls 20000]

A stand-in for ``cache_position`` (one int64 on the GPU, advanced by one each call, as
transformers' static-cache ``generate`` does) is followed three ways, each timed on the host
per call over ``--calls`` calls, the GPU otherwise idle:
  copy     - a non-blocking copy into a pinned host slot and an event recorded behind it,
             the oldest slot read when its event has completed (a ring of 4);
  amax     - the same after a reduction (an input of more than one element: a prefill's
             positions);
  reader   - the package's own reader (``sentinel/scheduling/integers.py``, issue 43 item
             2, built after this benchmark's first run): the position and a token id, as a
             decode step's inputs, copied together each call;
  baseline - the advance alone (what the program does anyway).
Prints the microseconds per call of each and one JSON line. Needs a CUDA/HIP device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SLOTS = 4


def follow(calls: int, reduce: bool) -> dict:
    pos = torch.zeros(1 if not reduce else 512, dtype=torch.int64, device="cuda")
    hosts = [torch.empty(1, dtype=torch.int64, pin_memory=True) for _ in range(SLOTS)]
    events = [torch.cuda.Event() for _ in range(SLOTS)]
    pending = [False] * SLOTS
    seen = late = 0
    times = []
    for n in range(calls):
        began = time.perf_counter()
        pos += 1  # the program's own advance
        slot = n % SLOTS
        if pending[slot]:
            if events[slot].query():
                seen = max(seen, int(hosts[slot][0]))
            else:
                late += 1  # still in flight: this call's value is not copied
                times.append(time.perf_counter() - began)
                continue
        src = pos.amax().reshape(1) if reduce else pos
        hosts[slot].copy_(src, non_blocking=True)
        events[slot].record()
        pending[slot] = True
        times.append(time.perf_counter() - began)
    torch.cuda.synchronize()
    return {"us_per_call": round(1e6 * statistics.median(times), 2),
            "us_mean": round(1e6 * statistics.fmean(times), 2),
            "last_read": seen, "calls": calls, "slots_still_in_flight": late}


def reader(calls: int) -> dict:
    from rocm_autopatch.sentinel.scheduling import integers

    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    ids = torch.zeros((1, 1), dtype=torch.int64, device="cuda")
    follower = integers.followed([pos, ids], [0, 1])
    times, seen, stale = [], 0, 0
    for n in range(1, calls + 1):
        began = time.perf_counter()
        pos += 1  # the program's own advance
        at, values = follower.follow([pos, ids], n)
        times.append(time.perf_counter() - began)
        if values:
            seen = max(seen, at)
            stale = max(stale, n - at)
    torch.cuda.synchronize()
    return {"us_per_call": round(1e6 * statistics.median(times), 2),
            "us_mean": round(1e6 * statistics.fmean(times), 2), "last_read": seen,
            "calls": calls, "oldest_read_calls": stale}


def baseline(calls: int) -> dict:
    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        pos += 1
        times.append(time.perf_counter() - began)
    torch.cuda.synchronize()
    return {"us_per_call": round(1e6 * statistics.median(times), 2),
            "us_mean": round(1e6 * statistics.fmean(times), 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    follow(1000, False)  # warm: pinned memory, events, kernels
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"),
           "baseline": baseline(args.calls), "copy": follow(args.calls, False),
           "amax": follow(args.calls, True), "reader": reader(args.calls)}
    for arm in ("baseline", "copy", "amax", "reader"):
        print(f"{arm:<9} {out[arm]['us_per_call']:7.2f} us/call (mean {out[arm]['us_mean']})")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
