"""eagle2: speculative decoding on one footing, in layers that import only the layers below them.

- ``eagle2.core``: the lossless round (engine, tree, acceptance, sampling, KV cache, feature taps);
- ``eagle2.heads``: drafter weight formats and loaders (EAGLE-1/2, EAGLE-3, Medusa, SpS draft);
- ``eagle2.drafters``: the drafters that turn a context into a ``DraftTree``, and their helpers;
- ``eagle2.results``: the results store, row schema, throughput and rows as frames (no torch);
- ``eagle2.prompts``: chat templates and benchmark questions;
- ``eagle2.bench``: the benchmark harness (runner, method registry, models, identity audit);
- ``eagle2.training``: training the heads and the SpS draft (imports no harness module).

``tests/test_layering.py`` checks the layering and that no import cycle exists.
"""
