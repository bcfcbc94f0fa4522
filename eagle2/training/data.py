"""Corpus shards -> training data: sequences, the train/val split, token-budget batches, padded tensors.

A corpus (``corpus.py``) is a folder of ``shard_*.safetensors``; each holds concatenated sequences
(``tokens``, post-norm ``features``, ``offsets``, ``response_start``, optionally ``answer_mask`` for sequences
with several answers). A token corpus (``token_shards.py``: ``tokens_*.npz``) gives sequences without
features, which ``online.OnlineFeatures`` fills batch by batch. Batches are right-padded,
length-bucketed and in a fixed order per epoch drawn from the seed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import torch

from eagle2.training.corpus import read_shards


class Sequence(NamedTuple):
    tokens: torch.Tensor  # (n,) int
    features: torch.Tensor | None  # (n, H) post-norm hidden states, usually fp16; None: made online
    start: int  # index of the first answer token
    layer_features: torch.Tensor | None = None  # (n, k*H) inputs of the tapped layers (EAGLE-3), if recorded
    answer_mask: torch.Tensor | None = None  # (n,) bool answer tokens (several answers); None: from ``start`` on

    def is_answer(self) -> torch.Tensor:
        """(n,) bool: the answer tokens (``answer_mask``, or every position from ``start`` on)."""
        if self.answer_mask is not None:
            return self.answer_mask.bool()
        return torch.arange(len(self.tokens)) >= self.start


def shard_index(path: Path) -> int:
    match = re.search(r"(\d+)", path.stem)
    return int(match.group(1)) if match else 0


def split_shards(folder: str | Path, val_fraction: float, pattern: str = "shard_*.safetensors"
                 ) -> tuple[list[Path], list[Path]]:
    """(train, val) shard paths: every ``round(1/val_fraction)``-th shard index is held out.

    Shard indices follow prompt length, so this spreads the held-out prompts over all lengths. With
    too few shards for that rule the last shard is held out (if there are at least two).
    """
    paths = sorted(Path(folder).glob(pattern), key=shard_index)
    if not paths:
        raise FileNotFoundError(f"no corpus shards ({pattern}) in {folder}")
    if val_fraction <= 0 or len(paths) < 2:
        return paths, []
    k = max(2, round(1 / val_fraction))
    val = [p for p in paths if shard_index(p) % k == k - 1]
    if not val:
        val = [paths[-1]]
    return [p for p in paths if p not in val], val


def shard_sequences(shard: dict[str, torch.Tensor]) -> list[Sequence]:
    offsets = shard["offsets"].tolist()
    starts = shard["response_start"].tolist()
    layers, mask = shard.get("layer_features"), shard.get("answer_mask")
    return [Sequence(shard["tokens"][a:b].long(), shard["features"][a:b], int(s),
                     None if layers is None else layers[a:b], None if mask is None else mask[a:b].bool())
            for a, b, s in zip(offsets[:-1], offsets[1:], starts) if b - a >= 2]


def load_sequences(paths) -> list[Sequence]:
    from safetensors.torch import load_file

    seqs: list[Sequence] = []
    for path in paths:
        seqs.extend(shard_sequences(load_file(str(path))))
    return seqs


def token_sequences(paths) -> list[Sequence]:
    """Sequences of token shards (``tokens_*.npz``), without features: ``start`` is the first answer
    token, ``answer_mask`` marks every answer span."""
    from eagle2.training.token_shards import answer_mask, read_token_shard

    seqs = []
    for path in paths:
        for ids, spans in read_token_shard(path)[0]:
            if spans and len(ids) >= 2:
                seqs.append(Sequence(torch.tensor(ids, dtype=torch.int32), None, min(a for a, _ in spans), None,
                                     answer_mask(len(ids), spans).bool()))
    return seqs


def is_token_corpus(folder: str | Path) -> bool:
    """Whether ``folder`` holds token shards and no feature shards (train it with online features)."""
    folder = Path(folder)
    return any(folder.glob("tokens_*.npz")) and not any(folder.glob("shard_*.safetensors"))


def all_sequences(folder: str | Path) -> list[Sequence]:
    return [s for shard in read_shards(folder) for s in shard_sequences(shard)]


def train_val_sequences(corpus_dir: str | Path, val_fraction: float, max_train_sequences: int | None = None
                        ) -> tuple[list[Sequence], list[Sequence], dict[str, list[str]]]:
    """(train, val) sequences of a corpus, and the shard names each came from (``{"train": [...],
    "held_out": [...]}``, as read now: a corpus may grow later); ``max_train_sequences`` keeps that many
    train sequences."""
    tokens_only = is_token_corpus(corpus_dir)
    load = token_sequences if tokens_only else load_sequences
    train_paths, val_paths = split_shards(corpus_dir, val_fraction, "tokens_*.npz" if tokens_only else
                                          "shard_*.safetensors")
    shards = {"train": [p.name for p in train_paths], "held_out": [p.name for p in val_paths]}
    return evenly_spaced(load(train_paths), max_train_sequences), load(val_paths), shards


def evenly_spaced(seqs: list, count: int | None) -> list:
    """``count`` of ``seqs``, evenly spaced (all of them when ``count`` is None/0 or not smaller): shards
    follow prompt length, so a prefix would keep only the short prompts (of one kind, in a mixed corpus)."""
    if not count or int(count) >= len(seqs):
        return seqs
    keep = torch.linspace(0, len(seqs) - 1, int(count)).round().long().unique()
    return [seqs[i] for i in keep.tolist()]


def make_batches(lengths: list[int], token_budget: int, max_batch: int, seed: int, epoch: int,
                 window: int = 512) -> list[list[int]]:
    """Shuffled batches of sequence indices with ``len(batch) * longest <= token_budget``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    batches: list[list[int]] = []
    for w in range(0, len(order), window):  # sort inside windows: little padding, still random
        current: list[int] = []
        longest = 0
        for i in sorted(order[w:w + window], key=lambda i: lengths[i]):
            grown = max(longest, lengths[i])
            if current and (grown * (len(current) + 1) > token_budget or len(current) >= max_batch):
                batches.append(current)
                current, grown = [], lengths[i]
            current.append(i)
            longest = grown
        if current:
            batches.append(current)
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]


