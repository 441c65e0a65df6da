"""The command line (``rocm-autopatch``): ``main`` parses, ``doctor`` tells all, ``launcher``
is ``run``, ``selftest`` checks a GPU, ``installation`` finds what is installed where.
Nothing outside this package imports it."""
