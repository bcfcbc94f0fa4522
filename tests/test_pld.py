"""Prompt lookup: n-gram matching (``eagle2.drafters.lookup``), the trie of chains, and the PLD drafter's trees.
Losslessness of PLD is certified in ``test_lossless_new_methods.py``."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.lookup import LookupSettings, chains_to_tree, find_chains


def test_longest_ngram_wins_and_most_recent_first():
    seq = [1, 2, 3, 9, 2, 3, 7, 8, 5, 2, 3]
    # the 3-gram [5, 2, 3] never occurred before; the 2-gram [2, 3] did, twice: most recent first
    assert find_chains(seq, LookupSettings(k=2, max_ngram=3, branches=2)) == [[7, 8], [9, 2]]
    # a longer match is preferred over a more recent shorter one
    seq = [4, 5, 6, 1, 6, 2, 4, 5, 6]
    assert find_chains(seq, LookupSettings(k=1, max_ngram=3, branches=1)) == [[1]]
    assert find_chains(seq, LookupSettings(k=1, max_ngram=1, branches=1)) == [[2]]


def test_no_match_and_short_continuations():
    assert find_chains([1, 2, 3], LookupSettings()) == []
    assert find_chains([5], LookupSettings()) == []
    # the match just before the end has only one following token
    assert find_chains([7, 7], LookupSettings(k=4)) == [[7]]


def test_duplicate_continuations_are_skipped():
    seq = [1, 5, 6, 1, 5, 6, 1, 5, 1]  # "1" occurred at 6, 3, 0, followed by [5, 1], [5, 6], [5, 6]
    assert find_chains(seq, LookupSettings(k=2, max_ngram=1, branches=3)) == [[5, 1], [5, 6]]


def test_chains_become_a_trie_within_budget():
    tree = chains_to_tree(9, [[1, 2, 3], [1, 4], [5]], max_nodes=10)
    assert tree.tokens.tolist() == [9, 1, 2, 3, 4, 5]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 1, 0]  # [1, 4] shares node 1
    assert tree.children[1] == [2, 4]  # the earlier (better) chain's child first
    small = chains_to_tree(9, [[1, 2, 3], [1, 4], [5]], max_nodes=3)
    assert small.tokens.tolist() == [9, 1, 2, 3]


def test_settings_are_validated():
    with pytest.raises(ValueError):
        LookupSettings(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError):
        LookupSettings(k=0)


def test_pld_drafter_proposes_from_prompt_and_output():
    cfg = OmegaConf.create({"name": "pld", "k": 3, "max_ngram": 2, "min_ngram": 1, "branches": 2})
    drafter = build_drafter(cfg, None, SamplingParams(), None)
    drafter.start([3, 4, 5, 6, 8, 4, 9], 5, None)  # context ... 4, 9, 5: "5" matched in the prompt
    tree = drafter.propose(5, room=50)
    assert tree.tokens.tolist() == [5, 6, 8, 4] and tree.q_draft is None
    drafter.observe([6, 1], None)  # context ends "6, 1": no earlier "1", "6" followed by 8, 4, 9 and by 1
    assert drafter.propose(1, room=50).tokens.tolist() == [1]
    drafter.observe([6], None)
    tree = drafter.propose(6, room=3)  # "1, 6" matched: chain [1, 6] would follow; room for 2 nodes
    assert len(tree) == 3 and tree.tokens.tolist()[:2] == [6, 1]
    assert len(drafter.propose(6, room=1)) == 1


def brute_force_chains(seq: list[int], s: LookupSettings) -> list[list[int]]:
    """The docstring's definition with plain loops: n from max_ngram down, matches most recent first, a
    continuation equal to or a prefix of one already taken skipped, until ``branches`` chains."""
    chains = []
    for n in range(s.max_ngram, s.min_ngram - 1, -1):
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start:start + n] != seq[len(seq) - n:]:
                continue
            chain = seq[start + n:start + n + s.k]
            if any(len(chain) <= len(old) and old[:len(chain)] == chain for old in chains):
                continue
            chains.append(chain)
            if len(chains) == s.branches:
                return chains
    return chains


def test_chains_match_a_brute_force_search_on_random_sequences():
    import random

    rng = random.Random(0)
    differ = []
    for _ in range(4000):
        seq = [rng.randrange(3) for _ in range(rng.randrange(2, 25))]  # 3 tokens: repeats and prefixes abound
        s = LookupSettings(k=rng.randrange(1, 5), max_ngram=3, min_ngram=rng.randrange(1, 3),
                           branches=rng.randrange(1, 5))
        chains = find_chains(seq, s)
        if chains != brute_force_chains(seq, s):
            differ.append((seq, s))
    assert not differ, f"{len(differ)} of 4000 differ, e.g. {differ[0]}"
