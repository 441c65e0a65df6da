"""The numerics sentinel (``ROCM_AUTOPATCH_VERIFY``): compiled graphs compared with eager
against a float64 reference. ``hook`` owns ``compile_fx`` and decides when to check,
``numerics`` runs and judges, ``status`` holds the verdicts' names (read by the job view
without loading the rest). Nothing here is imported while the sentinel is off."""
