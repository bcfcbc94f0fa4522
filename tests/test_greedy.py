"""Greedy losslessness: every method's output is token-identical to plain decoding (fp32), and
plain decoding is token-identical to transformers' generate(). The tiny-model identity tests also run
on a CUDA device in fp16 and bf16 (marked ``gpu``; tests/devices.py), judged there by the identity audit."""

from __future__ import annotations

import functools

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.core.engine as engine
from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import DraftTree
from eagle2.prompts.chat import encode_conversation
from tests.conftest import PROFILE_DIR, shared_drafter_weights, tiny_head, tiny_llama
from tests.devices import assert_greedy_lossless, device_params, on

GREEDY = SamplingParams()
SPEC_METHODS = {
    "sps": {"name": "sps", "k": 3},
    "eagle": {"name": "eagle", "choices": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]},
    "eagle2": {"name": "eagle2", "depth": 4, "top_k": 4, "total_tokens": 10},
    "eagle2_auto": {"name": "eagle2", "depth": 3, "top_k": 4, "total_tokens": "auto", "max_total_tokens": 10,
                    "profile_dir": PROFILE_DIR},
    "eagle3": {"name": "eagle3", "depth": 4, "top_k": 4, "total_tokens": 10},  # a random EAGLE-3 head per target
    "peagle": {"name": "peagle", "depth": 4, "top_k": 3, "total_tokens": 8},  # a random P-EAGLE head per target
    "dflash": {"name": "dflash", "top_k": 2, "total_tokens": 7},  # a random DFlash draft model per target (block 5)
    "pard": {"name": "pard", "depth": 4, "top_k": 3, "total_tokens": 8},  # a PARD draft per target (conftest)
}
PROMPTS = [[2, 5, 3], [7, 7, 1 + 2, 9, 4, 11], [3]]


def decode(target, method, prompt, n, head=None, draft=None, eos=frozenset()):
    drafter = build_drafter(OmegaConf.create(method), target, GREEDY, None, head=head, sps_draft=draft,
                            weights=shared_drafter_weights(target, method))
    return engine.generate(target, drafter, prompt, GREEDY, n, set(eos))


@pytest.fixture(scope="module", params=device_params())
def tiny_on(tiny, request):
    """(device and dtype, fp32 target, the tiny models on that device and dtype)."""
    return request.param, tiny[0], on(request.param, *tiny)


def test_plain_equals_generate_on_tiny_llama(tiny_on):
    (device, dtype), target32, (target, _, _) = tiny_on
    for prompt in PROMPTS:
        ours = decode(target, {"name": "plain"}, prompt, 30).output_ids
        ref = target.generate(torch.tensor([prompt], device=device), max_new_tokens=30, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert_greedy_lossless(target32, dtype, prompt, ours, ref)


@pytest.mark.parametrize("name", list(SPEC_METHODS))
@pytest.mark.parametrize("draft_kind", ["random", "self"])
def test_speculative_equals_plain_on_tiny(tiny_on, name, draft_kind):
    (device, dtype), target32, (target, draft, head) = tiny_on
    if draft_kind == "self":  # drafts that are mostly right: the target as its own SpS draft
        if name != "sps":
            pytest.skip("a head cannot be the target")
        draft = target
    accepted = 0
    for prompt in PROMPTS:
        ref = decode(target, {"name": "plain"}, prompt, 40).output_ids
        out = decode(target, SPEC_METHODS[name], prompt, 40, head=head, draft=draft)
        assert_greedy_lossless(target32, dtype, prompt, out.output_ids, ref)
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


@pytest.fixture(scope="module")
def smollm2_plain(smollm2):
    """question -> its plain greedy answer on SmolLM2 (24 new tokens at most), decoded on first use and kept for this
    module's tests: the first n tokens of it are what plain decoding of n tokens gives."""
    model, tok = smollm2

    @functools.cache
    def answer(question: str) -> list[int]:
        return decode(model, {"name": "plain"}, encode_conversation(tok, "tokenizer", [question], []), 24,
                      eos={tok.eos_token_id}).output_ids
    return answer


def test_plain_equals_generate_on_smollm2(smollm2, smollm2_plain):
    model, tok = smollm2
    for q in QUESTIONS[:2]:
        prompt = encode_conversation(tok, "tokenizer", [q], [])
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):].tolist()
        assert smollm2_plain(q) == ref


