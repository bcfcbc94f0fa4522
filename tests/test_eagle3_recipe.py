"""The EAGLE-3 authors' recipe as settings: EAGLE-3.1's norms (forward, save/load, lossless decoding on the
eager and the lean path), the draft vocabulary by coverage, the masked out-of-vocabulary positions and the taps;
on tiny random Llamas (CPU, seconds)."""

from __future__ import annotations

import json

import pytest
import torch

from eagle2.bench.methods import build_drafter
from eagle2.core.engine import generate
from eagle2.heads.eagle3_head import load_eagle3_head, save_eagle3_head
from eagle2.heads.eagle_head import causal_mask
from eagle2.training.data import all_sequences, collate
from eagle2.training.objectives.eagle3 import (
    coverage_size,
    draft_vocabulary_ids,
    eagle3_loss,
    eagle3_setup,
    in_draft_vocab,
)
from eagle2.training.support.losses import LossProjection
from tests.conftest import tiny_eagle3_head, tiny_llama
from tests.test_compiled_heads import assert_same_drafting, on_compiled_path
from tests.test_eagle3 import EAGLE3, GREEDY
from tests.test_eagle3_training import corpus, eagle3_cfg, target  # noqa: F401 (fixtures)
from tests.test_greedy import PROMPTS

pytestmark = pytest.mark.usefixtures("synthetic_cost_profile")


@pytest.fixture(scope="module")
def tiny6():
    return tiny_llama(vocab=64, layers=6, seed=3, scale=4.0)


def head_output(head, model, ids):
    feats = torch.randn(1, ids.shape[1], len(head.feature_layers) * model.config.hidden_size,
                        generator=torch.Generator().manual_seed(0))
    n = ids.shape[1]
    with torch.no_grad():
        return head(ids, feats, position_ids=torch.arange(n)[None], attention_mask=causal_mask(n, 0, feats.dtype))


def test_eagle31_norms_change_the_forward_and_round_trip(tiny6, tmp_path):
    head31 = tiny_eagle3_head(tiny6, seed=2, draft_vocab_size=40, eagle31=True)
    plain = tiny_eagle3_head(tiny6, seed=2, draft_vocab_size=40)
    plain.load_state_dict({k: v for k, v in head31.state_dict().items() if "tap_norms" not in k})
    ids = torch.tensor([[5, 9, 2, 7, 7, 3]])
    out31, out3 = head_output(head31, tiny6, ids), head_output(plain, tiny6, ids)
    assert not torch.allclose(out31, out3, atol=1e-3)  # the same weights read the features otherwise
    folder = save_eagle3_head(head31, tmp_path / "h31")
    config = json.loads((folder / "config.json").read_text())
    assert config["tap_norms"] is True and config["norm_before_residual"] is True
    loaded = load_eagle3_head(folder, tiny6)
    torch.testing.assert_close(head_output(loaded, tiny6, ids), out31)
    # an EAGLE-3 head's config has neither flag and loads as before, without the norms
    config3 = json.loads((save_eagle3_head(plain, tmp_path / "h3") / "config.json").read_text())
    assert "tap_norms" not in config3 and "norm_before_residual" not in config3
    loaded3 = load_eagle3_head(tmp_path / "h3", tiny6)
    assert loaded3.tap_norms is None and not loaded3.midlayer.norm_before_residual
    torch.testing.assert_close(head_output(loaded3, tiny6, ids), out3)


def test_each_eagle31_norm_acts(tiny6):
    """Either flag alone changes the output (a head that ignored one would pass the round trip)."""
    base = tiny_eagle3_head(tiny6, seed=2, eagle31=True)
    ids = torch.tensor([[5, 9, 2, 7]])
    full = head_output(base, tiny6, ids)
    base.midlayer.norm_before_residual = False
    assert not torch.allclose(head_output(base, tiny6, ids), full, atol=1e-3)
    base.midlayer.norm_before_residual, norms = True, base.tap_norms
    base.tap_norms = None
    assert not torch.allclose(head_output(base, tiny6, ids), full, atol=1e-3)
    base.tap_norms = norms


@pytest.mark.parametrize("draft_vocab", [None, 40])
def test_eagle3_method_with_an_eagle31_head_is_lossless(tiny6, draft_vocab):
    head = tiny_eagle3_head(tiny6, seed=4, draft_vocab_size=draft_vocab, eagle31=True)
    plain = build_drafter(type(EAGLE3)({"name": "plain"}), tiny6, GREEDY, None)
    for prompt in ([2, 5, 3], [7, 7, 3, 9, 4, 11]):
        want = generate(tiny6, plain, prompt, GREEDY, 24, set()).output_ids
        drafter = build_drafter(EAGLE3, tiny6, GREEDY, None, weights={"eagle3_head": head})
        assert generate(tiny6, drafter, prompt, GREEDY, 24, set()).output_ids == want


