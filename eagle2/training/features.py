"""The target's features of known token sequences: what a head reads, offline (feature shards) or online.

**Offline** (``tokens_to_features``, ``teacher_forced_batch``): one teacher-forced, right-padded forward per
batch of token sequences gives the post-norm hidden states (the tensor the target's LM head multiplies: what
an EAGLE head consumes) and, with ``tap_layers`` (EAGLE-3: ``corpus_tap_layers``), the inputs of those decoder
layers, caught by ``core.features.LayerTap``; written as feature shards (``shards.py``), resumable.

**Online** (``OnlineFeatures``): the same forward inside the training step, for a token corpus (ids and answer
spans, ~2 bytes a token): worth it when the features would not fit a disk, or when the corpus is seen only a
few times. The forward runs in ``dtype`` under autocast (bf16 on CPUs that multiply it natively), as the target
runs when decoding there; with ``body_dtype`` it runs on a copy of the target's body whose weights are stored in
that dtype (no per-op weight casts; rotary tables and other buffers stay fp32; measured 1.04x on an AVX512-BF16
EPYC core, where a 4,096-token forward is compute-bound either way). Several heads trained on the same batch
share one forward (``objectives/joint.py``). Knows nothing of heads or losses.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch
from tqdm import tqdm

from eagle2.core.cache import forward_target, new_cache
from eagle2.core.features import LayerTap, eagle3_layers
from eagle2.training.data import is_token_corpus
from eagle2.training.shards import answer_mask, check_existing_taps, read_token_shard, token_shard_paths, write_shard
from eagle2.training.support.precision import autocast_dtype


class OnlineFeatures:
    """``featurize(batch)``: adds ``features`` (B, L, H) and, with ``tap_layers``, ``layer_features``
    (B, L, k*H), both fp32, to a collated batch of tokens (``data.collate``); a batch that already has
    features (an offline corpus, a validation set of feature shards) is returned as it is."""

    def __init__(self, target, tap_layers=(), dtype: torch.dtype | None = None,
                 body_dtype: torch.dtype | None = None):
        self.target, self.tap_layers, self.dtype = target, tuple(int(i) for i in tap_layers or ()), dtype
        self.body = target.base_model
        if body_dtype is not None and next(self.body.parameters()).dtype != body_dtype:
            self.body = cast_weights(copy.deepcopy(self.body), body_dtype)
            self.dtype = None  # the weights are already in the compute dtype

    @torch.no_grad()
    def __call__(self, batch: dict) -> dict:
        if "features" in batch:
            return batch
        tokens, valid = batch["tokens"], batch["valid"]
        with contextlib.ExitStack() as stack:
            tap = stack.enter_context(LayerTap(self.body, self.tap_layers)) if self.tap_layers else None
            if self.dtype is not None:
                stack.enter_context(torch.autocast(tokens.device.type, dtype=self.dtype))
            # no KV cache: nothing decodes after this forward (measured ~1.4x faster than with one)
            hidden = self.body(input_ids=tokens, attention_mask=valid.long(), use_cache=False).last_hidden_state
            batch["features"] = hidden.float()
            if tap is not None:
                batch["layer_features"] = tap.read().float()
        return batch


def cast_weights(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``module`` with its parameters (not its buffers: rotary tables stay fp32) stored in ``dtype``."""
    for param in module.parameters():
        param.data = param.data.to(dtype)
    return module


def body_dtype(setting: str | None, device: torch.device) -> torch.dtype | None:
    """The dtype of the target's weights for the teacher-forced forward (``train.*.target_dtype``): ``auto``
    is bf16 where the training autocast is bf16 (a CPU that multiplies bf16 natively, CUDA), else None (the
    target's own); ``bf16`` / ``fp32`` force one; ``same`` is the target's own."""
    setting = str(setting or "auto").lower()
    if setting not in ("auto", "bf16", "fp32", "same"):
        raise ValueError(f"train.*.target_dtype must be auto, bf16, fp32 or same, not {setting!r}")
    if setting == "auto":
        return autocast_dtype("auto", device)
    return {"bf16": torch.bfloat16, "fp32": torch.float32, "same": None}[setting]


