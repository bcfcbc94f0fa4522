"""The PARD draft objective (``train_head.py stage=pard_draft``, settings ``train.pard_draft``).

Adapts an SpS draft (``train.pard_draft.init_from``, default ``model.sps_draft``; null: a fresh draft started from
the target's layers as ``stage=draft`` starts one) into a PARD draft (``eagle2.heads.pard_draft``): all of its own
weights train, with the mask embedding, started as the mean of the embedding's rows (a generic token's input).

One forward per batch row covers every depth, in P-EAGLE's layout (``objectives.peagle_head.parallel_layout``,
which PARD's paper introduced): the row's tokens at depth 1 (causal: the ordinary LM, every answer position an
anchor) and, for anchors ``a`` kept at depth d >= 2, a mask slot at position a + d - 1 that sees the tokens up to
``a`` and its own anchor's earlier slots, what drafting's forward sees. Conditional drop-token sampling
(``cod_anchors``) keeps it small: depth d keeps a random ``max(ratio ** (d-1), floor)`` share of the answer
positions (PARD: 0.7 and 0.2), drawn from the anchors kept at depth d - 1.

Loss at each kept element at position p (its target: token p + 1), count-normalised over depths: with
``distill: true`` (the default) the soft cross-entropy against the target's next-token distribution
``softmax(lm_head(f[p]))`` (KL up to a constant): a token corpus's batches carry the target's last hidden states
anyway (the loop's online features, which the SpS draft objective reads too), so the distribution costs one product
with the LM head and carries more than its argmax. ``distill: false``: the cross-entropy on the corpus's next token,
as PARD trains (its data, no target). Either way the exported draft reads no target feature at drafting time.

PARD does not join joint runs (its ``Objective`` declares no ``member``; its ``Member`` describes its own stage):
a joint run shares one target forward among heads that read the target's features; a PARD draft is a whole LM
whose forward is its own, so joining would save it nothing.
Stats: top-1 agreement with the target's argmax per depth (``top1``, ``top1_s{d}``).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from eagle2.core.tree import additive_mask
from eagle2.heads.draft_model import build_draft_model
from eagle2.heads.pard_draft import FAMILY, PardDraft
from eagle2.training.evaluation.agreement import agreement, ranked_ids
from eagle2.training.evaluation.evaluate import evaluate_drafter
from eagle2.training.objectives import Member, Objective, module_chain, solo_stage
from eagle2.training.objectives.peagle_head import cod_anchors, parallel_layout
from eagle2.training.support.losses import LossProjection, answer_positions, combine, loss_dtype, soft_cross_entropy
from eagle2.training.support.models import export


def parallel_forward(draft: PardDraft, tokens: torch.Tensor, deeper: list[torch.Tensor]):
    """One row's forward over ``parallel_layout``: ``tokens`` (L,) (the first L - 1 are read), ``deeper[d-2]`` the
    anchors of depth d's slots. Returns (hidden states (Q, H), anchor, depth)."""
    n_pos, base = tokens.shape[0] - 1, draft.lm.base_model
    anchor, depth, allowed = parallel_layout(n_pos, deeper, tokens.device)
    embeds = draft.inputs_embeds(tokens[:n_pos], int((depth > 1).sum()))
    hidden = base(inputs_embeds=embeds[None], position_ids=(anchor + depth - 1)[None], use_cache=False,
                  attention_mask=additive_mask(allowed, embeds.dtype, tokens.device)).last_hidden_state[0]
    return hidden, anchor, depth


def pard_loss(draft: PardDraft, batch: dict, *, proj: LossProjection, ratio: float = 0.7, floor: float = 0.2,
              distill: bool = True, generator: torch.Generator | None = None, train: bool = True,
              with_stats: bool = True):
    """PARD loss over a batch (the module docstring); outside training the COD draw is seeded (0)."""
    proj = proj if train else proj.exact()
    generator = generator if train else torch.Generator().manual_seed(0)
    answer, feats = answer_positions(batch), batch["features"]  # answer[b, p]: token p + 1 is an answer token
    hidden, target_feats, labels, depths = [], [], [], []
    for row in range(batch["tokens"].shape[0]):
        length = int(batch["valid"][row].sum())  # right-padded: the row's real tokens
        tokens, counts = batch["tokens"][row, :length], answer[row, :length - 1]
        out, anchor, depth = parallel_forward(draft, tokens, cod_anchors(counts, draft.para_depths, ratio, floor,
                                                                         generator))
        at = anchor + depth - 1
        kept = counts[at]
        hidden.append(out[kept])
        target_feats.append(feats[row][at[kept]])
        labels.append(tokens[at[kept] + 1])
        depths.append(depth[kept])
    x, y, label, depth = torch.cat(hidden), torch.cat(target_feats), torch.cat(labels), torch.cat(depths)
    if len(x) == 0:
        return combine([], {}, feats)
    total, stats = x.sum() * 0.0, {"n": int((depth == 1).sum())}
    for d in depth.unique().tolist():
        at = depth == d
        if distill:
            ce, _ = soft_cross_entropy(x[at], y[at], proj, topk=0)
        else:
            ce = torch.nn.functional.cross_entropy(proj(x[at]), label[at])
        total = total + ce * (int(at.sum()) / len(x))
        if with_stats:
            with torch.no_grad():
                agree = agreement(proj(x[at].detach()), proj(y[at]), ks=(1,))
            stats.update({"top1": agree["top1"]} if d == 1 else {f"top1_s{d}": agree["top1"], f"n_s{d}": agree["n"]})
    return combine([total], stats, feats)


