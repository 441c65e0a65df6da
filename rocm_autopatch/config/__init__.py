"""Configuration: the profiles as data (``profiles``), ``INDUCTOR_<KEY>`` overrides
(``overrides``), writing them into torch's config (``applier``), where the compile caches
live (``caches``), TunableOp under ``perf`` (``tunableop``), coordinate descent's results
reused on a warm start (``coordesc_reuse``) and each graph compiled once by a job's ranks
(``compile_once``). The environment itself is read in ``rocm_autopatch.settings``."""