def _padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width, rows[0].shape[-1]), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r.float()
    return out


def collate(seqs: list[Sequence], device) -> dict[str, torch.Tensor]:
    """Right-padded batch: tokens (B, L), features (B, L, H) fp32 (when every sequence has them; else
    ``online.OnlineFeatures`` adds them), valid (B, L), start (B,),
    layer_features (B, L, k*H) fp32 when every sequence has them, and ``answer`` (B, L) bool when some
    sequence has an ``answer_mask`` (the answer tokens; padding repeats the row's last value, so the
    positions it selects equal the ``start`` rule's for sequences without a mask)."""
    width = max(len(s.tokens) for s in seqs)
    tokens = torch.zeros((len(seqs), width), dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, s in enumerate(seqs):
        tokens[row, : len(s.tokens)] = s.tokens
        valid[row, : len(s.tokens)] = True
    start = torch.tensor([s.start for s in seqs], dtype=torch.long)
    batch = {"tokens": tokens.to(device), "valid": valid.to(device), "start": start.to(device)}
    if all(s.features is not None for s in seqs):  # else ``online.OnlineFeatures`` adds them
        batch["features"] = _padded([s.features for s in seqs], width).to(device)
    if any(s.answer_mask is not None for s in seqs):
        answer = torch.zeros((len(seqs), width), dtype=torch.bool)
        for row, s in enumerate(seqs):
            mask = s.is_answer()
            answer[row, : len(mask)] = mask
            answer[row, len(mask):] = mask[-1]
        batch["answer"] = answer.to(device)
    if all(s.layer_features is not None for s in seqs):
        batch["layer_features"] = _padded([s.layer_features for s in seqs], width).to(device)
    return batch
