"""``python -m rocm_autopatch doctor``."""

import sys

from rocm_autopatch.cli import main

sys.exit(main())
