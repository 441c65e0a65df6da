"""rocm-autopatch: makes torch.compile safe on ROCm, applied from an import hook.

This file is loaded at interpreter start (it is the parent of ``bootstrap``), so it stays
stdlib-only and tiny. ``report()`` loads the change record only when asked.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "report"]


def report() -> Any:
    """The record of what rocm-autopatch did in this process (see ``record.Report``)."""
    from rocm_autopatch import record

    return record.REPORT
