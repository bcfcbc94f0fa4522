"""Token shards: a corpus as token ids only (small enough to commit), and their rebuild into feature shards.

The expensive part of a self-distillation corpus is decoding; the target's features of a known token
sequence are one teacher-forced forward. So a corpus can be kept as its tokens and the answer spans
(which positions are the assistant's answers: training counts only those), and turned back into the
feature shards of ``corpus.py`` (``tokens_to_features``) in seconds per shard, shard by shard, resumable.

Token shard ``tokens_NNNNN.npz`` (numpy ``savez_compressed``, no pickles), written atomically:
``tokens`` (N,) uint16 (int32 when an id is >= 65536) all sequences concatenated, ``offsets`` (B+1,)
int64 sequence boundaries, ``spans`` (S, 2) int32 ``[start, end)`` answer spans relative to their
sequence's start, ``span_offsets`` (B+1,) int64 (sequence b's spans are ``spans[span_offsets[b]:
span_offsets[b+1]]``), and ``meta``, a JSON string (whatever the writer records: user turns, categories,
counts of dropped turns). About 2 bytes per token before compression.

A feature shard rebuilt from a sequence with one span ``[start, n)`` is the old format exactly
(``response_start``); sequences with other spans (two-turn conversations) add ``answer_mask`` (N,) uint8,
1 at answer tokens, which ``data.shard_sequences`` reads and ``data.collate`` turns into the counted
positions. Knows nothing of how the tokens were made.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from eagle2.core.features import LayerTap
from eagle2.training.corpus import _check_existing_taps, read_shards, teacher_forced_batch, write_shard

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


def features_to_tokens(feature_dir: str | Path, token_dir: str | Path) -> list[Path]:
    """Token shards of an existing feature corpus (each sequence's answer: its ``answer_mask`` spans, or
    ``[response_start, n)``), one per feature shard, same index: a decoded corpus kept as tokens."""
    out = Path(token_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(Path(feature_dir).glob("shard_*.safetensors")):
        from safetensors.torch import load_file

        shard = load_file(str(path))
        offsets, starts = shard["offsets"].tolist(), shard["response_start"].tolist()
        mask = shard.get("answer_mask")
        convs = []
        for a, b, s in zip(offsets[:-1], offsets[1:], starts):
            ids = shard["tokens"][a:b].tolist()
            convs.append((ids, [(s, b - a)] if mask is None else mask_spans(mask[a:b])))
        written.append(write_token_shard(out / path.name.replace("shard_", "tokens_").replace(
            ".safetensors", ".npz"), convs, {"from": str(path)}))
    return written


def mask_spans(mask: torch.Tensor) -> list[tuple[int, int]]:
    """The ``[start, end)`` runs of ones of a 0/1 mask."""
    m = torch.cat([torch.zeros(1, dtype=torch.int8), mask.to(torch.int8), torch.zeros(1, dtype=torch.int8)])
    edges = torch.nonzero(m[1:] - m[:-1]).flatten().tolist()
    return [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2)]


def _budget_batches(convs: list[Conversation], token_budget: int) -> list[list[int]]:
    """Indices of ``convs`` in forwards of at most ``token_budget`` padded tokens, similar lengths together."""
    order = sorted(range(len(convs)), key=lambda i: len(convs[i][0]))
    batches, current = [], []
    for i in order:
        if current and len(convs[i][0]) * (len(current) + 1) > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


def tokens_to_features(model, token_dir: str | Path, out_dir: str | Path, *, pad_id: int,
                       tap_layers=(), token_budget: int = 8192, max_shards: int | None = None) -> Path:
    """Rebuild feature shards (``corpus.write_shard``'s format) from token shards: ``tokens_NNNNN.npz`` ->
    ``shard_NNNNN.safetensors``, one teacher-forced forward per ``token_budget`` padded tokens; shards
    already written are skipped (resumable). ``response_start`` is each sequence's first answer token;
    ``answer_mask`` is added when some sequence's answers are not exactly ``[response_start, n)``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tap_layers = tuple(int(i) for i in tap_layers or ())
    _check_existing_taps(out, tap_layers)
    paths = token_shard_paths(token_dir)[:max_shards]
    if not paths:
        raise FileNotFoundError(f"no token shards (tokens_*.npz) in {token_dir}")
    with contextlib.ExitStack() as stack:
        tap = stack.enter_context(LayerTap(model, tap_layers)) if tap_layers else None
        for path in tqdm(paths, desc="features of token shards"):
            target = out / path.name.replace("tokens_", "shard_").replace(".npz", ".safetensors")
            if target.exists():
                continue
            convs, _ = read_token_shard(path)
            convs = [c for c in convs if c[1]]  # a sequence without an answer teaches nothing
            rows = [None] * len(convs)
            for idx in _budget_batches(convs, token_budget):
                seqs = [convs[i][0] for i in idx]
                starts = [min(a for a, _ in convs[i][1]) for i in idx]
                for i, (ids, feats, start) in zip(idx, teacher_forced_batch(model, seqs, starts, pad_id, tap)):
                    rows[i] = (ids, feats.cpu(), start, answer_mask(len(ids), convs[i][1]))
            plain = all(r[3][r[2]:].all() and not r[3][:r[2]].any() for r in rows)
            write_shard(target, [r[:3] for r in rows] if plain else rows, model.config.hidden_size, tap_layers)
    return out


def corpus_token_count(folder: str | Path) -> dict[str, int]:
    """``{"sequences", "tokens", "answer_tokens"}`` of a token-shard folder (or a feature-shard folder)."""
    seqs = tokens = answers = 0
    if token_shard_paths(folder):
        for path in token_shard_paths(folder):
            convs, _ = read_token_shard(path)
            seqs += len(convs)
            tokens += sum(len(ids) for ids, _ in convs)
            answers += sum(b - a for _, spans in convs for a, b in spans)
        return {"sequences": seqs, "tokens": tokens, "answer_tokens": answers}
    for shard in read_shards(folder):
        seqs += len(shard["response_start"])
        tokens += len(shard["tokens"])
        mask = shard.get("answer_mask")
        answers += int(mask.sum()) if mask is not None else int(
            (shard["offsets"][1:] - shard["offsets"][:-1] - shard["response_start"]).sum())
    return {"sequences": seqs, "tokens": tokens, "answer_tokens": answers}
