"""``python -m experiments.gpu_check``: the orchestrator (``experiments.gpu_check.check``)."""

import sys

from experiments.gpu_check.check import main

sys.exit(main())