def new_pard_draft(target, cfg) -> PardDraft:
    """The draft to adapt: ``cfg.init_from`` (an SpS draft folder) or a fresh one, in the target's dtype as the SpS
    objective trains it; its own weights and the mask embedding (the mean embedding row) train, the target's don't."""
    from eagle2.heads.draft_model import load_draft_model

    init = cfg.get("init_from")
    lm = load_draft_model(init, target) if init else build_draft_model(target, cfg.num_layers, True)
    if lm.get_input_embeddings() is not target.get_input_embeddings():
        raise ValueError(f"train.pard_draft.init_from {init}: a draft with its own embedding; this objective adapts "
                         "SpS drafts that share the target's (train_head.py stage=draft)")
    draft = PardDraft(lm, int(cfg.para_depths))
    with torch.no_grad():
        draft.mask_embedding.copy_(lm.get_input_embeddings().weight.mean(0))
    for name, param in draft.named_parameters():
        param.requires_grad_(name not in draft.shared_keys)
    return draft.train()


@torch.no_grad()
def pard_chain(draft: PardDraft, seq, anchors: list[int], depth: int) -> torch.Tensor:
    """(A, depth) tokens the draft drafts in one forward from each anchor (each depth's argmax)."""
    device = draft.mask_embedding.device
    tokens, at = seq.tokens.to(device), torch.tensor(anchors, device=device)
    out, anchor, slot_depth = parallel_forward(draft, tokens, [at] * (depth - 1))
    rows = torch.cat([at, torch.arange(len(tokens) - 1, len(out), device=device)])
    drafted = ranked_ids(draft.drafting_lm_head()(out[rows]).float(), 1)[:, 0]
    return drafted.view(depth, len(anchors)).T


def pard_setup(target, corpus_dir, cfg):
    """(the draft to adapt, its loss function, its fingerprint settings) for ``cfg`` (``corpus_dir``: unread)."""
    draft = new_pard_draft(target, cfg)
    proj = LossProjection(target.get_output_embeddings(), loss_dtype(cfg.loss_dtype))
    ratio, floor, distill = float(cfg.down_sample_ratio), float(cfg.down_sample_ratio_min), bool(cfg.distill)
    extra = {"type": "pard", "para_depths": draft.para_depths, "down_sample_ratio": ratio,
             "down_sample_ratio_min": floor, "distill": distill, "init_from": str(cfg.get("init_from"))}
    return draft, partial(pard_loss, proj=proj, ratio=ratio, floor=floor, distill=distill), extra


def evaluate_pard_draft(draft, target, seqs, cfg) -> dict:
    """Held-out top-1 per depth (teacher-forced, the seeded COD draw) and the one-forward chain's acceptance."""
    proj = LossProjection(target.get_output_embeddings(), torch.float32)
    return evaluate_drafter(draft, seqs, cfg, partial(pard_loss, proj=proj), partial(pard_chain, draft))


def export_pard(draft, summary: dict, cfg, root: Path, section: str = "pard_draft") -> Path:
    """Store an adapted PARD draft at ``train.export.pard_draft`` with its card."""
    return export(draft, FAMILY, summary, cfg, root, kind="pard_draft", export_key="pard_draft", section=section)


# its stage only: no ``member=``, it joins no joint run (module docstring)
OBJECTIVE = Objective("pard_draft", "PARD draft", solo_stage("pard_draft", "pard",
                                                             Member(pard_setup, export_pard, module_chain(pard_chain))),
                      export_key="pard_draft", family=FAMILY, evaluate=evaluate_pard_draft, weights=("init_from",))