def featurizer(target, corpus_dir, cfg, tap_layers=()) -> OnlineFeatures | None:
    """Online features for a token corpus (``data.is_token_corpus``), in the training autocast dtype, the
    target's weights in ``cfg.target_dtype`` (``body_dtype``); None for a feature corpus."""
    if not is_token_corpus(corpus_dir):
        return None
    return OnlineFeatures(target, tap_layers, autocast_dtype(cfg.get("autocast", "auto"), target.device),
                          body_dtype(cfg.get("target_dtype", "auto"), target.device))


def online_fingerprint(featurize: OnlineFeatures | None) -> dict:
    """What a run's checkpoints record of its feature source: ``features: online`` and, when the target's
    weights were cast for the forward, their dtype."""
    if featurize is None:
        return {}
    cast = featurize.body is not featurize.target.base_model
    return {"features": "online",
            **({"target_dtype": str(next(featurize.body.parameters()).dtype).replace("torch.", "")} if cast else {})}


def corpus_tap_layers(target, setting) -> tuple[int, ...]:
    """The decoder layers whose inputs a corpus records: ``eagle3`` (2, L//2, L-3), a list, or none."""
    if not setting:
        return ()
    if setting == "eagle3":
        return eagle3_layers(target.config.num_hidden_layers)
    return tuple(int(i) for i in setting)


def features_of(hidden: torch.Tensor, tap: LayerTap | None) -> torch.Tensor:
    """The recorded features of a forward: post-norm hidden states, then the tapped layers' inputs."""
    return hidden if tap is None else torch.cat([hidden, tap.read().to(hidden.dtype)], dim=-1)


@torch.no_grad()
def teacher_forced_batch(model, sequences: list[list[int]], starts: list[int], pad_id: int,
                         tap: LayerTap | None = None):
    """Per sequence (ids, features (n, H or H + k*H), start) from one right-padded forward."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    feats = features_of(forward_target(model, input_ids, new_cache(model), attention_mask=mask), tap)
    return [(ids, feats[row, : len(ids)], start) for row, (ids, start) in enumerate(zip(sequences, starts))]


def budget_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices of sequences of ``lengths`` in forwards of at most ``token_budget`` padded tokens, similar
    lengths together."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, current = [], []
    for i in order:
        if current and lengths[i] * (len(current) + 1) > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


def tokens_to_features(model, token_dir: str | Path, out_dir: str | Path, *, pad_id: int,
                       tap_layers=(), token_budget: int = 8192, max_shards: int | None = None) -> Path:
    """Rebuild feature shards from token shards: ``tokens_NNNNN.npz`` -> ``shard_NNNNN.safetensors``, one
    teacher-forced forward per ``token_budget`` padded tokens; shards already written are skipped (resumable).
    ``response_start`` is each sequence's first answer token; ``answer_mask`` is added when some sequence's
    answers are not exactly ``[response_start, n)`` (a sequence with one span ``[start, n)``: the old format)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tap_layers = tuple(int(i) for i in tap_layers or ())
    check_existing_taps(out, tap_layers)
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
            for idx in budget_batches([len(c[0]) for c in convs], token_budget):
                seqs = [convs[i][0] for i in idx]
                starts = [min(a for a, _ in convs[i][1]) for i in idx]
                for i, (ids, feats, start) in zip(idx, teacher_forced_batch(model, seqs, starts, pad_id, tap)):
                    rows[i] = (ids, feats.cpu(), start, answer_mask(len(ids), convs[i][1]))
            plain = all(r[3][r[2]:].all() and not r[3][:r[2]].any() for r in rows)
            write_shard(target, [r[:3] for r in rows] if plain else rows, model.config.hidden_size, tap_layers)
    return out
