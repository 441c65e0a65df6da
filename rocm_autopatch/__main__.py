"""``python -m rocm_autopatch doctor``."""

import sys

from rocm_autopatch.cli.main import main

sys.exit(main())
