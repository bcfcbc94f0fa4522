"""The Medusa objective (``train_head.py stage=medusa``, settings ``train.medusa``): training and evaluating
Medusa-1 heads (``eagle2.heads.medusa_heads``) on a self-distillation corpus.

Loss (Medusa-1, self-distilled): head k reads the target's post-norm feature ``f[t]`` and is fitted to
the target's own next-token distribution at position t+k+1, ``softmax(lm_head(f[t+k+1]))`` (the
distribution the token t+k+2 is drawn from; on greedy answers its argmax is that token), by a soft
cross-entropy weighted ``decay ** k`` (the paper's 0.8^k). Only positions whose predicted token is an
answer token count (the prompt's last feature included: the first round drafts from it). The target is
frozen; with a shared LM head only the residual blocks train. Data loading and the optimisation loop
are the EAGLE head's (``training.data``, ``training.loop``). With ``draft_vocab_size`` the softmax of
both sides runs over the corpus answers' most frequent tokens (shipped as the heads' draft vocabulary):
on SmolLM2, 8k of 49k LM-head rows, the bulk of the cost.

Evaluation on held-out sequences (teacher forcing is exact for Medusa: drafting reads the true
features): per head, the rank of the target's greedy token among the head's choices; from the rank
prefixes, ``P(node on the true path)`` for every tree node, hence a tree's expected accepted length
(the sum over its nodes) and the best tree of each size (the most probable prefixes).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F

from eagle2.heads.family import Family
from eagle2.heads.medusa_heads import FAMILY, HeadStack, MedusaHeads
from eagle2.training.data import Sequence, train_val_sequences
from eagle2.training.loop import fit
from eagle2.training.objectives import Objective
from eagle2.training.support.losses import LossProjection, soft_cross_entropy

MAX_RANK = 10  # ranks counted per head (the authors' TOPK)


def new_medusa_heads(target, num_heads: int, num_layers: int = 1, own_lm_head: bool = False) -> MedusaHeads:
    """Fresh fp32 heads: residual blocks at the identity (zero weight); own LM heads copy the target's."""
    lm = target.get_output_embeddings()
    heads = MedusaHeads(num_heads, num_layers, target.config.hidden_size,
                        lm.weight.shape[0] if own_lm_head else None)
    if own_lm_head:
        with torch.no_grad():
            for k in range(num_heads):
                heads.lm_head(k).weight.copy_(lm.weight)
    else:
        heads.attach_lm_head(lm)
    return heads.to(target.device, torch.float32)


def medusa_targets(length: int, start: torch.Tensor, valid: torch.Tensor, k: int,
                   answer: torch.Tensor | None = None) -> torch.Tensor:
    """(B, length-k-1) bool: positions t that drafting reads (the prompt's last one onwards, t + 1 >=
    start; with ``answer`` (B, L): token t + 1 is an answer token) and whose head-k target f[t+k+1] exists."""
    if answer is not None:
        return valid[:, k + 1:] & answer[:, 1:length - k]
    t = torch.arange(length - k - 1, device=valid.device)
    return valid[:, k + 1:] & (t[None] + 1 >= start[:, None])


def path_tokens(tokens: torch.Tensor, length: int, k: int) -> torch.Tensor:
    """(B, length-k-1, k+1): at each position t, the tokens t+1 .. t+k+1 (what head k of a Hydra stack
    reads besides f[t]: the root and the k tokens drafted before it, on the true path)."""
    return torch.stack([tokens[:, 1 + j: length - k + j] for j in range(k + 1)], dim=-1)


