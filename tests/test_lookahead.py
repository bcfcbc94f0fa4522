"""Lookahead decoding: the window's geometry against the authors' attention mask, the warm-up, the n-gram
pool's update and LRU, the verification branch, and token identity with plain decoding on SmolLM2 in fp32.
Its losslessness is certified in ``test_lossless_new_methods.py``, its batched decoding in ``test_batch.py``,
non-candidate nodes in ``test_non_candidates.py``."""

from __future__ import annotations

import pytest
import torch

from eagle2.drafters.lookahead import LookaheadDrafter, LookaheadSettings, NgramPool

W, N = 3, 4  # levels 0 .. 2: level 0 has W - 1 tokens, levels 1 and 2 have W
LEVELS = [[10, 11], [20, 21, 22], [30, 31, 32]]


def filled_drafter(pool_from_prompt: bool = False) -> LookaheadDrafter:
    drafter = LookaheadDrafter(LookaheadSettings(window=W, ngram=N, guess_set=2, pool_from_prompt=pool_from_prompt))
    drafter.start([40, 41, 42], 1, None)
    drafter.levels = [list(level) for level in LEVELS]
    return drafter


def authors_mask_and_positions():
    """The authors' lookahead mask (``j_make_causal_mask_multilevel``) read as a rule, over root + window:
    level-0 token j sees the root and level-0 tokens 0..j; the level-l token of column i (l >= 1) sees the
    root, level-0 tokens 0..i-1 and column i of levels 1..l. Positions: level 0 j at 1 + j, level l
    column i at l + i (relative to the root)."""
    cells = [(0, j) for j in range(W - 1)] + [(level, i) for level in range(1, N - 1) for i in range(W)]
    seen = torch.zeros(len(cells) + 1, len(cells) + 1, dtype=torch.bool)
    seen[:, 0] = True
    for a, (la, ia) in enumerate(cells, start=1):
        for b, (lb, ib) in enumerate(cells, start=1):
            if la == 0:
                seen[a, b] = lb == 0 and ib <= ia
            else:
                seen[a, b] = (lb == 0 and ib <= ia - 1) or (1 <= lb <= la and ib == ia)
    positions = [0] + [1 + i if level == 0 else level + i for level, i in cells]
    return seen, positions


def test_window_is_the_authors_mask_as_a_tree():
    tree = filled_drafter().propose(1, room=100)
    assert tree.tokens.tolist() == [1, *LEVELS[0], *LEVELS[1], *LEVELS[2]]  # no candidates: the pool is empty
    assert tree.children[0] == [] and len(tree.non_candidates()) == len(tree) - 1
    seen, positions = authors_mask_and_positions()
    assert torch.equal(tree.ancestor_matrix(), seen)
    assert tree.depths.tolist() == positions


def logits_with_argmax(tree_size: int, rows: list[int], tokens: list[int], vocab: int = 64) -> torch.Tensor:
    logits = torch.zeros(tree_size, vocab)
    logits[rows, tokens] = 1.0
    return logits


def test_pool_update_and_window_shift():
    drafter = filled_drafter()
    tree = drafter.propose(1, room=100)
    last_level = drafter.window_nodes[-1]
    drafter.observe_target(tree, logits_with_argmax(len(tree), last_level, [50, 51, 52]))
    # column i: key level0[i - 1] (the root for i = 0), then levels 1, 2 of column i and the new argmax
    assert drafter.pool.grams == {1: [(20, 30, 50)], 10: [(21, 31, 51)], 11: [(22, 32, 52)]}
    assert drafter.levels == [[21, 22], [30, 31, 32], [50, 51, 52]]
    tree = drafter.propose(1, room=100)  # the verification branch: the root's n-gram as candidates
    assert tree.tokens[:4].tolist() == [1, 20, 30, 50] and tree.children[:4] == [[1], [2], [3], []]
    assert tree.non_candidates() == list(range(4, len(tree)))
    assert tree.meta == {"lookahead_candidates": 3, "lookahead_window": 8}


def test_warm_up_fills_the_levels_then_keeps_their_sizes():
    drafter = LookaheadDrafter(LookaheadSettings(window=W, ngram=N, guess_set=2))
    drafter.start([40, 41, 42, 43], 1, None)
    assert len(drafter.levels[0]) == W + N - 3 and set(drafter.levels[0]) <= {40, 41, 42, 43}
    for size in ([3, 4], [2, 3, 3], [2, 3, 3]):
        tree = drafter.propose(1, room=100)
        assert tree.meta["lookahead_candidates"] == 0
        drafter.observe_target(tree, logits_with_argmax(len(tree), drafter.window_nodes[-1],
                                                        [7] * len(drafter.window_nodes[-1])))
        assert [len(level) for level in drafter.levels] == size
    assert drafter.pool.grams  # filled: the pool gets n-grams


def test_no_room_no_window():
    drafter = filled_drafter()
    tree = drafter.propose(1, room=4)
    assert len(tree) == 1 and drafter.window_nodes is None
    drafter.observe_target(tree, torch.zeros(1, 64))
    assert drafter.levels == LEVELS  # a round without the window leaves it as it was


def test_pool_keeps_the_most_recent_and_proposes_them_first():
    pool = NgramPool(2)
    for gram in [(1,), (2,), (3,), (2,)]:
        pool.add(0, gram)
    assert pool.candidates(0) == [[2], [3]]
    assert pool.candidates(9) == []


def test_pool_from_prompt_gives_candidates_from_the_first_round():
    drafter = LookaheadDrafter(LookaheadSettings(window=W, ngram=3, guess_set=4, pool_from_prompt=True))
    drafter.start([5, 6, 7, 5, 8, 9], 5, None)
    assert drafter.pool.candidates(5) == [[8, 9], [6, 7]]
    tree = drafter.propose(5, room=100)
    assert tree.meta["lookahead_candidates"] == 4  # two chains, no shared first token
    drafter.observe([8, 9, 4], None)  # the output's n-grams join the pool
    assert drafter.pool.candidates(8) == [[9, 4], [9, 5]]


def test_settings_refused():
    with pytest.raises(ValueError, match="ngram >= 3"):
        LookaheadSettings(ngram=2)
