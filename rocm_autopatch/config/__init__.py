"""Configuration: the environment we read (``settings``, its one reader), the profiles as
data (``profiles``), ``INDUCTOR_<KEY>`` overrides (``overrides``), writing them into torch's
config (``applier``) and where the compile caches live (``caches``)."""
