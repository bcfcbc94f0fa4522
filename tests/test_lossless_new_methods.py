"""PLD (chain and tree), the EAGLE-2 hybrid tree (lookup branch), the oracle, Lookahead decoding (its
Jacobi window riding as non-candidate nodes), Token Recycling and the retrieval drafters (REST,
SuffixDecoding, SAMD) are lossless by the project's own certifications, reused here
(``test_greedy``, ``test_certification``, ``test_certification_exact``):

- temperature 0: token-identical to plain decoding in fp32 on tiny random models, with drafts really
  accepted (each method's accepted-draft count is asserted); a top-2 acceptance rule breaks it;
- temperature > 0: one real engine round enumerated exactly matches the target's joint distribution
  to < 1e-5 (T=1 and T=0.7/top-p 0.9/top-k 6), and always-accept / the bonus drawn from the parent's
  distribution are rejected by > 1e-3; end to end, 2,500 samples pass the chi-square test and
  always-accept fails it (p < 1e-6).

All of these drafts are chosen deterministically (no ``q_draft``): acceptance uses the rule for
deterministically chosen children.
"""

from __future__ import annotations

import pytest

import eagle2.core.engine as engine
import tests.test_certification as cert
import tests.test_certification_exact as exact_cert
from tests.broken_rules import accept_second_choice_too
from tests.test_greedy import PROMPTS, decode

models = cert.models  # the tiny 8-token target, draft and head of the certifications
exact = exact_cert.exact

