"""The retrieval drafters' parts: REST's datastore (suffix array, longest-suffix search, the trie of the
most frequent continuations, checked against brute force), SuffixDecoding's counted suffix tree and its
speculation rule, the global tree shared through the run's state, and the one-line refusal of a
missing datastore."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.suffix_tree import SuffixTree
from eagle2.heads.rest_datastore import PAD, Datastore, top_prefixes

RNG_ENTRIES = [np.random.default_rng(s).integers(0, 4, size=30 + s).tolist() for s in range(20)]


def brute_occurrences(entries, query):
    flat = [t for e in entries for t in [*e, -1]]
    return sorted(i for i in range(len(flat)) if flat[i: i + len(query)] == query)


@pytest.mark.parametrize("query", [[1], [2, 3], [0, 0, 1], [3, 2, 1, 0], [1, 1, 1, 1, 1, 1]])
def test_occurrences_equal_brute_force(query):
    store = Datastore.from_entries(RNG_ENTRIES, depth=8)
    assert sorted(store.occurrences(query).tolist()) == brute_occurrences(RNG_ENTRIES, query)


def test_longest_suffix_wins_and_continuations_stop_at_the_entry_end():
    store = Datastore.from_entries([[5, 6, 7, 8, 9], [1, 6, 7, 2], [7, 3]], depth=4)
    found, span = store.continuations([0, 5, 6, 7], max_span=4, min_span=1, max_matches=10, length=3)
    assert span == 3 and found.tolist() == [[8, 9, PAD]]  # "5 6 7" once; "6 7" and "7" not consulted
    found, span = store.continuations([4, 6, 7], max_span=4, min_span=1, max_matches=10, length=3)
    assert span == 2 and sorted(found.tolist()) == [[2, PAD, PAD], [8, 9, PAD]]
    assert store.continuations([4, 4], max_span=4, min_span=1, max_matches=10, length=3)[1] == 0
    assert store.continuations([3, 7], max_span=4, min_span=2, max_matches=10, length=3)[1] == 0  # "7" too short


def test_a_saved_datastore_loads_the_same(tmp_path):
    store = Datastore.from_entries(RNG_ENTRIES, depth=8)
    loaded = Datastore.load(store.save(tmp_path / "d.npz"))
    assert np.array_equal(loaded.tokens, store.tokens) and np.array_equal(loaded.suffixes, store.suffixes)
    assert loaded.depth == 8


def test_top_prefixes_are_the_most_frequent_and_a_trie():
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 3, size=(200, 4))
    rows[rng.random((200, 4)) < 0.1] = PAD
    rows = np.where(np.maximum.accumulate(rows == PAD, axis=1), PAD, rows)
    rows = rows[rows[:, 0] != PAD]
    counts = {}
    for row in rows.tolist():
        for end in range(1, len(row) + 1):
            if row[end - 1] == PAD:
                break
            counts[tuple(row[:end])] = counts.get(tuple(row[:end]), 0) + 1
    paths, got = top_prefixes(rows, 12)
    assert got == sorted(counts.values(), reverse=True)[:12]  # the 12 largest counts
    assert all(counts[p] == c for p, c in zip(paths, got))
    assert all(p[:-1] == () or p[:-1] in paths[:i] for i, p in enumerate(paths))  # parents first


def test_rest_drafter_tree_records_frequencies():
    store = Datastore.from_entries([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [9, 2, 3, 4]], depth=4)
    drafter = build_drafter(OmegaConf.create({"name": "rest", "min_span": 1, "continuation": 2, "num_draft": 8}),
                            None, SamplingParams(), None, weights={"rest_datastore": store})
    drafter.start([7, 1], 2, None)  # context "7 1 2": "1 2" matched 3 times, followed by "3 4", "3 5", "6"
    tree = drafter.propose(2, room=50)
    assert tree.tokens.tolist() == [2, 3, 6, 4, 5] and tree.parents.tolist() == [-1, 0, 0, 1, 1]
    assert tree.confidence.tolist() == pytest.approx([1, 2 / 3, 1 / 3, 1 / 2, 1 / 2])
    assert tree.records["value"] == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert tree.records["rank"] == [0, 1, 0, 1] and tree.meta["matched_span"] == 2
    assert len(drafter.propose(2, room=3)) == 3  # the room bounds the tree
    drafter.observe([8], None)
    assert len(drafter.propose(8, room=50)) == 1  # no match: the root alone


def brute_counts(sequences, depth):
    counts = {}
    for seq in sequences:
        for i in range(len(seq)):
            for j in range(i + 1, min(i + depth, len(seq)) + 1):
                counts[tuple(seq[i:j])] = counts.get(tuple(seq[i:j]), 0) + 1
    return counts


def tree_counts(tree: SuffixTree):
    out, stack = {}, [(0, ())]
    while stack:
        node, path = stack.pop()
        for token, child in tree.children[node].items():
            out[path + (token,)] = tree.count[child]
            stack.append((child, path + (token,)))
    return out


def test_suffix_tree_counts_every_window_incrementally():
    a, b = [1, 2, 1, 2, 3, 1, 2], [2, 1, 2, 4]
    tree = SuffixTree(max_depth=4)
    ca = tree.extend([], a[:3])
    cb = tree.extend([], b[:2])  # two sequences grow at once
    tree.extend(ca, a[3:])
    tree.extend(cb, b[2:])
    assert tree_counts(tree) == brute_counts([a, b], 4)


def test_suffix_match_and_speculation():
    tree = SuffixTree(max_depth=6)
    tree.extend([], [5, 1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2])
    node, length = tree.match([8, 7, 1, 2])  # "7 1 2" occurs only at the end: no continuation
    assert length == 2  # "1 2": followed by 3, 3, 4
    paths, counts, score = tree.speculate(node, max_nodes=10, min_prob=0.3)
    assert paths == [(3,), (3, 9), (3, 9, 1), (3, 9, 1, 2)] and counts == [2, 2, 2, 2]  # "4" has 1/4 < 0.3
    assert score == pytest.approx(4 * 2 / 4)
    paths, counts, score = tree.speculate(node, max_nodes=10, min_prob=0.2)
    assert (4,) in paths and (4, 7) in paths
    assert score == pytest.approx(sum(c / 4 for c in counts))  # "1 2" occurs 4 times, the last without a next
    assert tree.speculate(node, max_nodes=1, min_prob=0.0)[0] == [(3,)]
    assert tree.match([6, 6]) == (0, 0)


def test_speculation_grows_with_the_match():
    cfg = OmegaConf.create({"name": "suffix", "alpha": 1.0, "min_prob": 0.0, "global_tree": False})
    drafter = build_drafter(cfg, None, SamplingParams(), None)
    text = [4, 5, 6, 7, 8, 9, 10, 11, 12]
    drafter.start(text + [0, 9], 10, None)  # "9 10" matched: 2 nodes
    assert len(drafter.propose(10, room=50)) == 1 + 2
    drafter.start(text + [0, 6, 7, 8], 9, None)  # "6 7 8 9" matched: 4 nodes
    tree = drafter.propose(9, room=50)
    assert tree.tokens.tolist() == [9, 10, 11, 12, 0] and tree.meta["matched_length"] == 4


def test_global_tree_carries_outputs_across_requests_of_a_run():
    cfg, state = OmegaConf.create({"name": "suffix", "min_prob": 0.0}), {}
    first = build_drafter(cfg, None, SamplingParams(), None, run_state=state)
    first.start([1, 2], 30, None)
    first.observe([31, 32, 33, 34], None)  # the first request's output: 30 31 32 33 34
    second = build_drafter(cfg, None, SamplingParams(), None, run_state=state)
    second.start([3, 4], 30, None)  # nothing in this prompt follows 30; the first output does
    tree = second.propose(30, room=50)
    assert tree.tokens.tolist()[:2] == [30, 31] and tree.meta["suffix_tree"] == "global"
    alone = build_drafter(cfg, None, SamplingParams(), None)  # no run state: a fresh global tree
    alone.start([3, 4], 30, None)
    assert len(alone.propose(30, room=50)) == 1


def test_a_missing_datastore_is_one_line_naming_the_build(tmp_path):
    from eagle2.heads.checkpoint import WeightLocationError
    from eagle2.heads.family import families

    build = r"python -m experiments\.ops\.build_datastore --corpus chat --out"
    with pytest.raises(WeightLocationError, match=build) as err:
        families()["rest_datastore"].load(str(tmp_path / "none.npz"), None)
    assert "\n" not in str(err.value)


def test_samd_chain_prefers_the_longer_match_then_the_most_frequent_tokens():
    from eagle2.drafters.samd import RetrievedChain

    store = Datastore.from_entries([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5, 6], [7, 8, 9]], depth=8)
    source = RetrievedChain(store, k=3, min_span=1)
    assert source([0, 1, 2]) == [[3, 4]]  # the corpus: "1 2" followed by 3 4 (twice) and 5 6
    assert source([0, 1, 2, 7, 0, 1]) == [[2, 7, 0]]  # the context's "0 1" (2 tokens) beats the corpus's "1"
    assert source([0, 1, 2, 7, 0, 1, 11]) == []  # "11" nowhere before
