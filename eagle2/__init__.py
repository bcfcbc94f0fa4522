"""eagle2: speculative decoding on one footing, in layers that import only the layers below them.

- ``eagle2.registry``: ``conf/`` read as the registry of methods and benchmarks (YAML only);
- ``eagle2.core``: the lossless round (engine, tree, acceptance, sampling, KV cache, feature taps);
- ``eagle2.heads``: drafter weight formats, each declaring its drafter family (``eagle2.heads.family``);
- ``eagle2.drafters``: the drafters that turn a context into a ``DraftTree``, and their helpers;
- ``eagle2.results``: the results store, row schema, throughput and rows as frames (no torch);
- ``eagle2.prompts``: chat templates and benchmark questions;
- ``eagle2.bench``: the benchmark harness (runner, drafter building, models, identity audit);
- ``eagle2.training``: training the heads and the SpS draft (imports no harness module).

``tests/test_layering.py`` checks the layering and that no import cycle exists.
"""

import os as _os
import sys as _sys
from pathlib import Path as _Path


def _bundled_site() -> None:
    """A bare GPU node: the pure-Python wheels its image lacks (omegaconf, hydra-core, antlr4), installed by
    ``make gpu-env`` (or ``make gpu-check``) into ``.gpu_site`` beside this package, are importable by
    ``run.py``, ``python -m analysis.report`` and ``python -m eagle2.identity``. Appended last: a copy the
    Python has itself always wins. ``EAGLE2_GPU_SITE`` names another folder."""
    site = _Path(_os.environ.get("EAGLE2_GPU_SITE") or _Path(__file__).resolve().parent.parent / ".gpu_site")
    if site.is_dir() and str(site) not in _sys.path:
        _sys.path.append(str(site))


_bundled_site()
