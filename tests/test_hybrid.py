"""EAGLE-2's lookup branch (hybrid tree): merging a prompt-lookup chain into the drafted nodes within
the budget, deduplicated; the config hash of lookup_branch=false is the one configs always had.
Losslessness is certified in ``test_lossless_new_methods.py``."""

from __future__ import annotations

import random

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import DraftTree
from eagle2.drafters.eagle2_dynamic import merge_chain
from eagle2.results.store import config_hash
from tests.test_configs import CONF
from tests.test_greedy import PROMPTS, decode


def _columns(tokens, parents, values):
    parents_t = torch.tensor(parents)
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    log_value = torch.tensor(values).log()
    return (torch.tensor(tokens), parents_t, torch.tensor(depth), torch.zeros(len(tokens), dtype=torch.long),
            log_value.clone(), log_value)


def _check_tree(columns, keep, budget):
    tokens, parents = columns[0].tolist(), columns[1].tolist()
    kept = set(keep.tolist())
    assert len(kept) == len(keep) <= budget
    assert all(parents[i] < 0 or parents[i] in kept for i in kept)  # closed under parents
    siblings = {}
    for i in kept:
        assert (parents[i], tokens[i]) not in siblings  # deduplicated: no two siblings with one token
        siblings[parents[i], tokens[i]] = i


# drafted: depth 1 tokens 10 (V .6), 11 (.3); depth 2 under 10: 20 (.4), 21 (.1); under 11: 22 (.2)
DRAFTED = _columns([10, 11, 20, 21, 22], [-1, -1, 0, 0, 1], [.6, .3, .4, .1, .2])
ORDER = torch.tensor([0, 2, 1, 4, 3])


def test_chain_reuses_drafted_nodes_then_appends():
    columns, keep = merge_chain([11, 22, 7], DRAFTED, ORDER, budget=4)
    assert columns[0].tolist()[5:] == [7] and columns[1].tolist()[5] == 4  # 7 hangs below drafted 22
    assert keep.tolist() == [0, 1, 4, 5]  # the chain's 11, 22 (forced), 7 (new), then the best other: 10
    assert columns[2].tolist()[5] == 3 and columns[3].tolist()[5] == -1
    assert torch.isnan(columns[4][5]) and torch.isnan(columns[5][5])
    _check_tree(columns, keep, 4)


def test_chain_longer_than_budget_is_cut_and_empty_chain_is_eagle2():
    columns, keep = merge_chain([3, 4, 5, 6], DRAFTED, ORDER, budget=2)
    assert keep.tolist() == [5, 6] and columns[0].tolist()[5:] == [3, 4]
    _, keep = merge_chain([], DRAFTED, ORDER, budget=3)
    assert keep.tolist() == [0, 1, 2]  # the best 3 by V: EAGLE-2 unchanged


def test_random_merges_stay_connected_deduplicated_and_within_budget():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 12)
        parents = [rng.randint(-1, i - 1) for i in range(n)]
        tokens, values = [], []
        for i, p in enumerate(parents):
            used = {tokens[j] for j in range(i) if parents[j] == p}
            tokens.append(rng.choice([t for t in range(6) if t not in used]))
            values.append((values[p] if p >= 0 else 1.0) * rng.uniform(0.05, 1.0))
        columns = _columns(tokens, parents, values)
        depth = columns[2]
        by_depth = torch.argsort(depth, stable=True)
        order = by_depth[torch.argsort(-columns[5][by_depth], stable=True)]
        chain = [rng.randint(0, 5) for _ in range(rng.randint(0, 5))]
        budget = rng.randint(1, 10)
        merged, keep = merge_chain(chain, columns, order, budget)
        _check_tree(merged, keep, budget)
        assert len(keep) == min(budget, len(merged[0]))  # the budget is filled when there are nodes
        # the chain (cut to the budget) is a root path of the kept tree
        node, kept = -1, set(keep.tolist())
        for token in chain[:budget]:
            node = next(i for i in kept if merged[1][i] == node and merged[0][i] == token)


def test_hybrid_tree_on_tiny_has_lookup_nodes_and_accepts_them(tiny):
    target, _, head = tiny
    method = {"name": "eagle2", "depth": 3, "top_k": 3, "total_tokens": 6, "lookup_branch": True}
    accepted_lookup = 0
    for prompt in PROMPTS:
        out = decode(target, method, prompt, 40, head=head)
        assert max(r.tree_size for r in out.rounds) <= 7  # root + total_tokens
        accepted_lookup += sum(a and lk for a, lk in zip(out.nodes["accepted"], out.nodes["lookup"]))
    assert accepted_lookup > 0


def _root_path(tree: DraftTree, tokens: list[int]) -> bool:
    node = 0
    for token in tokens:
        node = next((c for c in tree.children[node] if int(tree.tokens[c]) == token), None)
        if node is None:
            return False
    return True


def test_lookup_chain_is_in_the_tree_within_the_same_budget(tiny):
    target, _, head = tiny
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]  # + first token 5: "3 4 5" was followed by "3 4 5"
    for lookup in (False, True):
        method = OmegaConf.create({"name": "eagle2", "depth": 3, "top_k": 3, "total_tokens": 5,
                                   "lookup_branch": lookup})
        drafter = build_drafter(method, target, SamplingParams(), None, head=head)
        drafter.start(prompt, 5, target.model(torch.tensor([prompt])).last_hidden_state[0].detach())
        tree = drafter.propose(5, room=100)
        assert len(tree) == 6  # the root + total_tokens, with or without the branch
        if lookup:
            assert _root_path(tree, [3, 4, 5])


def _cfg(*overrides):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=["method=eagle2", *overrides])


def test_lookup_branch_off_keeps_the_old_hash():
    on, off = _cfg("method.lookup_branch=true"), _cfg()
    old = _cfg()  # a config from before the lookup branch existed: no lookup keys at all
    OmegaConf.set_struct(old, False)
    for key in ("lookup_branch", "lookup_k", "lookup_max_ngram", "lookup_min_ngram"):
        del old.method[key]
    assert config_hash(off) == config_hash(old)
    assert config_hash(off) == config_hash(_cfg("method.lookup_k=7"))  # knobs of a branch that is off
    assert config_hash(on) != config_hash(off)
    assert config_hash(on) != config_hash(_cfg("method.lookup_branch=true", "method.lookup_k=7"))
