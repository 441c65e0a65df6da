"""rocm-autopatch: makes torch.compile safe on ROCm, applied from an import hook.

Nothing here runs at interpreter start (that is ``_rocm_autopatch_start``, beside the
package); the package loads when the program first imports torch. ``report()`` loads the
change record only when asked.
"""

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~10 ms at start-up
if TYPE_CHECKING:
    from rocm_autopatch.record import Report

__version__ = "0.1.0"
__all__ = ["__version__", "report"]


def report() -> "Report":
    """The record of what rocm-autopatch did in this process (see ``record.Report``)."""
    from rocm_autopatch import record

    return record.REPORT
