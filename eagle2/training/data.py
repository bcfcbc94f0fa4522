"""Corpus shards -> training data: sequences, the train/val split, token-budget batches, padded tensors.

A corpus is a folder of feature shards (``shard_*.safetensors``, ``shards.py``: concatenated sequences with
their post-norm ``features``) or of token shards (``tokens_*.npz``), whose sequences come without features,
which ``features.OnlineFeatures`` fills batch by batch. Batches are right-padded,
length-bucketed and in a fixed order per epoch drawn from the seed.

Two ways to hold the training shards: all in memory (the default), or streamed (``resident_shards = k``:
``ShardedSequences`` reads a shard when a batch needs it and keeps at most ``k``; an epoch then visits the
shards in a seeded random order, ``k`` at a time, its batches drawn within those ``k``
(``shard_local_batches``), so memory is bounded by ``k`` shards whatever the corpus size).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import torch

from eagle2.training.shards import iter_shards, read_shards


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
    from eagle2.training.shards import answer_mask, read_token_shard

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


def train_val_sequences(corpus_dir: str | Path, val_fraction: float, max_train_sequences: int | None = None,
                        resident_shards: int | None = None
                        ) -> tuple[list[Sequence], list[Sequence], dict[str, list[str]]]:
    """(train, val) sequences of a corpus, and the shard names each came from (``{"train": [...],
    "held_out": [...]}``, as read now: a corpus may grow later); ``max_train_sequences`` keeps that many
    train sequences. ``resident_shards``: stream the train feature shards (``ShardedSequences``, at most that
    many in memory) instead of loading them all; the held-out shards, and a token corpus (small: ids only),
    are loaded either way."""
    tokens_only = is_token_corpus(corpus_dir)
    load = token_sequences if tokens_only else load_sequences
    train_paths, val_paths = split_shards(corpus_dir, val_fraction, "tokens_*.npz" if tokens_only else
                                          "shard_*.safetensors")
    shards = {"train": [p.name for p in train_paths], "held_out": [p.name for p in val_paths]}
    streamed = resident_shards and not tokens_only
    train = ShardedSequences(train_paths, int(resident_shards)) if streamed else load(train_paths)
    return evenly_spaced(train, max_train_sequences), load(val_paths), shards


def evenly_spaced(seqs, count: int | None):
    """``count`` of ``seqs``, evenly spaced (all of them when ``count`` is None/0 or not smaller): shards
    follow prompt length, so a prefix would keep only the short prompts (of one kind, in a mixed corpus).
    A ``ShardedSequences`` stays one (nothing is read)."""
    if not count or int(count) >= len(seqs):
        return seqs
    keep = torch.linspace(0, len(seqs) - 1, int(count)).round().long().unique().tolist()
    return seqs.select(keep) if isinstance(seqs, ShardedSequences) else [seqs[i] for i in keep]


class ShardedSequences:
    """The sequences of some feature shards, read as they are asked for: ``seqs[i]`` loads the shard that
    holds sequence ``i`` unless it is one of the ``resident`` most recently used, which stay in memory.
    Only each shard's ``offsets`` are read up front (``lengths``, ``shard_of``)."""

    def __init__(self, paths, resident: int = 2, index: list[tuple[int, int, int]] | None = None):
        from safetensors import safe_open

        self.paths, self.resident = [Path(p) for p in paths], max(1, int(resident))
        if index is None:
            index = []  # (shard, position among the shard's sequences, length), as ``shard_sequences`` keeps them
            for k, path in enumerate(self.paths):
                with safe_open(str(path), framework="pt") as f:
                    offsets = f.get_tensor("offsets").tolist()
                kept = [b - a for a, b in zip(offsets[:-1], offsets[1:]) if b - a >= 2]
                index.extend((k, j, n) for j, n in enumerate(kept))
        self.index = index
        self.lengths = [n for _, _, n in index]
        self.shard_of = [k for k, _, _ in index]
        self._cache: OrderedDict[int, list[Sequence]] = OrderedDict()
        self.loads = 0  # shards read so far (a measure of the streaming's cost)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Sequence:
        k, j, _ = self.index[i]
        return self._shard(k)[j]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def select(self, keep: list[int]) -> ShardedSequences:
        """The sequences ``keep`` (indices), still streamed."""
        return ShardedSequences(self.paths, self.resident, [self.index[i] for i in keep])

    def _shard(self, k: int) -> list[Sequence]:
        if k in self._cache:
            self._cache.move_to_end(k)
            return self._cache[k]
        from safetensors.torch import load_file

        while len(self._cache) >= self.resident:
            self._cache.popitem(last=False)
        self._cache[k] = shard_sequences(load_file(str(self.paths[k])))
        self.loads += 1
        return self._cache[k]


