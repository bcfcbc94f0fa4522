"""Held-out evaluation of EAGLE heads and SpS draft models against the target's greedy answers.

Two measures, on sequences in the corpus format (the target's own greedy answers with its features):

- teacher forcing: top-1 / top-4 agreement of the drafter's next-token distribution with the target's
  next token ``argmax(lm_head(f))`` at every answer position, given the true prefix;
- greedy chain drafting: from anchor positions ``j`` (the target has just produced ``t[j+1]``) the
  drafter runs ``depth`` steps on its own outputs (the head on its own predicted features and argmax
  tokens, over a KV cache of the true prefix) and its tokens are compared with the true continuation
  ``t[j+2..]`` (the corpus answers are greedy, so they are the target's continuation). Reported:
  ``P(accepted length >= d)`` for ``d = 1..depth`` and the chain ``tau = 1 + sum_d P(len >= d)``,
  the expected tokens per target forward of chain speculative decoding with this drafter.

Both measures are ``agreement``'s definitions (the trainer's validation rows use the same ones, on
fp32 LM heads). All anchors of one sequence are drafted together as one batch row, each attending to its own prefix
and its own earlier drafts through a 4D mask. Each objective gives its loss and its chain drafter
(``objectives/``); the eval stage is ``stage.eval_stage``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle2.core.cache import new_cache
from eagle2.core.tree import additive_mask
from eagle2.heads.eagle_head import causal_mask
from eagle2.training.data import Sequence, evenly_spaced
from eagle2.training.evaluation.agreement import accepted_lengths, chain_summary
from eagle2.training.support.losses import evaluate_loss


def chain_anchors(n: int, start: int, depth: int, stride: int, limit: int | None = None,
                  answer: torch.Tensor | None = None) -> list[int]:
    """Anchors ``j`` with ``t[j+1]`` an answer token (or the first) and ``depth`` true tokens after;
    ``answer`` (n,) bool, when given, keeps only anchors whose ``t[j+1]`` it marks (several answers)."""
    anchors = list(range(max(start - 1, 0), n - 1 - depth, max(1, stride)))
    if answer is not None:
        anchors = [j for j in anchors if bool(answer[j + 1])]
    return anchors[:limit] if limit else anchors


def chain_mask(n_true: int, last_true: torch.Tensor, steps_done: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive (1, 1, A, n_true + (steps_done+1) * A) mask for A parallel chains: query ``a`` sees true
    keys ``0..last_true[a]``, its own ``steps_done`` earlier drafts and itself."""
    a = len(last_true)
    device = last_true.device
    true_part = torch.arange(n_true, device=device)[None] <= last_true[:, None]
    own = torch.eye(a, dtype=torch.bool, device=device).repeat(1, steps_done + 1)
    return additive_mask(torch.cat([true_part, own], dim=1), dtype, device)


@torch.no_grad()
def feature_chain(head, inputs: torch.Tensor, to_token, seq: Sequence, anchors: list[int], depth: int) -> torch.Tensor:
    """(A, depth) tokens drafted greedily by a feature-level head from each anchor: it reads
    ``inputs`` (the target features it consumes) along the true prefix, then its own outputs;
    ``to_token`` turns an output into the drafted target token id."""
    device, dtype = head.fc.weight.device, head.fc.weight.dtype
    tokens, feats = seq.tokens.to(device), inputs.to(device, dtype)
    n_true = len(tokens) - 1  # head position k holds the pair (t[k+1], f[k])
    anchor = torch.tensor(anchors, device=device)
    cache = new_cache(head)
    out = head(tokens[None, 1:], feats[None, :-1], position_ids=torch.arange(n_true, device=device)[None],
               attention_mask=causal_mask(n_true, 0, dtype, device), cache=cache)
    f_hat = out[0, anchor]
    tok = to_token(f_hat)
    drafts = [tok]
    for d in range(1, depth):
        out = head(tok[None], f_hat[None], position_ids=(anchor + d)[None],
                   attention_mask=chain_mask(n_true, anchor, d - 1, dtype), cache=cache)
        f_hat = out[0]
        tok = to_token(f_hat)
        drafts.append(tok)
    return torch.stack(drafts, dim=1)


def chain_acceptance(chain_fn, seqs: list[Sequence], *, depth: int = 5, stride: int = 4,
                     max_anchors_per_sequence: int | None = 64) -> dict:
    """P(accepted length >= d), d = 1..depth, and tau over all anchors of ``seqs``."""
    lengths = [torch.zeros(0, dtype=torch.long)]  # accepted length per anchor
    for seq in seqs:
        anchors = chain_anchors(len(seq.tokens), seq.start, depth, stride, max_anchors_per_sequence,
                                seq.answer_mask)
        if not anchors:
            continue
        drafted = chain_fn(seq, anchors, depth).cpu()
        idx = torch.tensor(anchors)[:, None] + 2 + torch.arange(depth)[None]
        lengths.append(accepted_lengths(drafted, seq.tokens[idx]))
    return chain_summary(torch.cat(lengths), depth)


def chain_tau_measure(chain, target, seqs: list[Sequence], cfg):
    """A trainer ``val_extra`` (``loop.fit``): the greedy-chain tau on ``seqs`` (settings ``cfg``: the eval
    stage's depth, stride, anchors) of the module being trained, drafting with ``chain(module, target)``. A
    ``chain`` giving ``{prefix: drafter}`` (a joint run's heads, ``eagle3/``) gives ``<prefix>chain_tau`` of each,
    a drafter named under several prefixes measured once."""

    @torch.no_grad()
    def measure(module) -> dict:
        drafters = chain(module, target)
        taus: dict[int, float] = {}
        for drafter in (drafters.values() if isinstance(drafters, dict) else [drafters]):
            if id(drafter) not in taus:
                taus[id(drafter)] = chain_acceptance(drafter, seqs, depth=cfg.depth, stride=cfg.stride,
                                                     max_anchors_per_sequence=cfg.max_anchors_per_sequence)["tau"]
        if not isinstance(drafters, dict):
            return {"chain_tau": taus[id(drafters)]}
        return {f"{prefix}chain_tau": taus[id(drafter)] for prefix, drafter in drafters.items()}

    return measure


def evaluate_drafter(module, seqs: list[Sequence], cfg, loss_fn, chain_fn) -> dict:
    """Teacher-forced top-1/top-4 (``loss_fn``'s stats, no noise) and greedy-chain acceptance (``chain_fn``) of
    a drafter on ``seqs`` (at most ``cfg.max_sequences``, evenly spaced), with the eval settings ``cfg``."""
    seqs = evenly_spaced(seqs, cfg.max_sequences)
    module.eval()
    tf = evaluate_loss(module, loss_fn, seqs, device=next(module.parameters()).device, token_budget=cfg.token_budget,
                       max_batch=cfg.max_batch, max_sequences=cfg.max_sequences)
    chain = chain_acceptance(chain_fn, seqs, depth=cfg.depth, stride=cfg.stride,
                             max_anchors_per_sequence=cfg.max_anchors_per_sequence)
    return {"sequences": len(seqs), "teacher_forced": tf, "chain": chain}


def write_eval_json(folder: str | Path, metrics: dict, name: str = "eval.json") -> Path:
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=2))
    return path
