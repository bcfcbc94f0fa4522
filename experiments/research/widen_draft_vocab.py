"""Widen an EAGLE-3 head's draft vocabulary: the warm start of a run that trains a head over more tokens.

A head drafting over ``d`` target tokens can never propose the others: a round whose target token lies outside
them ends there (``experiments.research.vocab_ends`` counts those rounds). This writes a copy of the head
drafting over ``--size`` tokens: its own tokens with their trained read-out rows, then the most frequent tokens
of ``--order`` (a draft-vocabulary file: tokens by corpus frequency) it lacks, each read out by the target's
own LM-head row, the row every read-out row of the head started from (``new_eagle3_head``).

The copy must be trained before it drafts: a reduced-vocabulary softmax never pushes the logits of tokens
outside it down, so the head's features project strongly onto some of the new rows, and untrained the copy
proposes those (measured on SmolLM2's head: tau 1.00 on 10 MT-bench questions, against 1.88 for the head).

    python -m experiments.research.widen_draft_vocab --out artifacts/work/eagle3_wide --size 16384

It prints how far the trained rows moved from the target rows they started as (norm ratio, cosine).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

from eagle2.heads.checkpoint import read_token_ids
from eagle2.heads.eagle3_head import Eagle3Head, load_eagle3_head, save_eagle3_head
from eagle2.heads.eagle_head import DRAFT_VOCAB_FILE
from experiments.research.draft_vocab import extended


def added_tokens(held: torch.Tensor, order: torch.Tensor, size: int) -> torch.Tensor:
    """The first ``size - len(held)`` tokens of ``order`` that ``held`` lacks, in ``order``'s order."""
    need = size - len(held)
    if need < 0:
        raise ValueError(f"the head already drafts over {len(held)} tokens, more than --size {size}")
    new = extended(held, order)[len(held):][:need]
    if len(new) < need:
        raise ValueError(f"the order file adds only {len(new)} new tokens of the {need} needed")
    return new.long()


def row_drift(trained: torch.Tensor, start: torch.Tensor) -> dict[str, float]:
    """How far trained read-out rows moved from the rows they started as: median norm ratio and cosine."""
    trained, start = trained.detach().float(), start.detach().float()
    ratio = trained.norm(dim=1) / start.norm(dim=1).clamp_min(1e-12)
    cosine = torch.nn.functional.cosine_similarity(trained, start, dim=1)
    return {"norm_ratio_median": float(ratio.median()), "cosine_median": float(cosine.median()),
            "cosine_p10": float(cosine.quantile(0.1))}


def widened(head: Eagle3Head, target_rows: torch.Tensor, new: torch.Tensor) -> Eagle3Head:
    """A copy of ``head`` drafting over its tokens and ``new`` (read out by ``target_rows[new]``)."""
    held = head.draft_token_ids()
    ids = torch.cat([held.cpu(), new])
    rows = torch.cat([head.lm_head.weight.detach().float().cpu(), target_rows[new].float()])
    order = torch.argsort(ids)  # set_draft_vocabulary stores the tokens sorted: the rows follow
    config = copy.deepcopy(head.config)
    config.draft_vocab_size = len(ids)
    wide = Eagle3Head(config, head.feature_layers)
    state = {k: v for k, v in head.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    wide.load_state_dict(state, strict=False)
    wide.set_draft_vocabulary(ids)
    with torch.no_grad():
        wide.lm_head.weight.copy_(rows[order])
    wide.attach_embedding(head.embed_tokens)
    return wide


def main(argv: list[str] | None = None) -> None:
    from experiments.bench.side_by_side import smollm2

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", type=Path, default=Path("artifacts/smollm2/eagle3_head"))
    ap.add_argument("--order", type=Path, default=Path("artifacts/smollm2/eagle_head") / DRAFT_VOCAB_FILE,
                    help="a draft-vocabulary file: the tokens to add, most frequent first")
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    _, target, _ = smollm2("float32", "stock")
    head = load_eagle3_head(args.head, target).float()
    held = head.draft_token_ids()
    if held is None:
        raise SystemExit(f"{args.head} drafts over the full vocabulary already")
    target_rows = target.get_output_embeddings().weight.detach().float().cpu()
    drift = row_drift(head.lm_head.weight.detach().float().cpu(), target_rows[held.cpu()])
    print(f"trained read-out rows against their target starting rows: {drift}")
    new = added_tokens(held.cpu(), read_token_ids(args.order), args.size)
    wide = widened(head, target_rows, new)
    save_eagle3_head(wide, args.out, dtype=torch.bfloat16)  # as the shipped heads are stored
    print(f"wrote {args.out}: {len(held)} + {len(new)} = {wide.draft_vocab_size} draft tokens (train before drafting)")


if __name__ == "__main__":
    main()
