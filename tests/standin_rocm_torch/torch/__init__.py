"""STAND-IN for a ROCm torch build (see ../README.md). Not torch."""

from torch import version  # noqa: F401  - what the platform probe reads

__version__ = "2.13.0+rocm7.0-standin"
RECEIVED = []


def compile(model=None, **kwargs):  # noqa: A001 - mirrors torch.compile's name
    RECEIVED.append({k: v for k, v in kwargs.items() if k in ("mode", "options")})
    return model