def medusa_loss(heads: HeadStack, batch: dict, *, proj: LossProjection, decay: float = 0.8,
                generator=None, train: bool = True, with_stats: bool = True):
    """Weighted soft cross-entropy of every head (Medusa's, or Hydra's reading the true path's tokens);
    returns (loss, stats) with ``top1_h{k}`` per head."""
    feats, valid, start = batch["features"], batch["valid"], batch["start"]
    length = feats.shape[1]
    total, stats = None, {}
    for k in range(len(heads)):
        sel = medusa_targets(length, start, valid, k, batch.get("answer"))
        if k == 0:
            stats["n"] = int(sel.sum())
        if not sel.any():
            continue
        path = path_tokens(batch["tokens"], length, k)[sel] if heads.reads_path else None
        x, y = heads.head_features(k, feats[:, : length - k - 1][sel], path), feats[:, k + 1:][sel]
        topk = (1 if train else 4) if with_stats else 0
        if heads.own_lm_head:
            ce, k_stats = _own_head_cross_entropy(heads.lm_head(k).weight[_rows(heads)], x, y, proj, topk)
        else:
            ce, k_stats = soft_cross_entropy(x, y, proj, topk=topk)
        total = ce * decay**k if total is None else total + ce * decay**k
        stats[f"ce_h{k}"] = ce.item()
        for name in ("top1", "top4"):
            if name in k_stats:
                stats[f"{name}_h{k}"] = k_stats[name]
    if total is None:
        return sum(p.sum() for p in heads.parameters()) * 0.0, {"loss": 0.0, "n": 0}
    stats["loss"] = total.item()
    return total, stats


def _rows(heads: MedusaHeads):
    return slice(None) if heads.draft_vocab is None else heads.draft_vocab


def vocab_projection(lm_head, vocab: torch.Tensor | None, dtype: torch.dtype) -> LossProjection:
    """The target's LM head restricted to the rows ``vocab`` (all when None), for the loss."""
    rows = slice(None) if vocab is None else vocab.to(lm_head.weight.device)
    return LossProjection(SimpleNamespace(weight=lm_head.weight[rows], bias=None), dtype)


def _own_head_cross_entropy(weight, x, y, proj: LossProjection, topk: int):
    """Soft cross-entropy of a head's own LM head (its rows ``weight``) against the target's
    distribution (plain autograd)."""
    logp = torch.log_softmax(F.linear(x, weight).float(), -1)
    zq = proj(y)
    ce = -(torch.softmax(zq, -1) * logp).sum(-1).mean()
    stats = {}
    if topk:
        want = zq.argmax(-1)
        stats["top1"] = float((logp.argmax(-1) == want).float().mean())
        if topk > 1:
            stats[f"top{topk}"] = float((logp.topk(topk, -1).indices == want[:, None]).any(-1).float().mean())
    return ce, stats


def train_medusa(target, corpus_dir: str | Path, cfg, out_dir: str | Path, new_heads=None,
                 **kwargs) -> tuple[HeadStack, dict]:
    """Train Medusa heads on ``corpus_dir`` with the settings of ``train.medusa`` (or, with ``new_heads``
    (target, cfg) -> (fresh fp32 heads, their fingerprint settings), other heads of the same loss: Hydra's)."""
    from eagle2.core.precision import resolve_dtype

    torch.manual_seed(cfg.seed)
    target.requires_grad_(False)
    train_seqs, val_seqs, _ = train_val_sequences(corpus_dir, cfg.val_fraction, cfg.max_train_sequences,
                                                  cfg.get("resident_shards"))
    if new_heads is None:
        heads, kind_extra = new_medusa_heads(target, cfg.num_heads, cfg.num_layers, cfg.own_lm_head), {}
    else:
        heads, kind_extra = new_heads(target, cfg)
    if cfg.draft_vocab_size:
        from eagle2.training.data import tokens_by_frequency

        heads.draft_vocab = tokens_by_frequency(corpus_dir)[: int(cfg.draft_vocab_size)]
    proj = vocab_projection(target.get_output_embeddings(), heads.draft_vocab, resolve_dtype(cfg.loss_dtype))
    extra = {"num_heads": cfg.num_heads, "num_layers": cfg.num_layers, "own_lm_head": cfg.own_lm_head,
             "decay": cfg.decay, "draft_vocab_size": cfg.draft_vocab_size, **kind_extra}
    summary = fit(heads, partial(medusa_loss, proj=proj, decay=cfg.decay), train_seqs, val_seqs, cfg, out_dir,
                  desc=kind_extra.get("kind", "medusa"), fingerprint_extra=extra, **kwargs)
    summary.update(train_sequences=len(train_seqs), val_sequences=len(val_seqs),
                   train_answer_tokens=sum(len(s.tokens) - s.start for s in train_seqs))
    return heads.eval(), summary


# ------------------------------------------------------------------------------ evaluation

