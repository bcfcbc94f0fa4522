"""The selection rules of the drafters with heads or a target's logits, on planted states: the drafted tree holds
exactly the nodes the rule names. EAGLE-2's dynamic tree (and EAGLE-3's, the same drafter over a draft vocabulary)
holds the best ``total_tokens`` nodes by path value of the layers it expanded, each layer grown from the ``top_k``
best of the one before; EAGLE's static tree and Medusa's and Hydra's choice trees the ranked children their choices
name; the one-forward drafters' (P-EAGLE, DFlash, PARD: one round, K planted distributions) the best ``total_tokens``
(within the room left) of the nodes their choices name, node ``[r1, ..., rd]`` depth d's rd-th best token; Token
Recycling's tree the adjacency rows' top-k, the most recent rows winning; Lookahead's candidates the pool's most
recent n-grams of the key; SpS the draft model's greedy chain at temperature 0; the oracle the planted reference's
next ``depth`` tokens while the output follows it (no more than the room), the target's greedy chain once it left.

The planted logits: a Markov table ``NEXT[token]`` (the log-probabilities of a node's children given its token).
EAGLE's head state (``eagle2.drafters.head_group.TreeHeads``) is replaced by one reading that table; Medusa's and
Hydra's heads by modules whose LM heads give the planted rows. Each expectation is computed here from the table by
the published rule, independently of the drafter's code.

Negative controls (by hand), each failing the test named:
- EAGLE-2 expanding the newest layer's worst nodes (``torch.topk(..., largest=False)`` in ``propose_batch``), and
  ranking the drafted nodes worst first (``ranked``): ``test_eagle2_tree_is_the_best_nodes_by_path_value`` and
  ``test_eagle3_tree_drafts_over_its_draft_vocabulary``;
- EAGLE's static tree taking each node's ``rank + 1``-th child: ``test_eagle_static_tree_is_its_choices``;
- Medusa reading every depth from the first head: ``test_medusa_tree_is_each_heads_ranked_choice``;
- Hydra feeding the root alone instead of the parent's path: ``test_hydra_tree_follows_each_parents_path``;
- Token Recycling keeping a token's first row instead of its last:
  ``test_token_recycling_fills_the_template_from_the_latest_rows``;
- the n-gram pool giving the oldest n-gram first: ``test_lookahead_candidates_are_the_most_recent_ngrams``;
- SpS drafting the second-best token: ``test_sps_chain_is_the_draft_models_greedy_chain``;
- P-EAGLE's round taking each depth's top-k worst first, every depth from depth 1's distribution, or a budget
  ignoring the room: ``test_one_forward_tree_is_the_best_choice_nodes_by_path_value``;
- the oracle proposing the reference one token late, or one token more than the room:
  ``test_oracle_drafts_the_planted_continuation``.
"""

from __future__ import annotations

import pytest
import torch

from eagle2.core.sampling import SamplingParams
from eagle2.drafters import eagle2_dynamic, eagle_static, hydra, medusa
from eagle2.drafters.lookahead import LookaheadDrafter, LookaheadSettings, NgramPool
from eagle2.drafters.oracle import OracleDrafter
from eagle2.drafters.peagle import PEagleDrafter, default_choices
from eagle2.drafters.sps import SpsDrafter
from eagle2.drafters.token_recycling import TokenRecyclingDrafter
from tests.conftest import tiny_llama, tiny_peagle_head
from tests.test_drafter_selection import drafted

V = 40  # the planted vocabulary


def planted_table(seed: int, rows: int = V, columns: int = V) -> torch.Tensor:
    """(rows, columns) log-probabilities, spread wide enough that no two path values tie."""
    return torch.log_softmax(torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed)) * 3, -1)


def ranked_children(logp: torch.Tensor, k: int, vocab=None) -> list[tuple[int, float]]:
    """The k most likely (token, log-probability), best first, by sorting (not ``torch.topk``)."""
    order = sorted(range(len(logp)), key=lambda i: -float(logp[i]))[:k]
    return [(int(vocab[i]) if vocab is not None else i, float(logp[i])) for i in order]


# ---- EAGLE, EAGLE-2, EAGLE-3: the head state replaced by the planted table ----

