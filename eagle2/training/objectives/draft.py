"""The SpS draft model objective (``train_head.py stage=draft``, settings ``train.draft``).

A small causal LM (``eagle2.heads.draft_model``: the target's embedding and LM head, its own few layers) fitted
by a soft cross-entropy (KL up to a constant) of its next-token distribution against the target's
``softmax(lm_head(f[j]))`` at the answer positions (optionally the prompt too). The export leaves the
embedding and LM head out.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from eagle2.core.cache import forward_target, new_cache
from eagle2.heads.draft_model import FAMILY, build_draft_model
from eagle2.training.data import Sequence
from eagle2.training.evaluation.agreement import agreement
from eagle2.training.evaluation.evaluate import chain_mask, evaluate_drafter
from eagle2.training.evaluation.heldout import validation
from eagle2.training.objectives import Objective, exported, train_objective
from eagle2.training.support.losses import LossProjection, loss_dtype, soft_cross_entropy
from eagle2.training.support.models import export


def draft_loss(draft, batch: dict, *, proj: LossProjection, loss_on_prompt: bool = False,
               draft_proj: LossProjection | None = None, generator: torch.Generator | None = None,
               train: bool = True, with_stats: bool = True):
    """Soft cross-entropy of the draft against the target's next-token distribution. ``proj`` is the
    target's LM head; ``draft_proj`` the draft's when it has its own (default: shared, ``proj``)."""
    proj = proj if train else proj.exact()
    tokens, feats, valid, start = batch["tokens"], batch["features"], batch["valid"], batch["start"]
    b, length = tokens.shape
    pos = torch.arange(length, device=tokens.device)
    hidden = draft.base_model(input_ids=tokens, attention_mask=valid.long(), position_ids=pos.expand(b, -1),
                              use_cache=False).last_hidden_state
    if loss_on_prompt:
        sel = valid
    elif "answer" in batch:  # several answers: position i counts when token i+1 is an answer token
        sel = valid & torch.cat([batch["answer"][:, 1:], batch["answer"][:, -1:]], dim=1)
    else:
        sel = valid & (pos[None] + 1 >= start[:, None])
    n = int(sel.sum())
    if n == 0:
        return hidden.sum() * 0.0, {"loss": 0.0, "kl": 0.0, "top1": 0.0, "n": 0}
    if draft_proj is None:
        ce, stats = soft_cross_entropy(hidden[sel], feats[sel], proj,
                                       topk=(1 if train else 4) if with_stats else 0)
    else:  # a draft with its own LM head (a hub checkpoint): evaluation only
        q_logits = proj(feats[sel])
        logp = torch.log_softmax(draft_proj(hidden[sel]), dim=-1)
        q = torch.softmax(q_logits, -1)
        ce = -(q * logp).sum(-1).mean()
        stats = {**agreement(logp, q_logits), "entropy": -(q * torch.log_softmax(q_logits, -1)).sum(-1).mean().item()}
    if "entropy" in stats:
        stats["kl"] = ce.item() - stats.pop("entropy")
    stats.update(loss=ce.item(), n=n)
    return ce, stats


def train_draft(target, corpus_dir: str | Path, cfg, out_dir: str | Path, **kwargs):
    """Train an SpS draft model on ``corpus_dir``; ``kwargs`` as for ``eagle.train_head``."""
    torch.manual_seed(cfg.seed)
    draft = build_draft_model(target, cfg.num_layers, cfg.init_from_target)
    proj = LossProjection(target.get_output_embeddings(), loss_dtype(cfg.loss_dtype))
    loss_fn = partial(draft_loss, proj=proj, loss_on_prompt=cfg.loss_on_prompt)
    return train_objective(draft, loss_fn, target, corpus_dir, cfg, out_dir, desc="draft", **kwargs)


@torch.no_grad()
def draft_chain(draft, proj: LossProjection, seq: Sequence, anchors: list[int], depth: int) -> torch.Tensor:
    """(A, depth) tokens drafted greedily by a causal-LM draft model from each anchor."""
    device = next(draft.parameters()).device
    dtype = next(draft.parameters()).dtype
    tokens = seq.tokens.to(device)
    n_true = len(tokens)  # the draft reads t[0..j+1] itself
    last = torch.tensor(anchors, device=device) + 1
    cache = new_cache(draft)
    hidden = forward_target(draft, tokens[None], cache, position_ids=torch.arange(n_true, device=device)[None])
    tok = proj(hidden[0, last]).argmax(-1)
    drafts = [tok]
    for d in range(1, depth):
        hidden = forward_target(draft, tok[None], cache, attention_mask=chain_mask(n_true, last, d - 1, dtype),
                                position_ids=(last + d)[None])
        tok = proj(hidden[0]).argmax(-1)
        drafts.append(tok)
    return torch.stack(drafts, dim=1)


def draft_chain_of(draft, target):
    """The draft's greedy chain drafter (``evaluate.chain_acceptance``), through its own fp32 LM head."""
    return partial(draft_chain, draft, LossProjection(draft.get_output_embeddings(), torch.float32))


def evaluate_draft(draft, target, seqs: list[Sequence], cfg) -> dict:
    """Teacher-forced top-1/top-4 and greedy-chain acceptance of an SpS draft model on ``seqs``."""
    proj = LossProjection(target.get_output_embeddings(), torch.float32)
    own = LossProjection(draft.get_output_embeddings(), torch.float32)
    return evaluate_drafter(draft, seqs, cfg, partial(draft_loss, proj=proj, draft_proj=own),
                            draft_chain_of(draft, target))


def draft_stage(target, tokenizer, cfg, root: Path) -> Path | None:
    """Train the SpS draft model (resuming) and export it (no embedding / LM head) to ``train.export.draft``."""
    c = cfg.train.draft
    draft, summary = train_draft(target, root / cfg.train.corpus.out_dir, c, root / c.out_dir, stop_after=c.stop_after,
                                 **validation(target, tokenizer, cfg, root, "draft", draft_chain_of))
    return export(draft, FAMILY, summary, cfg, root, kind="draft", export_key="draft") \
        if exported(summary) else None


OBJECTIVE = Objective("draft", "SpS draft", draft_stage, order=3, export_key="draft", family=FAMILY,
                      evaluate=evaluate_draft)