@torch.no_grad()
def true_ranks(heads: HeadStack, target_lm_head, seq: Sequence, max_rank: int = MAX_RANK) -> torch.Tensor:
    """(A, K) rank (0 = top-1; ``max_rank`` = not in the top ``max_rank`` or outside the heads' draft
    vocabulary) of the target's greedy token t+k+2 among head k's choices at f[t] (heads that read the
    path: given the sequence's tokens t+1 .. t+k+1), for the anchors t (from the prompt's last position)
    where every head's target exists."""
    k_heads = len(heads)
    n = len(seq.tokens)
    first, last = max(seq.start - 1, 0), n - k_heads  # anchors t in [first, last): t + K <= n - 1
    if last <= first:
        return torch.zeros(0, k_heads, dtype=torch.long)
    device = next(heads.parameters()).device
    dtype = next(heads.parameters()).dtype
    feats = seq.features.to(device, dtype)
    anchors = torch.arange(first, last, device=device)
    if seq.answer_mask is not None:  # several answers: anchors whose next token is an answer token
        anchors = anchors[seq.answer_mask.to(device)[anchors + 1]]
    want = target_lm_head(feats).argmax(-1)  # (n,) greedy token after each position
    if heads.draft_vocab is not None:  # as a column of the heads' logits; -1 outside their vocabulary
        column = torch.full((target_lm_head.weight.shape[0],), -1, dtype=torch.long, device=device)
        column[heads.draft_vocab.to(device)] = torch.arange(len(heads.draft_vocab), device=device)
        want = column[want]
    path = torch.stack([seq.tokens.to(device)[anchors + 1 + j] for j in range(k_heads)], dim=-1)  # (A, K)
    out = heads.path_logits(feats[anchors], path)  # (K, A, V'); Medusa heads ignore the path
    ranks = []
    for k in range(k_heads):
        w = want[anchors + k + 1]
        rank = (out[k] > out[k].gather(-1, w.clamp_min(0)[:, None])).sum(-1)
        ranks.append(torch.where(w >= 0, rank, max_rank).clamp_max(max_rank))
    return torch.stack(ranks, dim=1).cpu()


def rank_statistics(heads: HeadStack, target, seqs: list[Sequence], max_rank: int = MAX_RANK) -> dict:
    """Per-head top-1/4/10 and the count of every rank prefix (a tree node) that the true path takes."""
    lm = target.get_output_embeddings()
    lm32 = torch.nn.Linear(lm.weight.shape[1], lm.weight.shape[0], bias=False).to(lm.weight.device)
    lm32.weight.data.copy_(lm.weight.float())
    all_ranks = torch.cat([true_ranks(heads, lm32, s, max_rank) for s in seqs])  # (A, K)
    anchors = len(all_ranks)
    prefixes: Counter = Counter()
    for row in all_ranks.tolist():
        for d in range(len(row)):
            if row[d] >= max_rank:
                break
            prefixes[tuple(row[: d + 1])] += 1
    per_head = {f"h{k}": {f"top{r}": float((all_ranks[:, k] < r).float().mean()) if anchors else 0.0
                          for r in (1, 4, 10)} for k in range(all_ranks.shape[1])}
    return {"anchors": anchors, "per_head": per_head, "prefix_counts": prefixes}


def tree_accept_length(prefix_counts: Counter, anchors: int, choices) -> float:
    """Expected accepted drafts per round of the tree ``choices``: the sum of its nodes' P(on the path)."""
    return sum(prefix_counts.get(tuple(p), 0) for p in {tuple(p) for p in choices}) / max(anchors, 1)


def best_tree(prefix_counts: Counter, size: int) -> list[list[int]]:
    """The ``size`` nodes most often on the true path (closed under parents: a node is never more often
    on it than its parent; ties go to the shallower, lower-ranked node)."""
    ranked = sorted(prefix_counts.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0]))
    return sorted((list(p) for p, _ in ranked[:size]), key=lambda p: (len(p), p))


