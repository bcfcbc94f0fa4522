"""REST, SuffixDecoding and SAMD are lossless by the project's own certifications, reused as for PLD
(``test_lossless_new_methods``):

- temperature 0: token-identical to plain decoding in fp32 on tiny random models with drafts really
  accepted (REST retrieves from ``tests.conftest.shared_rest_datastore``: the target's own greedy
  continuations and random sequences), and on SmolLM2 with a datastore of the shipped conversations
  corpus; a top-2 acceptance rule breaks it;
- temperature > 0: one real engine round enumerated exactly matches the target's joint distribution
  (``test_certification_exact``), and always-accept / the bonus from the parent's distribution are
  rejected. Batched decoding is covered by ``test_batch`` (these configs are in its METHODS).
"""

from __future__ import annotations

import pytest

import eagle2.core.engine as engine
import tests.test_certification as cert
import tests.test_certification_exact as exact_cert
from eagle2.prompts.chat import encode_conversation
from tests.broken_rules import accept_second_choice_too
from tests.test_greedy import PROMPTS, QUESTIONS, decode

models = cert.models  # the tiny 8-token target, draft and head of the certifications
exact = exact_cert.exact

GREEDY_METHODS = {
    "rest": {"name": "rest", "max_span": 16, "min_span": 1, "max_matches": 5000, "continuation": 10, "num_draft": 16},
    "suffix": {"name": "suffix", "max_depth": 24, "alpha": 1.0, "max_spec": 16, "min_prob": 0.1},
    "samd": {"name": "samd", "depth": 4, "top_k": 4, "total_tokens": 10, "min_span": 1},
}
# the exact window is 3 tokens: drafts at most 2 deep (suffix: a depth-3 tree holds a 1-token match and 2 more)
SAMPLED_METHODS = {
    "rest": {"name": "rest", "max_span": 4, "min_span": 1, "max_matches": 50, "continuation": 2, "num_draft": 6},
    "suffix": {"name": "suffix", "max_depth": 3, "alpha": 4.0, "max_spec": 6, "min_prob": 0.0},
    "samd": {"name": "samd", "depth": 2, "top_k": 2, "total_tokens": 4, "lookup_k": 2, "min_span": 1},
}


def greedy_mismatches(tiny, method: dict) -> tuple[int, int]:
    """(turns differing from plain decoding, drafted tokens accepted) over the three prompts, 40 tokens."""
    target, _, head = tiny
    mismatches = accepted = 0
    for prompt in PROMPTS:
        ref = decode(target, {"name": "plain"}, prompt, 40).output_ids
        out = decode(target, method, prompt, 40, head=head)
        mismatches += out.output_ids != ref
        accepted += sum(out.accept_lengths) - out.target_forwards
    return mismatches, accepted


@pytest.mark.parametrize("name", list(GREEDY_METHODS))
def test_greedy_equals_plain(tiny, name):
    mismatches, accepted = greedy_mismatches(tiny, GREEDY_METHODS[name])
    assert mismatches == 0
    assert accepted > 20  # drafts were really accepted


@pytest.mark.parametrize("name", list(GREEDY_METHODS))
def test_greedy_identity_rejects_top2_rule(tiny, monkeypatch, name):
    monkeypatch.setattr(engine, "accept_greedy", accept_second_choice_too)
    assert greedy_mismatches(tiny, GREEDY_METHODS[name])[0] > 0


@pytest.mark.parametrize("name", list(SAMPLED_METHODS))
@pytest.mark.parametrize("params", cert.PARAMS, ids=["T1", "T0.7-p0.9-k6"])
def test_round_is_exactly_lossless(exact, name, params):
    diff, full = exact(SAMPLED_METHODS[name], params)
    print(f"{name} {params}: max abs diff {diff:.2e}, P(bonus after full acceptance) {full:.3f}")
    assert diff < exact_cert.PASS_DIFF
    assert full > exact_cert.MIN_FULL  # a fully accepted draft and its bonus are inside the window


@pytest.mark.parametrize("control", ["always_accept", "parent_bonus"])
@pytest.mark.parametrize("name", list(SAMPLED_METHODS))
def test_exact_check_rejects_broken_rules(exact, control, name):
    diff, _ = exact(SAMPLED_METHODS[name], exact_cert.T1, exact_cert.ACCEPT_CONTROLS[control])
    assert diff > exact_cert.REJECT_DIFF


@pytest.fixture(scope="module")
def corpus_datastore():
    """A datastore of the shipped conversations corpus (SmolLM2 token shards, tracked in git)."""
    from eagle2.drafters.retrieval import Datastore
    from eagle2.training.datastore import SHIPPED_SHARDS, chat_entries

    return Datastore.from_entries(chat_entries([SHIPPED_SHARDS]))


@pytest.mark.slow  # ~40 s: SmolLM2 in fp32, two questions, three decodings each
def test_equal_plain_on_smollm2(smollm2, corpus_datastore, monkeypatch):
    import tests.conftest as conftest

    model, tok = smollm2
    monkeypatch.setitem(conftest._DATASTORES, model, corpus_datastore)
    accepted = 0
    for q in QUESTIONS[:2]:
        prompt = encode_conversation(tok, "tokenizer", [q], [])
        ref = decode(model, {"name": "plain"}, prompt, 32, eos={tok.eos_token_id}).output_ids
        for method in ({"name": "rest"}, {"name": "suffix"}):  # the YAML defaults
            out = decode(model, method, prompt, 32, eos={tok.eos_token_id})
            assert out.output_ids == ref, method
            accepted += sum(out.accept_lengths) - out.target_forwards
    assert accepted > 0
