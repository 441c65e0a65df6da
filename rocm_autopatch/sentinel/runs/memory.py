"""Device memory as a check sees it: what is free, waiting for queued work, giving cached
blocks back. A check decides from free memory before it copies anything; after one that ran
out, the program must find the memory it had."""

from __future__ import annotations

from typing import Any, Optional

# A check's extra memory (the float64 reference of the outputs and what torch's criterion
# allocates to compare them; for the backward, float64 copies of the differentiable inputs
# and the gradients) must fit in this share of the device's free memory.
SHARE = 0.5


def first_line(exc: BaseException) -> str:
    """An exception's first line, short: what a skipped check says of its cause."""
    return (str(exc).strip().splitlines() or [""])[0][:160]


def out_of_memory(exc: BaseException) -> bool:
    """Did ``exc`` come from an allocation that failed (a device's ``OutOfMemoryError``, the
    CPU allocator's "can't allocate memory")?"""
    return type(exc).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(exc)


def release() -> None:
    """After a check that failed for memory: give the cached blocks back (torch keeps freed
    blocks in its caching allocator)."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def sync(device: Any) -> None:
    """Wait for ``device``'s queued work (a check times the compiled call alone)."""
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def free_bytes(device: Any) -> Optional[int]:
    """Free memory where ``device``'s tensors live; None when it cannot be read."""
    try:
        if device.type == "cuda":
            import torch

            return int(torch.cuda.mem_get_info(device)[0])
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except Exception:  # noqa: BLE001
        return None
    return None
