"""Greedy losslessness: every method's output is token-identical to plain decoding (fp32), and
plain decoding is token-identical to transformers' generate()."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.engine as engine
from eagle2.chat import encode_conversation
from eagle2.drafters import build_drafter
from eagle2.sampling import SamplingParams
from tests.conftest import PROFILE_DIR, tiny_head, tiny_llama

GREEDY = SamplingParams()
SPEC_METHODS = {
    "sps": {"name": "sps", "k": 3},
    "eagle": {"name": "eagle", "choices": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]},
    "eagle2": {"name": "eagle2", "depth": 4, "top_k": 4, "total_tokens": 10},
    "eagle2_auto": {"name": "eagle2", "depth": 3, "top_k": 4, "total_tokens": "auto", "max_total_tokens": 10,
                    "profile_dir": PROFILE_DIR},
}
PROMPTS = [[2, 5, 3], [7, 7, 1 + 2, 9, 4, 11], [3]]


def decode(target, method, prompt, n, head=None, draft=None, eos=frozenset()):
    drafter = build_drafter(OmegaConf.create(method), target, GREEDY, None, head=head, draft_model=draft)
    return engine.generate(target, drafter, prompt, GREEDY, n, set(eos))


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)
    return target, tiny_llama(vocab=16, layers=1, seed=1, scale=10.0), tiny_head(target, seed=2)


def test_plain_equals_generate_on_tiny_llama(tiny):
    target = tiny[0]
    for prompt in PROMPTS:
        ours = decode(target, {"name": "plain"}, prompt, 30).output_ids
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
        assert ours == ref


@pytest.mark.parametrize("name", list(SPEC_METHODS))
@pytest.mark.parametrize("draft_kind", ["random", "self"])
def test_speculative_equals_plain_on_tiny(tiny, name, draft_kind):
    target, draft, head = tiny
    if draft_kind == "self":  # drafts that are mostly right: the target as its own SpS draft
        if name != "sps":
            pytest.skip("a head cannot be the target")
        draft = target
    accepted = 0
    for prompt in PROMPTS:
        ref = decode(target, {"name": "plain"}, prompt, 40).output_ids
        out = decode(target, SPEC_METHODS[name], prompt, 40, head=head, draft=draft)
        assert out.output_ids == ref
        accepted += sum(out.accept_lengths) - out.target_forwards
    if draft_kind == "self":
        assert accepted > 60  # the accept-all regime was really exercised


def test_eos_and_max_new_tokens_stop(tiny):
    target, _, head = tiny
    ref = decode(target, {"name": "plain"}, PROMPTS[1], 40).output_ids
    eos = ref[7]
    for method in ({"name": "plain"}, SPEC_METHODS["eagle2"]):
        out = decode(target, method, PROMPTS[1], 40, head=head, eos={eos})
        assert out.output_ids == ref[: ref.index(eos) + 1]
        assert sum(out.accept_lengths) == out.new_tokens - 1
        assert decode(target, method, PROMPTS[1], 5, head=head).output_ids == ref[:5]


def test_wrong_commit_breaks_identity(tiny, monkeypatch):
    """Negative control: committing the first nodes instead of the accepted path is caught."""
    target, _, head = tiny
    real = engine.keep_tree_path
    monkeypatch.setattr(engine, "keep_tree_path", lambda cache, prefix, nodes: real(cache, prefix,
                                                                                   list(range(len(nodes)))))
    mismatches = 0
    for prompt in PROMPTS:
        ref = decode(target, {"name": "plain"}, prompt, 40).output_ids
        mismatches += decode(target, SPEC_METHODS["eagle2"], prompt, 40, head=head).output_ids != ref
    assert mismatches > 0


QUESTIONS = ["What is the capital of France?", "Write a haiku about autumn.",
             "Explain why the sky is blue in two sentences."]


def test_plain_equals_generate_on_smollm2(smollm2):
    model, tok = smollm2
    for q in QUESTIONS[:2]:
        prompt = encode_conversation(tok, "tokenizer", [q], [])
        ours = decode(model, {"name": "plain"}, prompt, 24, eos={tok.eos_token_id}).output_ids
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):].tolist()
        assert ours == ref


@pytest.mark.parametrize("name", list(SPEC_METHODS))
def test_speculative_equals_plain_on_smollm2(smollm2, name):
    model, tok = smollm2
    head = tiny_head(model, seed=0)  # an untrained head: drafts mostly rejected
    for q in QUESTIONS:
        prompt = encode_conversation(tok, "tokenizer", [q], [])
        ref = decode(model, {"name": "plain"}, prompt, 20, eos={tok.eos_token_id}).output_ids
        draft = model if name == "sps" else None  # the target as its own draft: drafts mostly accepted
        out = decode(model, SPEC_METHODS[name], prompt, 20, head=head, draft=draft, eos={tok.eos_token_id})
        assert out.output_ids == ref


def test_reduced_draft_vocabulary_stays_lossless(tiny):
    target, _, head = tiny
    head.draft_vocab = torch.tensor([5, 3, 9, 1, 12, 7])  # drafts only ever use these tokens
    try:
        method = {**SPEC_METHODS["eagle2"], "draft_vocab_size": 4, "draft_lm_head_dtype": "bfloat16"}
        for prompt in PROMPTS:
            ref = decode(target, {"name": "plain"}, prompt, 30).output_ids
            out = decode(target, method, prompt, 30, head=head)
            assert out.output_ids == ref
        drafter = build_drafter(OmegaConf.create(method), target, GREEDY, None, head=head)
        hidden = target.model(torch.tensor([PROMPTS[1]])).last_hidden_state[0].detach()
        drafter.start(PROMPTS[1], 2, hidden)
        assert set(drafter.propose(2, room=50).tokens[1:].tolist()) <= {5, 3, 9, 1}
    finally:
        head.draft_vocab = None
