"""``python -m experiments.ops.gpu_check``: the orchestrator (``experiments.ops.gpu_check.check``)."""

import sys

from experiments.ops.gpu_check.check import main

sys.exit(main())
