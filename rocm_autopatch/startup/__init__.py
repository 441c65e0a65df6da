"""Start-up: from the trigger's first ``import torch`` to the hooks on torch's modules.

``bootstrap`` reads ``ROCM_AUTOPATCH`` and activates; ``post_import`` is the post-import
finder; ``wiring`` is what runs as each torch module finishes importing. Stdlib only at
module level, except ``wiring``, which loads only the core modules it needs to decide.
"""
