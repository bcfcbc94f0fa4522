"""Labels of stored configs (``eagle2.results.labels.variant_labels``): configs of one method and settings
that ran with different drafter weights (REST over a chat and a code datastore; any weighted method) get
different labels, naming the weights' fingerprint; results with one set of weights per method (or rows
from before rows carried ``weights``) keep the labels they had."""

from __future__ import annotations

import pandas as pd

from eagle2.results.labels import variant_labels

REST = {"name": "rest", "num_draft": 8}


def rows(*configs) -> pd.DataFrame:
    """Rows of (config_hash, method_config, weights or None for a row without the field)."""
    out = []
    for chash, settings, weights in configs:
        row = {"config_hash": chash, "method": settings["name"], "method_config": settings}
        if weights is not None:
            row["weights"] = weights
        out.append(row)
    return pd.DataFrame(out)


def test_two_datastores_get_two_labels():
    labels = variant_labels(rows(("a", REST, {"rest_datastore": "1a2b3c4d5e6f"}),
                                 ("b", REST, {"rest_datastore": "99887766aabb"}),
                                 ("p", {"name": "plain"}, {})))
    assert labels == {"a": "rest (rest_datastore 1a2b3c4d)", "b": "rest (rest_datastore 99887766)", "p": "plain"}


def test_any_weighted_method_and_settings_with_weights():
    medusa = {"name": "medusa", "choices": [[0], [1]]}
    labels = variant_labels(rows(("a", medusa, {"medusa_head": "aaaa0000ffff"}),
                                 ("b", {**medusa, "choices": [[0]]}, {"medusa_head": "bbbb0000ffff"})))
    assert labels == {"a": "medusa (choices=2 nodes, depth 1, medusa_head aaaa0000)",
                      "b": "medusa (choices=1 nodes, depth 1, medusa_head bbbb0000)"}


def test_single_weights_results_keep_their_labels():
    e2 = {"name": "eagle2", "total_tokens": 8, "depth": 3}
    same = {"head": "cafe0000"}
    for weights in (same, None):  # one set of weights per method, or rows written before the field
        labels = variant_labels(rows(("a", e2, weights), ("b", {**e2, "total_tokens": 16}, weights),
                                     ("r", REST, weights and {"rest_datastore": "1a2b3c4d"})))
        assert labels == {"a": "eagle2 (total_tokens=8)", "b": "eagle2 (total_tokens=16)", "r": "rest"}