def evaluate_medusa(heads: HeadStack, target, seqs: list[Sequence], trees: dict, sizes=(1, 2, 3, 4, 6, 8)) -> dict:
    """Per-head agreement, the expected tau (1 + accepted drafts) of the named ``trees`` and of the best
    tree of each size, on held-out ``seqs``."""
    stats = rank_statistics(heads, target, seqs)
    counts, anchors = stats["prefix_counts"], stats["anchors"]
    best = {n: best_tree(counts, n) for n in sizes}
    return {"sequences": len(seqs), "anchors": anchors, "per_head": stats["per_head"],
            "tau": {name: 1 + tree_accept_length(counts, anchors, t) for name, t in trees.items()},
            "best_trees": {str(n): {"choices": t, "tau": 1 + tree_accept_length(counts, anchors, t)}
                           for n, t in best.items()}}


# ------------------------------------------------------------------------------ the stage

@dataclass(frozen=True)
class HeadsKind:
    """What the stage needs to know of a kind of heads trained by this loss (Medusa's, Hydra's)."""

    name: str  # the stage
    settings: Callable  # train config -> the section of its settings
    choices_key: str  # the model-config key of its tree
    new_heads: Callable | None  # (target, section) -> (fresh heads, fingerprint settings); None: Medusa's
    family: Family  # their weight format (eagle2.heads.family): save exports, load reads back


MEDUSA = HeadsKind("medusa", lambda train: train.medusa, "medusa_choices", None, FAMILY)


def medusa_stage(target, tokenizer, cfg, root: Path, kind: HeadsKind | None = None) -> Path | None:
    """``train_head.py stage=medusa`` (or ``stage=hydra`` with its ``kind``): train (resuming), export to
    ``export`` of its settings, and write ``eval.json`` (MT-bench first turns and the corpus's held-out shards)
    and ``training.json``."""
    from omegaconf import OmegaConf

    from eagle2.heads.medusa_heads import MC_SIM_7B_63
    from eagle2.training.data import all_sequences, load_sequences, split_shards
    from eagle2.training.evaluation.evaluate import write_eval_json
    from eagle2.training.evaluation.heldout import mtbench
    from eagle2.training.support.models import export_dtype

    kind = kind or MEDUSA
    mc = kind.settings(cfg.train)
    corpus_dir = root / mc.corpus_dir
    t0 = time.time()
    heads, summary = train_medusa(target, corpus_dir, mc, root / mc.out_dir, new_heads=kind.new_heads,
                                  stop_after=mc.stop_after)
    if summary["partial"]:
        return None
    summary["wall_time_s_this_process"] = time.time() - t0
    dtype = export_dtype(heads, mc.export_max_mb, mc.get("export_dtype", "bfloat16"))
    folder = kind.family.save(heads, root / mc.export, dtype=dtype, base_model_name_or_path=cfg.model.hub_id)
    info = {"kind": kind.name, "target": cfg.model.name, "corpus_dir": str(mc.corpus_dir),
            "corpus_shards": sorted(p.name for p in corpus_dir.glob("shard_*.safetensors")),
            "recipe": OmegaConf.to_container(mc), "stored_dtype": str(dtype).replace("torch.", ""), "summary": summary}
    (folder / "training.json").write_text(json.dumps(info, indent=2, default=str))
    mt_dir = mtbench(target, tokenizer, cfg, root)
    _, val_paths = split_shards(corpus_dir, mc.val_fraction)
    loaded = kind.family.load(folder, target)
    trees = {f"model.{kind.choices_key}": OmegaConf.to_container(cfg.model[kind.choices_key]),
             "mc_sim_7b_63": MC_SIM_7B_63}
    metrics = {"target": cfg.model.name, "artifact": str(folder)}
    for name, seqs in {"mt_bench": all_sequences(mt_dir), "corpus_heldout": load_sequences(val_paths)}.items():
        metrics[name] = evaluate_medusa(loaded, target, seqs, trees)
        tops = " ".join(f"{k}={v['top1']:.3f}" for k, v in metrics[name]["per_head"].items())
        print(f"[eval] {kind.name} on {name}: top-1 {tops}; tau " +
              " ".join(f"{k}={v:.3f}" for k, v in metrics[name]["tau"].items()), flush=True)
    write_eval_json(folder, metrics)
    return folder


OBJECTIVE = Objective("medusa", "Medusa heads", medusa_stage, order=4, corpus_key="medusa.corpus_dir",
                      data_parallel=False)
