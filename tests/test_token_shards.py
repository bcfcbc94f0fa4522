"""Token shards (the committed token-only corpus), their rebuild into feature shards, and answer masks
(several answers per sequence) in training and evaluation, on tiny random models (seconds)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from eagle2.training.corpora.prompts import build_corpus
from eagle2.training.data import Sequence, all_sequences, collate
from eagle2.training.features import tokens_to_features
from eagle2.training.objectives.eagle import head_loss
from eagle2.training.shards import read_token_shard, write_token_shard
from eagle2.training.support.losses import LossProjection
from tests.conftest import tiny_head
from tests.test_training import PROMPTS, ByteTokenizer, tiny_target


def test_token_shard_round_trip_and_size(tmp_path):
    convs = [([5, 6, 7, 8, 9], [(2, 4)]), ([1, 2, 3], [(0, 1), (2, 3)]), (list(range(4000)), [(100, 4000)])]
    path = write_token_shard(tmp_path / "tokens_00000.npz", convs, {"note": "x", "n": [1, 2]})
    back, meta = read_token_shard(path)
    assert back == convs and meta == {"note": "x", "n": [1, 2]}
    big = [([70000, 3, 65536], [(1, 3)])]  # ids >= 2**16 are kept as int32
    assert read_token_shard(write_token_shard(tmp_path / "tokens_00001.npz", big))[0] == big
    g = torch.Generator().manual_seed(0)  # ~1M tokens of a 49k vocabulary: under 4 MB
    ids = torch.randint(49152, (1 << 20,), generator=g).tolist()
    path = write_token_shard(tmp_path / "tokens_00002.npz", [(ids[i:i + 512], [(100, 512)])
                                                             for i in range(0, len(ids), 512)])
    assert path.stat().st_size < 4e6


def features_to_tokens(feature_dir, token_dir) -> int:
    """Token shards of a decoded feature corpus (one answer per sequence), one per feature shard, same index."""
    paths = sorted(feature_dir.glob("shard_*.safetensors"))
    token_dir.mkdir()
    for path in paths:
        shard = load_file(str(path))
        offsets, starts = shard["offsets"].tolist(), shard["response_start"].tolist()
        convs = [(shard["tokens"][a:b].tolist(), [(s, b - a)]) for a, b, s in zip(offsets[:-1], offsets[1:], starts)]
        write_token_shard(token_dir / path.name.replace("shard_", "tokens_").replace(".safetensors", ".npz"), convs)
    return len(paths)


def test_tokens_to_features_equals_the_decoded_corpus(tmp_path):
    """Feature shards -> token shards -> feature shards gives the decoding path's shards back: the same
    tokens, offsets and response_start, no answer_mask, and its features (both kinds) to fp16 rounding."""
    target = tiny_target()
    build_corpus(target, ByteTokenizer(), PROMPTS, tmp_path / "old", template="vicuna", system_prompt="S",
                 batch_size=4, max_new_tokens=16, max_prompt_tokens=128, temperature=0.0, samples_per_prompt=1,
                 seed=0, tap_layers=(0, 1, 2))
    assert features_to_tokens(tmp_path / "old", tmp_path / "tokens") == 4
    tokens_to_features(target, tmp_path / "tokens", tmp_path / "new", pad_id=0, tap_layers=(0, 1, 2),
                       token_budget=100)
    for path in sorted((tmp_path / "old").glob("shard_*.safetensors")):
        old, new = load_file(str(path)), load_file(str(tmp_path / "new" / path.name))
        assert set(old) == set(new) and "answer_mask" not in new
        for key in ("tokens", "offsets", "response_start", "tap_layers"):
            assert torch.equal(old[key], new[key]), key
        for key in ("features", "layer_features"):
            torch.testing.assert_close(new[key].float(), old[key].float(), atol=2e-2, rtol=1e-2)
    stamp = (tmp_path / "new" / path.name).stat().st_mtime_ns  # resumable: written shards are kept
    tokens_to_features(target, tmp_path / "tokens", tmp_path / "new", pad_id=0, tap_layers=(0, 1, 2))
    assert (tmp_path / "new" / path.name).stat().st_mtime_ns == stamp


def test_two_answer_conversations_count_only_their_answers(tmp_path):
    """Two answer spans: the shard gets an answer_mask, its features equal a plain forward, and the head
    loss counts exactly the positions whose next token is an answer token."""
    from eagle2.core.cache import forward_target, new_cache

    target = tiny_target()
    g = torch.Generator().manual_seed(0)
    convs = [(torch.randint(2, 64, (n,), generator=g).tolist(), [(4, 9), (14, n)]) for n in (20, 31, 25)]
    (tmp_path / "tok").mkdir()
    write_token_shard(tmp_path / "tok" / "tokens_00000.npz", convs)
    tokens_to_features(target, tmp_path / "tok", tmp_path / "feat", pad_id=0)
    shard = load_file(str(tmp_path / "feat" / "shard_00000.safetensors"))
    assert shard["response_start"].tolist() == [4, 4, 4] and int(shard["answer_mask"].sum()) == sum(
        5 + n - 14 for n in (20, 31, 25))
    seqs = all_sequences(tmp_path / "feat")
    for seq, (ids, _) in zip(seqs, convs):
        assert seq.tokens.tolist() == ids and seq.answer_mask[:4].sum() == 0 and seq.answer_mask[9:14].sum() == 0
        with torch.no_grad():
            full = forward_target(target, seq.tokens[None], new_cache(target))[0]
        torch.testing.assert_close(seq.features.float(), full, atol=1e-2, rtol=1e-2)
    batch = collate(seqs, "cpu")
    want = sum(int(s.answer_mask[1:].sum()) for s in seqs)
    proj = LossProjection(target.get_output_embeddings())
    with torch.no_grad():
        _, stats = head_loss(tiny_head(target), batch, proj=proj, noise=0.0, w_reg=1.0, w_cls=0.1, train=False)
    assert stats["n"] == want


def test_an_answer_mask_from_start_on_changes_nothing(tmp_path):
    """A sequence whose answer_mask marks everything from ``start`` on trains (head, draft, Medusa) and
    evaluates exactly as the same sequence without a mask."""
    from eagle2.heads.draft_model import build_draft_model
    from eagle2.training.evaluation.evaluate import chain_anchors
    from eagle2.training.objectives.draft import draft_loss
    from eagle2.training.objectives.medusa import medusa_targets

    target = tiny_target()
    g = torch.Generator().manual_seed(1)
    plain = [Sequence(torch.randint(2, 64, (n,), generator=g), torch.randn(n, 32, generator=g), s)
             for n, s in ((12, 5), (20, 3), (7, 6))]
    masked = [s._replace(answer_mask=torch.arange(len(s.tokens)) >= s.start) for s in plain]
    a, b = collate(plain, "cpu"), collate(masked, "cpu")
    assert "answer" in b and "answer" not in a
    proj = LossProjection(target.get_output_embeddings())
    head, draft = tiny_head(target), build_draft_model(target, 1)
    with torch.no_grad():
        for fn, module in ((head_loss, head), (draft_loss, draft)):
            kw = dict(noise=0.0, w_reg=1.0, w_cls=0.1) if fn is head_loss else {}
            la, sa = fn(module, a, proj=proj, train=False, **kw)
            lb, sb = fn(module, b, proj=proj, train=False, **kw)
            assert sa["n"] == sb["n"] and torch.equal(la, lb)
    for k in range(3):
        assert torch.equal(medusa_targets(20, a["start"], a["valid"], k),
                           medusa_targets(20, b["start"], b["valid"], k, b["answer"]))
    for s, m in zip(plain, masked):
        assert chain_anchors(len(s.tokens), s.start, 2, 1) == chain_anchors(len(m.tokens), m.start, 2, 1, None,
                                                                                m.answer_mask)
