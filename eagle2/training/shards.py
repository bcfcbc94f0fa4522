"""The corpus formats on disk, and the dedup rule every corpus source applies. Knows nothing of models.

**Feature shards** ``shard_NNNNN.safetensors`` (what an offline head trains on), written atomically:
``tokens`` (N,) int32, ``features`` (N, H) fp16 (the target's post-norm hidden states, what its LM head
multiplies), ``offsets`` (B+1,) int64 sequence boundaries, ``response_start`` (B,) int64 the first answer
token of each sequence; with taps ``layer_features`` (N, k*H) fp16 (the k tapped layers' inputs, concatenated
in layer order) and ``tap_layers`` (k,) int64; optional ``answer_mask`` (N,) uint8 (1 at answer tokens) for
sequences with several answers (without it the answer is ``[response_start, n)``).

**Token shards** ``tokens_NNNNN.npz`` (a corpus as token ids only, small enough to commit; numpy
``savez_compressed``, no pickles), written atomically: ``tokens`` (N,) uint16 (int32 when an id is >= 65536)
all sequences concatenated, ``offsets`` (B+1,) int64, ``spans`` (S, 2) int32 ``[start, end)`` answer spans
relative to their sequence's start, ``span_offsets`` (B+1,) int64 (sequence b's spans are
``spans[span_offsets[b]:span_offsets[b+1]]``), and ``meta``, a JSON string (whatever the writer records). About
2 bytes per token before compression. ``features.tokens_to_features`` turns them into feature shards.

**Dedup** (``Dedup``): a text is dropped when it shares any word n-gram (8 by default; words = lower-case
``[a-z0-9]+`` runs; a text shorter than n words: its whole normalised text) with any turn of the six benchmark
sets, or when at least half of its n-grams were already seen (near-duplicates among the kept texts).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from eagle2.prompts.sharegpt_export import ngram_keys, words  # noqa: F401 (words: read from here by corpora)

Conversation = tuple[list[int], list[tuple[int, int]]]  # (token ids, answer spans [start, end))


def write_token_shard(path: str | Path, conversations: list[Conversation], meta: dict | None = None) -> Path:
    """Write ``conversations`` (token ids, answer spans) as one compressed token shard, atomically."""
    path = Path(path)
    ids = [t for seq, _ in conversations for t in seq]
    big = max(ids, default=0) >= 2 ** 16
    for seq, spans in conversations:
        if any(not 0 <= a < b <= len(seq) for a, b in spans):
            raise ValueError(f"answer spans {spans} do not fit a sequence of {len(seq)} tokens")
    arrays = {
        "tokens": np.asarray(ids, dtype=np.int32 if big else np.uint16),
        "offsets": np.cumsum([0] + [len(seq) for seq, _ in conversations], dtype=np.int64),
        "spans": np.asarray([s for _, spans in conversations for s in spans], dtype=np.int32).reshape(-1, 2),
        "span_offsets": np.cumsum([0] + [len(spans) for _, spans in conversations], dtype=np.int64),
        "meta": np.asarray(json.dumps(meta or {})),
    }
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    tmp = path.with_suffix(".partial")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, path)
    return path


def read_token_shard(path: str | Path) -> tuple[list[Conversation], dict]:
    """(conversations, meta) of one token shard."""
    with np.load(str(path), allow_pickle=False) as z:
        tokens, offsets = z["tokens"].astype(np.int64), z["offsets"]
        spans, span_offsets = z["spans"], z["span_offsets"]
        meta = json.loads(str(z["meta"]))
    convs = [(tokens[a:b].tolist(), [tuple(int(x) for x in s) for s in spans[c:d]])
             for a, b, c, d in zip(offsets[:-1], offsets[1:], span_offsets[:-1], span_offsets[1:])]
    return convs, meta


def token_shard_paths(folder: str | Path) -> list[Path]:
    return sorted(Path(folder).glob("tokens_*.npz"))


def answer_mask(length: int, spans) -> torch.Tensor:
    """(length,) uint8: 1 at the tokens of the answer spans."""
    mask = torch.zeros(length, dtype=torch.uint8)
    for a, b in spans:
        mask[a:b] = 1
    return mask


def write_shard(path: Path, rows, hidden_size: int, tap_layers: tuple[int, ...] = ()) -> None:
    """Write rows of (token ids, features (n, H or H + k*H), response_start) as one feature shard; rows may
    carry a fourth item, an (n,) 0/1 ``answer_mask`` (several answer spans per sequence)."""
    tokens = torch.tensor([t for r in rows for t in r[0]], dtype=torch.int32)
    features = torch.cat([r[1] for r in rows]).to(torch.float16)
    lengths = torch.tensor([len(r[0]) for r in rows])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    starts = torch.tensor([r[2] for r in rows], dtype=torch.long)
    tensors = {"tokens": tokens, "features": features[:, :hidden_size].contiguous(), "offsets": offsets,
               "response_start": starts}
    if any(len(r) > 3 for r in rows):
        tensors["answer_mask"] = torch.cat([r[3].to(torch.uint8) if len(r) > 3 else
                                            (torch.arange(len(r[0])) >= r[2]).to(torch.uint8) for r in rows])
    if tap_layers:
        tensors["layer_features"] = features[:, hidden_size:].contiguous()
        tensors["tap_layers"] = torch.tensor(tap_layers, dtype=torch.long)
    tmp = Path(path).with_suffix(".partial")
    save_file(tensors, str(tmp))
    tmp.rename(path)


def read_shards(folder: str | Path) -> list[dict[str, torch.Tensor]]:
    return list(iter_shards(folder))


def iter_shards(folder: str | Path):
    """The feature shards of ``folder`` one at a time (one in memory at once, unlike ``read_shards``)."""
    for p in sorted(Path(folder).glob("shard_*.safetensors")):
        yield load_file(str(p))


def check_existing_taps(folder: Path, tap_layers: tuple[int, ...]) -> None:
    """A feature corpus is resumed only with the layer taps its shards were written with."""
    from safetensors import safe_open

    existing = next(iter(sorted(Path(folder).glob("shard_*.safetensors"))), None)
    if existing is None:
        return
    with safe_open(str(existing), framework="pt") as f:
        had = tuple(f.get_tensor("tap_layers").tolist()) if "tap_layers" in f.keys() else ()
    if had != tap_layers:
        raise ValueError(f"{folder} was written with tap_layers={list(had)}, not {list(tap_layers)}: use another "
                         "out_dir (or delete it to rebuild)")


class Dedup:
    """Keeps benchmark questions and near-duplicates out: ``reason(text)`` is None or why it is dropped."""

    def __init__(self, held_out: set[str], n: int = 8, near: float = 0.5):
        self.n, self.near = n, near
        self.held_out = set().union(*(ngram_keys(q, n) for q in held_out)) if held_out else set()
        self.seen: set[str] = set()

    def reason(self, text: str, allowed: set[str] = frozenset()) -> str | None:
        keys = ngram_keys(text, self.n)
        if keys & self.held_out:
            return "benchmark"
        if keys and len((keys & self.seen) - allowed) >= self.near * len(keys):
            return "duplicate"
        return None

    def add(self, text: str) -> set[str]:
        keys = ngram_keys(text, self.n)
        self.seen |= keys
        return keys