# make test keeps EAGLE-2 on the real SmolLM2; every method's identity is also checked by default on the tiny targets
# above and on the zoo's stand-in (test_zoo), so the other methods run here in CI after make test (heavy)
@pytest.mark.parametrize("name", [n if n == "eagle2" else pytest.param(n, marks=pytest.mark.heavy)
                                  for n in SPEC_METHODS])
def test_speculative_equals_plain_on_smollm2(smollm2, smollm2_plain, name):
    model, tok = smollm2
    head = tiny_head(model, seed=0)  # an untrained head: drafts mostly rejected
    for q in QUESTIONS:
        prompt = encode_conversation(tok, "tokenizer", [q], [])
        ref = smollm2_plain(q)[:20]
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


class SiblingOracle:
    """A drafter (eagle2/core/engine.py's interface) that proposes the target's own greedy continuation
    ``reference`` ``depth`` levels deep, never as a first child: at depth d the right token is sibling
    rank 1 + d % 2, after wrong siblings that each carry a wrong child. A lossless engine accepts every
    level, so each round commits depth + 1 tokens through non-first children."""

    needs_hidden = False
    forward_time = 0.0

    def __init__(self, reference: list[int], vocab: int, depth: int = 4):
        self.reference, self.vocab, self.depth, self.committed = reference, vocab, depth, 0

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.committed = 1

    def observe(self, new_tokens, hidden) -> None:
        self.committed += len(new_tokens)

    def propose(self, root: int, room: int):
        tokens, parents, parent = [root], [-1], 0
        for d, right in enumerate(self.reference[self.committed: self.committed + self.depth], 1):
            for k in range(1, 2 + d % 2):
                wrong = (right + k) % self.vocab
                tokens += [wrong, (wrong + 1) % self.vocab]
                parents += [parent, len(tokens) - 2]
            tokens.append(right)
            parents.append(parent)
            parent = len(tokens) - 1
        return DraftTree(torch.tensor(tokens[:room]), torch.tensor(parents[:room]))


def oracle_decode(target, prompt, n, eos=frozenset(), reference=None):
    """(plain output, oracle output) for ``n`` new tokens; ``reference``: the plain output of ``n + 8`` tokens, when
    already decoded."""
    reference = reference or decode(target, {"name": "plain"}, prompt, n + 8, eos=eos).output_ids
    oracle = SiblingOracle(reference, target.config.vocab_size)
    return reference[:n], engine.generate(target, oracle, prompt, GREEDY, n, set(eos))


@pytest.fixture(scope="module")
def positional():
    """A tiny target whose attention is sharp (q and k scaled up), so that its outputs depend on
    position ids; random tiny Llamas attend almost uniformly and hardly notice wrong positions."""
    target = tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)
    with torch.no_grad():
        for layer in target.model.layers:
            layer.self_attn.q_proj.weight.mul_(16.0)
            layer.self_attn.k_proj.weight.mul_(16.0)
    return target


def flattened_position_ids(tree, prefix_len, device=None):
    return (torch.arange(len(tree)) + prefix_len)[None].to(device)


def test_deep_non_first_child_acceptance_equals_plain(positional):
    for prompt in PROMPTS:
        ref, out = oracle_decode(positional, prompt, 40)
        assert out.output_ids == ref
        assert out.accept_lengths[:-1] == [5] * (len(out.accept_lengths) - 1)  # 4 levels + the bonus, every round


def test_flattened_position_ids_break_deep_sibling_identity(positional, monkeypatch):
    """Negative control: position ids from the flattened tree index instead of depth are caught."""
    monkeypatch.setattr(DraftTree, "position_ids", flattened_position_ids)
    for prompt in PROMPTS:
        ref, out = oracle_decode(positional, prompt, 40)
        assert out.output_ids != ref


def test_deep_non_first_child_acceptance_equals_plain_on_smollm2(smollm2, smollm2_plain, monkeypatch):
    model, tok = smollm2
    prompt, plain = encode_conversation(tok, "tokenizer", [QUESTIONS[0]], []), smollm2_plain(QUESTIONS[0])
    ref, out = oracle_decode(model, prompt, 16, eos={tok.eos_token_id}, reference=plain)
    assert out.output_ids == ref and max(out.accept_lengths) == 5
    monkeypatch.setattr(DraftTree, "position_ids", flattened_position_ids)
    assert oracle_decode(model, prompt, 16, eos={tok.eos_token_id}, reference=plain)[1].output_ids != ref