GREEDY_METHODS = {
    "pld": {"name": "pld", "k": 4, "max_ngram": 3, "min_ngram": 1, "branches": 1},
    "pld_tree": {"name": "pld", "k": 3, "max_ngram": 2, "min_ngram": 1, "branches": 3},
    "hybrid": {"name": "eagle2", "depth": 4, "top_k": 4, "total_tokens": 10, "lookup_branch": True},
    "oracle": {"name": "oracle", "depth": 4},
    "lookahead": {"name": "lookahead", "window": 4, "ngram": 3, "guess_set": 4},
    "lookahead_pooled": {"name": "lookahead", "window": 4, "ngram": 4, "guess_set": 4, "pool_from_prompt": True},
    "token_recycling": {"name": "token_recycling", "top_k": 4,
                        "choices": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]},
    # REST retrieves from tests.conftest.shared_rest_datastore: the target's own greedy continuations and random
    # sequences (tests/test_lossless_retrieval.py: SmolLM2 with a real corpus)
    "rest": {"name": "rest", "max_span": 16, "min_span": 1, "max_matches": 5000, "continuation": 10, "num_draft": 16},
    "suffix": {"name": "suffix", "max_depth": 24, "alpha": 1.0, "max_spec": 16, "min_prob": 0.1},
    "samd": {"name": "samd", "depth": 4, "top_k": 4, "total_tokens": 10, "min_span": 1},
}
# the exact window is 3 tokens: drafts at most 2 deep (suffix: a depth-3 tree holds a 1-token match and 2 more)
SAMPLED_METHODS = {
    "pld": {"name": "pld", "k": 2, "max_ngram": 2, "min_ngram": 1, "branches": 1},
    "pld_tree": {"name": "pld", "k": 2, "max_ngram": 2, "min_ngram": 1, "branches": 2},
    "hybrid": {"name": "eagle2", "depth": 2, "top_k": 2, "total_tokens": 4, "lookup_branch": True, "lookup_k": 2},
    "oracle": {"name": "oracle", "depth": 2},
    # the pool from the prompt: a candidate in the enumerated round (the window alone fills it later)
    "lookahead": {"name": "lookahead", "window": 2, "ngram": 3, "guess_set": 2, "pool_from_prompt": True},
    "token_recycling": {"name": "token_recycling", "top_k": 3, "choices": [[0], [1], [0, 0]]},
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
    assert accepted > 20  # drafts were really accepted (lookup matches, oracle continuations)


@pytest.mark.parametrize("name", ["pld", "hybrid", "rest", "suffix", "samd"])
def test_greedy_identity_rejects_top2_rule(tiny, monkeypatch, name):
    monkeypatch.setattr(engine, "accept_greedy", accept_second_choice_too)
    assert greedy_mismatches(tiny, GREEDY_METHODS[name])[0] > 0


@pytest.mark.parametrize("name", list(SAMPLED_METHODS))
@pytest.mark.parametrize("params", cert.PARAMS, ids=["T1", "T0.7-p0.9-k6"])
def test_round_is_exactly_lossless(exact, name, params):
    diff, full = exact(SAMPLED_METHODS[name], params)
    print(f"{name} {params}: max abs diff {diff:.2e}, P(bonus after full acceptance) {full:.3f}")
    assert diff < exact_cert.PASS_DIFF
    if name == "lookahead" and params != cert.PARAMS[0]:  # its one candidate (the prompt's 2-gram after 2)
        return  # lies outside top-p 0.9 / top-k 6 there: never accepted; at T=1 the full case is checked
    assert full > exact_cert.MIN_FULL  # a fully accepted draft and its bonus are inside the window


@pytest.mark.parametrize("control", ["always_accept", "parent_bonus"])
@pytest.mark.parametrize("name", list(SAMPLED_METHODS))
def test_exact_check_rejects_broken_rules(exact, control, name):
    diff, _ = exact(SAMPLED_METHODS[name], exact_cert.T1, exact_cert.ACCEPT_CONTROLS[control])
    assert diff > exact_cert.REJECT_DIFF


@pytest.mark.slow  # ~50-110 s each at 1 thread; the exact check above is the fast certification
@pytest.mark.parametrize("name", ["pld_tree", "hybrid"])
def test_chi_square_end_to_end(models, name):
    target, draft, head = models
    params = cert.PARAMS[0]
    counts = cert.sample_counts(target, SAMPLED_METHODS[name], params, 2500, seed=21, draft=draft, head=head)
    assert cert.chi_square_p(counts, cert.exact_distribution(target, params)) > cert.PASS_P


@pytest.mark.slow
def test_chi_square_rejects_always_accept(models, monkeypatch):
    target, draft, head = models
    monkeypatch.setattr(engine, "accept_stochastic", cert._always_accept)
    params = cert.PARAMS[0]
    counts = cert.sample_counts(target, SAMPLED_METHODS["pld_tree"], params, 2500, seed=21, head=head)
    assert cert.chi_square_p(counts, cert.exact_distribution(target, params)) < cert.REJECT_P


@pytest.mark.slow  # minutes on a busy 2-core machine: SmolLM2 through run.py
@pytest.mark.parametrize("name", ["lookahead", "token_recycling"])
def test_smollm2_first_question_equals_plain_batch_1_and_2(tmp_path, smollm2, name):
    """run.py's path on the real model in fp32 (the methods' default settings): MT-bench's first question
    (both turns) token-identical to plain decoding, at batch 1 and batch 2 (``python -m eagle2.identity``
    over the six benchmarks' first questions is the wider measurement)."""
    from eagle2.bench.runner import run
    from tests.test_runner import config, rows

    outputs = {}
    for method, batch in (("plain", 1), (name, 1), (name, 2)):
        run(config(f"method={method}", "dataset=mt_bench", "dataset.limit=1", "max_new_tokens=24", "threads=1",
                   "model.dtype=float32", f"batch_size={batch}", f"paths.results={tmp_path}"))
    for r in rows(tmp_path):
        outputs.setdefault((r["method"], r["batch_size"]), {})[(r["question_id"], r["turn"])] = r["output_ids"]
    assert len(outputs["plain", 1]) == 2
    assert outputs[name, 1] == outputs["plain", 1] and outputs[name, 2] == outputs["plain", 1]
