"""``stage=features``: the feature shards of a token corpus (``train.conversations.features``: by default the
two-turn conversations' token shards), one teacher-forced target forward per batch (``features.py``), resumable."""

from __future__ import annotations

from pathlib import Path

from eagle2.training.corpora import CorpusSource
from eagle2.training.features import corpus_tap_layers, tokens_to_features


def build(target, tokenizer, c, root: Path) -> Path:
    """The feature shards of the token shards at ``c.source`` into ``c.out_dir``."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return tokens_to_features(target, root / c.source, root / c.out_dir, pad_id=pad_id,
                              tap_layers=corpus_tap_layers(target, c.get("tap_layers")), token_budget=c.token_budget,
                              max_shards=c.max_shards)


SOURCE = CorpusSource("features", "feature shards of a token corpus", build, section="conversations.features",
                      needs="conversations")
