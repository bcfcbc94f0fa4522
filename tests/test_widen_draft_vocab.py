"""Widening an EAGLE-3 head's draft vocabulary without training (experiments/research/widen_draft_vocab.py): the
copy drafts over the head's tokens and the next most frequent ones it lacks; on any features its logits of the
head's own tokens equal the head's, its new tokens are read out by the target's LM-head rows,
and the copy saves and loads as an ordinary head."""

from __future__ import annotations

import pytest
import torch

from eagle2.heads.eagle3_head import load_eagle3_head, save_eagle3_head
from experiments.research.widen_draft_vocab import added_tokens, row_drift, widened
from tests.conftest import tiny_eagle3_head, tiny_llama


def test_added_tokens_follow_the_order_and_skip_held_ones():
    assert added_tokens(torch.tensor([3, 5]), torch.tensor([5, 9, 3, 1, 7]), 4).tolist() == [9, 1]
    with pytest.raises(ValueError, match="only 1 new"):
        added_tokens(torch.tensor([3, 5]), torch.tensor([5, 9]), 4)
    with pytest.raises(ValueError, match="more than --size"):
        added_tokens(torch.tensor([3, 5, 6]), torch.tensor([1]), 2)


def test_the_widened_head_keeps_its_logits_and_reads_new_tokens_with_target_rows(tmp_path):
    target = tiny_llama(vocab=64, layers=6, hidden=32)
    head = tiny_eagle3_head(target, seed=1, draft_vocab_size=24).float()
    held = head.draft_token_ids()
    new = added_tokens(held, torch.randperm(64, generator=torch.Generator().manual_seed(0)), 40)
    rows = target.get_output_embeddings().weight.detach()
    wide = widened(head, rows, new)

    ids = wide.draft_token_ids()
    assert wide.draft_vocab_size == 40 and set(ids.tolist()) == set(held.tolist()) | set(new.tolist())
    features = torch.randn(3, 32)
    old_logits = head.drafting_lm_head()(features)
    new_logits = wide.drafting_lm_head()(features)
    where = {t: i for i, t in enumerate(ids.tolist())}
    assert torch.allclose(new_logits[:, [where[t] for t in held.tolist()]], old_logits, atol=1e-6)
    normed = wide.norm(features)
    assert torch.allclose(new_logits[:, [where[t] for t in new.tolist()]], normed @ rows[new].T, atol=1e-5)
    assert torch.equal(wide.fc.weight, head.fc.weight)

    loaded = load_eagle3_head(save_eagle3_head(wide, tmp_path / "wide"), target)
    assert torch.equal(loaded.draft_token_ids(), ids)
    assert row_drift(head.lm_head.weight, head.lm_head.weight)["cosine_median"] == pytest.approx(1.0)