class PlantedHeads:
    """Stands for ``TreeHeads``: a node's children's log-probabilities are ``NEXT[its token]``."""

    next_logp, root = None, None

    def __init__(self, runners):
        self.fed = 0

    def catch_up(self):
        return self.next_logp[self.root][None], torch.zeros(1, 1)

    def expand(self, tokens, parent_fed, depth, parent_features):
        tokens = torch.as_tensor(tokens)
        self.fed += tokens.shape[-1]
        return self.next_logp[tokens], torch.zeros(*tokens.shape, 1)


@pytest.fixture
def planted_heads(monkeypatch):
    monkeypatch.setattr(eagle2_dynamic, "TreeHeads", PlantedHeads)
    monkeypatch.setattr(eagle_static, "TreeHeads", PlantedHeads)
    return PlantedHeads


def dynamic_reference(next_logp, root, depth, k, m, vocab=None) -> set[tuple[int, ...]]:
    """EAGLE-2's rule: depth 1 the root's top k; each further depth the top k children of each of the newest
    layer's k best nodes by path value; then the m best drafted nodes by path value (ties: shallower)."""
    layer = [((t,), v) for t, v in ranked_children(next_logp[root], k, vocab)]
    nodes = list(layer)
    for _ in range(depth - 1):
        best = sorted(layer, key=lambda node: -node[1])[:k]
        layer = [(path + (t,), v + c) for path, v in best for t, c in ranked_children(next_logp[path[-1]], k, vocab)]
        nodes += layer
    nodes.sort(key=lambda node: (-node[1], len(node[0])))
    return {path for path, _ in nodes[:m]}


@pytest.mark.parametrize("seed, depth, top_k, total", [(0, 4, 3, 10), (1, 5, 4, 20), (2, 3, 2, 5)])
def test_eagle2_tree_is_the_best_nodes_by_path_value(planted_heads, seed, depth, top_k, total):
    planted_heads.next_logp, planted_heads.root = planted_table(seed), 7
    drafter = eagle2_dynamic.Eagle2Drafter(torch.nn.Linear(1, 1), torch.nn.Linear(1, V), "cpu", depth=depth,
                                           top_k=top_k, total_tokens=total)
    tree = drafter.propose(7, 64)
    assert set(drafted(tree)) == dynamic_reference(planted_heads.next_logp, 7, depth, top_k, total)


def test_eagle3_tree_drafts_over_its_draft_vocabulary(planted_heads):
    """An EAGLE-3 head drafts over a reduced vocabulary: column i of its logits is token ``vocab[i]``; the tree is
    EAGLE-2's over those columns, mapped to their token ids."""
    vocab = torch.randperm(V, generator=torch.Generator().manual_seed(5))[:16]
    planted_heads.next_logp, planted_heads.root = planted_table(3, V, 16), int(vocab[0])
    drafter = eagle2_dynamic.Eagle2Drafter(torch.nn.Linear(1, 1), torch.nn.Linear(1, V), "cpu", depth=4, top_k=3,
                                           total_tokens=12, vocab=vocab)
    tree = drafter.propose(planted_heads.root, 64)
    assert set(drafted(tree)) == dynamic_reference(planted_heads.next_logp, planted_heads.root, 4, 3, 12,
                                                   vocab.tolist())


def choice_reference(choices, child) -> set[tuple[int, ...]]:
    """Node [r1, ..., rd]: the rd-th best child (``child(depth, path so far)``'s ranked tokens) of node [r1..]."""
    found = set()
    for choice in choices:
        path = ()
        for d, r in enumerate(choice):
            path += (child(d, path)[r][0],)
        found.add(path)
    return found


CHOICES = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [2, 0], [0, 0, 0, 1]]


def test_eagle_static_tree_is_its_choices(planted_heads):
    planted_heads.next_logp, planted_heads.root = planted_table(4), 3
    drafter = eagle_static.EagleStaticDrafter(torch.nn.Linear(1, 1), torch.nn.Linear(1, V), "cpu", choices=CHOICES)
    expected = choice_reference(CHOICES, lambda d, path: ranked_children(planted_heads.next_logp[((3,) + path)[-1]],
                                                                         4))
    assert set(drafted(drafter.propose(3, 64))) == expected


# ---- Medusa and Hydra: heads whose LM heads give planted rows ----