def test_the_lean_path_drafts_an_eagle31_head_as_eager():
    model = tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)
    head = tiny_eagle3_head(model, seed=5, eagle31=True)
    assert_same_drafting(model, "eagle3", head, on_compiled_path(head, compile=False), PROMPTS)


def test_coverage_size_is_the_fewest_tokens_covering_the_share():
    counts = torch.tensor([1, 5, 0, 3, 1])  # sorted: 5, 3, 1, 1 of 10
    assert [coverage_size(counts, c) for c in (0.5, 0.8, 0.81, 0.9, 1.0)] == [1, 2, 3, 3, 4]
    with pytest.raises(ValueError, match="draft_vocab_coverage"):
        coverage_size(counts, 1.5)


def test_draft_vocabulary_by_coverage_covers_the_answers(corpus):  # noqa: F811
    answers = torch.cat([s.tokens[s.start:] for s in all_sequences(corpus)])
    for share in (0.5, 0.9):
        ids = draft_vocabulary_ids(corpus, None, 64, coverage=share)
        covered = torch.isin(answers, ids).float().mean()
        assert covered >= share and len(ids) == coverage_size(torch.bincount(answers, minlength=64), share)


def test_masked_positions_leave_the_loss_exactly(target, corpus):  # noqa: F811
    """A planted batch: the masked loss equals the unmasked loss with the out-of-vocabulary positions taken
    out of the answer by hand, and differs from the unmasked loss."""
    head, _, _ = eagle3_setup(target, corpus, eagle3_cfg(draft_vocab_size=12))
    proj = LossProjection(target.get_output_embeddings(), torch.float32)
    batch = collate(all_sequences(corpus)[:4], None)
    y = batch["features"][:, 1:]  # head position j is fitted to f[j+1]
    keep = in_draft_vocab(head, proj(y.reshape(-1, y.shape[-1])).argmax(-1)).reshape(y.shape[:2])
    assert 0 < int((~keep).sum()) and bool(keep.any())
    from eagle2.training.support.losses import answer_positions

    answer = torch.zeros_like(batch["valid"])
    answer[:, 1:] = answer_positions(batch) & keep  # the answer, less the out-of-vocabulary positions
    planted = dict(batch, answer=answer)
    kw = {"proj": proj, "unroll": 1, "train": True, "with_stats": False}
    masked, stats = eagle3_loss(head, batch, mask_out_of_vocab=True, **kw)
    by_hand, _ = eagle3_loss(head, planted, **kw)
    unmasked, _ = eagle3_loss(head, batch, **kw)
    torch.testing.assert_close(masked, by_hand)
    assert abs(float(masked.detach()) - float(unmasked.detach())) > 1e-4 and 0 < stats["oov"] < 1


def test_taps_and_eagle31_settings_build_the_head(target, corpus):  # noqa: F811
    head, _, extra = eagle3_setup(target, corpus, eagle3_cfg(taps=[1, 3, 4], eagle31_norms=True,
                                                             mask_out_of_vocab=True))
    assert head.feature_layers == (1, 3, 4) and head.fc.weight.shape[1] == 3 * target.config.hidden_size
    assert head.tap_norms is not None and head.midlayer.norm_before_residual
    assert extra["taps"] == [1, 3, 4] and extra["eagle31_norms"] and extra["mask_out_of_vocab"]
    _, _, default = eagle3_setup(target, corpus, eagle3_cfg())
    assert not {"taps", "eagle31_norms", "mask_out_of_vocab"} & set(default)  # older checkpoints resume


def test_unrolled_loss_reads_each_steps_own_target_positions(target, corpus):  # noqa: F811
    """unroll 3 with the out-of-vocabulary mask and step decay: the loss (its target side computed once per
    position) equals the steps' losses computed by hand, each from the target at its own positions j + s."""
    from eagle2.training.support.losses import LogitsSoftCrossEntropy, answer_positions, unrolled_predictions

    head, _, _ = eagle3_setup(target, corpus, eagle3_cfg(draft_vocab_size=12))
    proj = LossProjection(target.get_output_embeddings(), torch.float32)
    batch = collate(all_sequences(corpus)[:4], None)
    loss, _ = eagle3_loss(head, batch, proj=proj, unroll=3, step_decay=0.8, mask_out_of_vocab=True,
                          train=True, with_stats=False)
    weight = proj.weight[head.draft_token_ids()]
    by_hand, weights = [], []
    for step, pred, sel in unrolled_predictions(head, batch["tokens"], batch["layer_features"][:, :-1],
                                                answer_positions(batch), 3):
        y = batch["features"][:, step:][sel]
        keep = in_draft_vocab(head, proj(y).argmax(-1))
        q = torch.softmax(y[keep] @ weight.T, -1)
        by_hand.append(LogitsSoftCrossEntropy.apply(head.drafting_lm_head()(pred[sel][keep]), q))
        weights.append(0.8 ** (step - 1))
    expected = sum(w * part for w, part in zip(weights, by_hand)) / sum(weights)
    torch.testing.assert_close(loss, expected)
