"""Own answers (the EAGLE-3 recipe's data): each ShareGPT conversation's user turns, cut from its token shard
at the answer spans, answered by the real SmolLM2 through the batched engine turn by turn, each exactly as a
plain greedy loop answers it alone after the target's own earlier answers; the same shard layout (so the same
held-out split); long prompts counted; resumable."""

from __future__ import annotations

import pytest
import torch

from eagle2.prompts.chat import stop_ids
from eagle2.training.corpora.own_answers import build_own_answer_shards, user_segments
from eagle2.training.corpora.sharegpt import encode_with_spans
from eagle2.training.shards import read_token_shard, write_token_shard

QUESTIONS = [(["Name a colour."], ["Blue."]), (["What is 2 + 3?", "And 4 + 4?"], ["5.", "8."]),
             (["Write one word about the sea."], ["Waves."]),
             (["Tell me about " + "the history of bread and " * 40 + "why it matters."], ["Bread is old."])]


def _source_shards(tokenizer, folder):
    stops = stop_ids(tokenizer)
    convs = [encode_with_spans(tokenizer, "tokenizer", u, a, None, stops, 2048) for u, a in QUESTIONS]
    write_token_shard(folder / "tokens_00000.npz", convs[:2], {"conversations": [{"id": "a"}, {"id": "b"}]})
    write_token_shard(folder / "tokens_00001.npz", convs[2:], {"conversations": [{"id": "c"}, {"id": "d"}]})
    return convs


@torch.no_grad()
def _greedy_alone(model, prompt, stops, n):
    ids = list(prompt)
    for _ in range(n):
        nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(nxt)
        if nxt in stops:
            break
    return ids[len(prompt):]


@pytest.mark.heavy  # decodes SmolLM2 twice (the batched stage and a greedy loop): in CI after make test
def test_first_turns_are_answered_as_a_greedy_loop_answers_them_alone(smollm2, tmp_path):
    model, tok = smollm2
    source, out = tmp_path / "tokens", tmp_path / "own"
    source.mkdir()
    convs = _source_shards(tok, source)
    stops = stop_ids(tok)
    totals = build_own_answer_shards(model, source, out, stops=stops, max_prompt_tokens=200, max_new_tokens=12,
                                     batch_size=2)
    assert totals["prompt_too_long"] == 1 and totals["conversations"] == 3 and totals["turns"] == 4
    made = [read_token_shard(out / f"tokens_0000{k}.npz") for k in (0, 1)]
    assert [m["conversations"] for _, m in made] == [[{"id": "a"}, {"id": "b"}], [{"id": "c"}]]
    answered = made[0][0] + made[1][0]
    for (ids, spans), conv in zip(answered, convs[:3]):
        segments = user_segments(conv)
        assert len(spans) == len(segments)  # every turn answered (each earlier answer ended in a stop token)
        context = []
        for segment, (a, b) in zip(segments, spans):
            prompt = context + segment
            assert ids[:a] == prompt and segment[-3:] == tok("<|im_start|>assistant\n",
                                                               add_special_tokens=False)["input_ids"][-3:]
            assert ids[a:b] == _greedy_alone(model, prompt, stops, 12)
            assert ids[b - 1] in stops or b == spans[-1][1]  # only the last answer may be cut
            context = ids[:b]
    # the second turn follows the target's own first answer, not the dataset's
    assert answered[1][0][: answered[1][1][0][1]] != convs[1][0][: convs[1][1][0][1]]
    written = (out / "tokens_00000.npz").stat().st_mtime_ns
    assert build_own_answer_shards(model, source, out, stops=stops, max_prompt_tokens=200, max_new_tokens=12,
                                   batch_size=2, shards=1)["conversations"] == 2
    assert (out / "tokens_00000.npz").stat().st_mtime_ns == written  # resumed: nothing decoded again


def test_a_corpus_folder_as_val_set_gives_that_corpus_held_out_conversations(tmp_path):
    import pytest
    from omegaconf import OmegaConf

    from eagle2.training.evaluation.heldout import validation

    (tmp_path / "val").mkdir()
    for k in range(3):  # 3 shards: too few for every 50th, so the last is held out
        write_token_shard(tmp_path / "val" / f"tokens_{k:05d}.npz", [([1, 2, 3, 4 + k], [(2, 4)])])
    cfg = OmegaConf.create({"train": {"head": {"val_set": "val", "val_fraction": 0.02}}})
    seqs = validation(None, None, cfg, tmp_path, "head")["val_seqs"]
    assert len(seqs) == 1 and seqs[0].tokens.tolist() == [1, 2, 3, 6]
    cfg.train.head.val_set = "no_such_folder"
    with pytest.raises(ValueError, match="corpus, mtbench or a corpus folder"):
        validation(None, None, cfg, tmp_path, "head")


def test_workers_share_the_shards_each_its_own_first(tmp_path, monkeypatch):
    """Worker i of n answers source shards i, i + n, ... first, then helps with the others' (the corpus stage's
    ``worker_batches``); a shard already written is skipped (here the decoding is stubbed: which shard, when)."""
    from types import SimpleNamespace

    from eagle2.training.corpora import own_answers

    source, out = tmp_path / "tokens", tmp_path / "own"
    source.mkdir()
    for k in range(5):  # shard k holds k + 1 conversations: the stub reads the shard off its length
        write_token_shard(source / f"tokens_{k:05d}.npz", [([1, 2, 3, 4, 5, 6], [(3, 6)])] * (k + 1), {})
    answered = []

    def stub(target, segments, stops, **_):
        answered.append(len(segments) - 1)
        return [([1, 2, 3, 9], [(3, 4)]) for _ in segments], {"turns": len(segments), "prompt_too_long": 0}

    monkeypatch.setattr(own_answers, "answer_turns", stub)
    target = SimpleNamespace(device=torch.device("cpu"))
    build_own_answer_shards(target, source, out, stops={9}, shards=4, worker=1, workers=2)
    assert answered == [1, 3, 2, 0]  # its own (1, 3), then the others' from the end
    answered.clear()
    totals = build_own_answer_shards(target, source, out, stops={9}, shards=5, worker=0, workers=2)
    assert answered == [4] and totals["conversations"] == 15  # shard 4 was left: the rest are skipped
    with pytest.raises(ValueError, match="train.own_answers.worker=2"):
        build_own_answer_shards(target, source, out, stops={9}, worker=2, workers=2)