class PlantedStack(torch.nn.Module):
    """Stands for Medusa's and Hydra's head stacks: head d's LM head maps a one-hot of a token to ``logits[d]``'s
    row of that token (Medusa's heads all read one feature, the one-hot of token 0; Hydra's the parent's token)."""

    own_lm_head, draft_vocab = False, None

    def __init__(self, logits: torch.Tensor):  # (depth, V, V): head d, token -> its children's logits
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(V, V, bias=False) for _ in logits)
        for head, table in zip(self.heads, logits):
            head.weight.data = table.T.contiguous()

    def __len__(self):
        return len(self.heads)

    def lm_head(self, d):
        return self.heads[d]

    def features(self, hidden, n):
        return [torch.nn.functional.one_hot(torch.tensor(0), V).float()] * n

    def head_features(self, d, hidden, paths):
        return torch.nn.functional.one_hot(paths[:, -1], V).float()


@pytest.fixture
def planted_stack(monkeypatch):
    monkeypatch.setattr(medusa, "blocks", lambda heads: heads)
    monkeypatch.setattr(hydra, "blocks", lambda heads: heads)
    return PlantedStack(torch.stack([planted_table(10 + d) for d in range(4)]))


def test_medusa_tree_is_each_heads_ranked_choice(planted_stack):
    drafter = medusa.MedusaDrafter(planted_stack, "cpu", choices=CHOICES)
    drafter.start([1, 2], 5, torch.zeros(2, 1))
    logits = [h.weight.T for h in planted_stack.heads]
    expected = choice_reference(CHOICES, lambda d, path: ranked_children(logits[d][0], 4))
    assert set(drafted(drafter.propose(5, 64))) == expected


def test_hydra_tree_follows_each_parents_path(planted_stack):
    drafter = hydra.HydraDrafter(planted_stack, "cpu", choices=CHOICES)
    drafter.start([1, 2], 5, torch.zeros(2, 1))
    logits = [h.weight.T for h in planted_stack.heads]
    expected = choice_reference(CHOICES, lambda d, path: ranked_children(logits[d][((5,) + path)[-1]], 4))
    assert set(drafted(drafter.propose(5, 64))) == expected


# ---- Token Recycling: the adjacency matrix's rows, the latest writes winning ----

def matrix_reference(rows: dict[int, torch.Tensor], root: int) -> set[tuple[int, ...]]:
    """Each choice's path through the rows' ranked entries; a node under a token without a row is not drafted."""
    found = set()
    for choice in CHOICES:
        path, at = (), root
        for r in choice:
            if at not in rows:
                break
            at = ranked_children(rows[at], 4)[r][0]
            path += (at,)
        else:
            found.add(path)
    return found


def test_token_recycling_fills_the_template_from_the_latest_rows():
    """The prompt seeds rows (token 4 twice: its later position's logits count); a verify's logits then rewrite
    the rows of the tree's tokens (a repeated token: its last node's). Every node is its parent's row's ranked
    entry."""
    first, later = planted_table(20), planted_table(21)
    drafter = TokenRecyclingDrafter(torch.nn.Identity(), V, "cpu", CHOICES, top_k=4)
    prompt = [4, 9, 4, 11]
    drafter.start(prompt, 4, first[: len(prompt)])  # hidden = the planted logits (the LM head: identity)
    rows = {9: first[1], 4: first[2], 11: first[3]}
    tree = drafter.propose(4, 64)
    assert set(drafted(tree)) == matrix_reference(rows, 4)
    drafter.observe_target(tree, later[: len(tree.tokens)])
    rows.update({t: later[i] for i, t in enumerate(tree.tokens.tolist())})  # in order: the last node's wins
    assert set(drafted(drafter.propose(4, 64))) == matrix_reference(rows, 4)


# ---- Lookahead: the pool's most recent n-grams of the key ----

def test_lookahead_candidates_are_the_most_recent_ngrams():
    pool = NgramPool(size=2)
    for gram in [(1, 2), (3, 4), (1, 2), (5, 6)]:  # (1, 2) used again: more recent than (3, 4); (3, 4) dropped
        pool.add(7, gram)
    assert pool.candidates(7) == [[5, 6], [1, 2]]
    drafter = LookaheadDrafter(LookaheadSettings(window=2, ngram=3, guess_set=2, pool_from_prompt=True))
    drafter.start([7, 1, 2, 7, 3, 4, 7, 5, 6], 7, None)  # the prompt's 3-grams after 7: (1, 2), (3, 4), (5, 6)
    tree = drafter.propose(7, 5)  # room for the candidates only
    assert set(drafted(tree)) == {(5,), (5, 6), (3,), (3, 4)} and tree.children[0] == [1, 3]  # newest first