def sequence_lengths(seqs) -> list[int]:
    """The token count of every sequence (a ``ShardedSequences`` knows them without reading a shard)."""
    return list(seqs.lengths) if isinstance(seqs, ShardedSequences) else [len(s.tokens) for s in seqs]


def epoch_batches(seqs, lengths: list[int], cfg, epoch: int) -> list[list[int]]:
    """The batches of one epoch for the training settings ``cfg``: ``make_batches`` over every sequence,
    or, for streamed shards, ``shard_local_batches`` (``resident`` shards at a time)."""
    if isinstance(seqs, ShardedSequences):
        return shard_local_batches(seqs.shard_of, lengths, cfg.token_budget, cfg.max_batch, cfg.seed, epoch,
                                   seqs.resident)
    return make_batches(lengths, cfg.token_budget, cfg.max_batch, cfg.seed, epoch)


def shard_local_batches(shard_of: list[int], lengths: list[int], token_budget: int, max_batch: int, seed: int,
                        epoch: int, resident: int) -> list[list[int]]:
    """An epoch's batches that need at most ``resident`` shards in memory at a time: the shards in a seeded
    random order, taken ``resident`` at a time; within each such group, ``make_batches`` over its sequences
    (shuffled, length-bucketed). Every sequence once per epoch, as ``make_batches``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    shards = sorted(set(shard_of))
    order = [shards[i] for i in torch.randperm(len(shards), generator=g).tolist()]
    members: dict[int, list[int]] = {}
    for i, k in enumerate(shard_of):
        members.setdefault(k, []).append(i)
    batches: list[list[int]] = []
    for n, start in enumerate(range(0, len(order), resident)):
        group = [i for k in order[start:start + resident] for i in members[k]]
        local = make_batches([lengths[i] for i in group], token_budget, max_batch, seed, epoch * 1_000_003 + n + 1)
        batches.extend([group[j] for j in b] for b in local)
    return batches


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
    ``features.OnlineFeatures`` adds them), valid (B, L), start (B,),
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
    if all(s.features is not None for s in seqs):  # else ``features.OnlineFeatures`` adds them
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


def tokens_by_frequency(folder: str | Path, limit: int = 32768) -> torch.Tensor:
    """Token ids that occur in the corpus answers, most frequent first (at most ``limit``): the
    reduced draft vocabulary shipped with a head."""
    counts = answer_token_counts(folder)
    order = torch.argsort(counts, descending=True, stable=True)
    return order[: min(limit, int((counts > 0).sum()))]


def answer_token_counts(folder: str | Path) -> torch.Tensor:
    """How often each token id occurs in the corpus answers (``answer_mask`` honoured), indexed by id up
    to the largest one seen; a token corpus (``tokens_*.npz`` only) counts its answer spans."""
    if is_token_corpus(folder):
        from eagle2.training.shards import read_token_shard, token_shard_paths

        answers = [torch.tensor(ids[a:b]) for p in token_shard_paths(folder) for ids, spans in read_token_shard(p)[0]
                   for a, b in spans]
        return torch.bincount(torch.cat(answers).long(), minlength=1)
    counts = None
    for shard in iter_shards(folder):  # one shard in memory at a time
        tokens, offsets, starts = shard["tokens"].long(), shard["offsets"], shard["response_start"]
        mask = shard.get("answer_mask")
        for row in range(len(starts)):
            answer = tokens[offsets[row] + starts[row]: offsets[row + 1]]
            if mask is not None:
                answer = answer[mask[offsets[row] + starts[row]: offsets[row + 1]].bool()]
            c = torch.bincount(answer, minlength=1)
            counts = c if counts is None else add_padded(counts, c)
    if counts is None:
        raise FileNotFoundError(f"no corpus shards in {folder}")
    return counts


def add_padded(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if len(a) < len(b):
        a, b = b, a
    a = a.clone()
    a[: len(b)] += b
    return a
