"""STAND-IN: the build strings of a ROCm torch."""

__version__ = "2.13.0+rocm7.0-standin"
hip = "7.0.51831"
cuda = None