# ---- SpS: the draft model's greedy chain at temperature 0 ----

def test_sps_chain_is_the_draft_models_greedy_chain():
    draft = tiny_llama(vocab=64, seed=3)
    drafter = SpsDrafter(draft, SamplingParams(temperature=0.0), k=4, generator=None)
    prompt = [5, 9, 2, 17]
    drafter.start(prompt, 30, None)
    sequence = prompt + [30]
    with torch.no_grad():
        for _ in range(4):  # the reference: full recomputes, no cache
            sequence.append(int(draft(torch.tensor([sequence])).logits[0, -1].argmax()))
    assert drafter.propose(30, 16).tokens.tolist() == sequence[len(prompt):]


# ---- P-EAGLE, DFlash, PARD: one round's K planted distributions ----

@pytest.mark.parametrize("choices, total, room", [
    (default_choices(4, 3), 7, 64), (CHOICES, 64, 64), (CHOICES, 8, 6), (default_choices(3, 1), 8, 64)])
def test_one_forward_tree_is_the_best_choice_nodes_by_path_value(choices, total, room):
    """The tree the three one-forward drafters share (``PEagleDrafter.propose``; DFlash's and PARD's differ in the
    forward only): node [r1, ..., rd] is depth d's rd-th best token, the best ``min(total, room - 1)`` nodes by path
    value are kept (ties: shallower)."""
    depth = max(len(c) for c in choices)
    table = planted_table(30, depth, V)  # (K, V): depth d's log-probabilities
    target = tiny_llama(vocab=V, layers=2, seed=0)
    drafter = PEagleDrafter(tiny_peagle_head(target, para_depths=depth), "cpu", depth=depth, choices=choices,
                            total_tokens=total)
    drafter.vocab, drafter.parallel_log_probs = None, lambda: table  # the full vocabulary's columns
    nodes = []
    for choice in {tuple(c) for c in choices}:
        picked = [ranked_children(table[d], V)[r] for d, r in enumerate(choice)]
        nodes.append((tuple(t for t, _ in picked), sum(c for _, c in picked)))
    nodes.sort(key=lambda node: (-node[1], len(node[0])))
    assert set(drafted(drafter.propose(5, room))) == {path for path, _ in nodes[:min(total, room - 1)]}


# ---- the oracle: the planted continuation, then the target's greedy chain ----

def test_oracle_drafts_the_planted_continuation():
    """A stored reference the target would never write (planted) is drafted as it stands, ``depth`` tokens at a time
    and no more than the room; once the output leaves it the oracle drafts the target's own greedy chain."""
    target = tiny_llama(vocab=64, seed=3)
    prompt, reference = [5, 9, 2, 17], [30, 41, 7, 7, 12, 3, 60, 22, 1, 9]
    oracle = OracleDrafter(target, depth=3, references={tuple(prompt): reference})
    oracle.start(prompt, reference[0], None)
    tree = oracle.propose(reference[0], 64)
    assert tree.tokens.tolist() == reference[:4] and tree.meta["oracle_from_reference"] == 1
    assert list(drafted(tree)) == [tuple(reference[1:2]), tuple(reference[1:3]), tuple(reference[1:4])]  # a chain
    oracle.observe(reference[1:3], None)  # two accepted: the next chain starts behind them
    assert oracle.propose(reference[2], 64).tokens.tolist() == reference[2:6]
    assert oracle.propose(reference[2], 3).tokens.tolist() == reference[2:5]  # room for 2 drafts besides the root
    oracle.observe([50], None)  # the output left the reference: the target's greedy continuation
    sequence = prompt + reference[:3] + [50]
    with torch.no_grad():
        for _ in range(3):
            sequence.append(int(target(torch.tensor([sequence])).logits[0, -1].argmax()))
    tree = oracle.propose(50, 64)
    assert tree.tokens.tolist() == sequence[-4:] and tree.meta["oracle_from_reference"] == 0
