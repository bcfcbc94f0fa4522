"""Each drafter's selection rule on a planted state: the drafted tree holds exactly the nodes the method's rule
names (the most frequent continuations, the longest match, the best path values). Exact-output tests cannot see a
drafter that picks worse nodes (its drafts are rejected and the output stays the same); these can.

Negative controls (by hand): REST's ``top_prefixes`` choosing prefixes in lexicographic order instead of by count
fails ``test_rest_drafts_the_most_frequent_prefixes``; SAMD's chain following the least frequent child fails
``test_samd_chain_follows_the_most_frequent_child``.
"""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf

from eagle2.core.tree import DraftTree
from eagle2.drafters import pld, rest, samd, suffix
from eagle2.heads.rest_datastore import Datastore, top_prefixes


def drafted(tree: DraftTree) -> dict[tuple[int, ...], int]:
    """Every drafted node as its token path from the root (root excluded) -> its node index."""
    tokens, parents, out = tree.tokens.tolist(), tree.parents.tolist(), {}
    for node in range(1, len(tokens)):
        path, at = [], node
        while at > 0:
            path.append(tokens[at])
            at = parents[at]
        out[tuple(reversed(path))] = node
    return out


# ---- REST: the num_draft most frequent prefixes of what followed the longest matched suffix ----

def planted_datastore() -> Datastore:
    """After [1, 2]: [5, 6] three times, [5, 8], [3, 4] and [4, 4] once each (3 and 4 sort before 5: a
    lexicographic pick shows)."""
    return Datastore.from_entries([[1, 2, 5, 6]] * 3 + [[1, 2, 5, 8], [1, 2, 3, 4], [1, 2, 4, 4], [9, 9, 9]], depth=4)


def test_top_prefixes_are_the_most_frequent_best_first():
    rows = np.array([[5, 6], [5, 6], [5, 6], [5, 8], [3, 4], [4, 4]])
    assert top_prefixes(rows, 2) == ([(5,), (5, 6)], [4, 3])
    assert top_prefixes(rows, 3) == ([(5,), (5, 6), (3,)], [4, 3, 1])  # ties: shorter, then smaller tokens


def test_rest_drafts_the_most_frequent_prefixes():
    drafter = rest.RestDrafter(planted_datastore(), rest.RestSettings(max_span=2, min_span=2, continuation=2,
                                                                     num_draft=2))
    drafter.start([7, 1], 2, None)
    tree = drafter.propose(2, 16)
    nodes = drafted(tree)
    assert set(nodes) == {(5,), (5, 6)}
    assert abs(float(tree.confidence[nodes[(5, 6)]]) - 3 / 4) < 1e-6  # a node's count over its parent's
    drafter.settings = rest.RestSettings(max_span=2, min_span=2, continuation=2, num_draft=3)
    tree = drafter.propose(2, 16)  # one more: of the ties at one, the shortest with the smallest tokens
    nodes = drafted(tree)
    assert set(nodes) == {(5,), (5, 6), (3,)} and tree.children[0] == [nodes[(5,)], nodes[(3,)]]  # best first


def test_rest_takes_the_longest_matching_suffix():
    """[4, 1, 2] occurs once, followed by 7: the longer match wins over [1, 2]'s more frequent continuations."""
    store = Datastore.from_entries([[1, 2, 5, 6]] * 3 + [[4, 1, 2, 7]], depth=4)
    drafter = rest.RestDrafter(store, rest.RestSettings(max_span=3, min_span=2, continuation=1, num_draft=3))
    drafter.start([4, 1], 2, None)
    assert set(drafted(drafter.propose(2, 16))) == {(7,)}


# ---- SAMD: a chain from the longer match, the most frequent next token at each step ----

def test_samd_chain_follows_the_most_frequent_child():
    """In the context, [8, 1, 2] was followed by 7 three times and by 9 once; after [8, 1, 2, 7] came 8 twice
    and 3 once: the chain is [7, 8] (the least frequent children would give [9, 5])."""
    chain = samd.RetrievedChain(Datastore.from_entries([[50, 51, 52]], depth=4), k=2, max_depth=6)
    context = [8, 1, 2, 7] * 3 + [3, 8, 1, 2, 9, 5, 8, 1, 2]
    assert chain(context) == [[7, 8]]


def test_samd_chain_from_the_datastore_is_its_most_frequent_path():
    """No context match longer than the datastore's: the chain is the datastore's most frequent first token,
    then its most frequent next one."""
    chain = samd.RetrievedChain(planted_datastore(), k=2, max_depth=6, max_span=2, min_span=2)
    assert chain([7, 1, 2]) == [[5, 6]]


# ---- SuffixDecoding: the most probable continuations of the longest match ----

def test_suffix_drafts_the_most_probable_continuations():
    """[8, 1, 2] was followed by 7 three times in four, then always by 8, 1: path probabilities 3/4, 1/2, 1/2
    against 1/4 for 9 (and 1/4 for [7, 3]); three nodes of room keep the first three."""
    settings = suffix.SuffixSettings(max_depth=6, alpha=4.0, min_prob=0.2, global_tree=False)
    drafter = suffix.SuffixDrafter(settings, None)
    drafter.start([8, 1, 2, 7] * 3 + [3, 8, 1, 2, 9, 5, 8, 1], 2, None)
    assert set(drafted(drafter.propose(2, 4))) == {(7,), (7, 8), (7, 8, 1)}


# ---- prompt lookup: what followed the longest matching n-gram ----

def test_pld_drafts_what_followed_the_longest_ngram():
    cfg = OmegaConf.create({"name": "pld", "k": 2, "max_ngram": 3, "min_ngram": 1})
    drafter = pld.build(cfg, None, None, None, {})
    drafter.start([5, 1, 2, 3, 4, 9, 2, 6, 6, 1], 2, None)  # [1, 2] -> 3 4; [2] alone also -> 6 6
    assert set(drafted(drafter.propose(2, 16))) == {(3,), (3, 4)}
    assert torch.equal(drafter.propose(2, 2).tokens, torch.tensor([2, 3]))  # room for one: the chain cut
