"""Token Recycling: the authors' template, the adjacency matrix written from the target's top-k at every
verified node and at the prompt, the breadth-first fill of the template (unwritten rows left out), the
room limit and per-node records. Its losslessness is certified in ``test_lossless_new_methods.py``, its
batched decoding in ``test_batch.py``."""

from __future__ import annotations

from collections import Counter

import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import DraftTree
from eagle2.drafters.token_recycling import TokenRecyclingDrafter

V = 16


class IdentityHead(torch.nn.Module):
    """Features are logits: the seeding's LM head as the identity."""

    def forward(self, hidden):
        return hidden


def drafter(choices, top_k=3) -> TokenRecyclingDrafter:
    return TokenRecyclingDrafter(IdentityHead(), V, "cpu", choices, top_k=top_k)


def ranked(*tokens: int) -> torch.Tensor:
    """A logits row ranking ``tokens`` first, in order."""
    row = torch.zeros(V)
    row[list(tokens)] = torch.arange(len(tokens), 0, -1, dtype=torch.float)
    return row


def test_the_authors_template_is_the_default():
    cfg = OmegaConf.load("conf/method/token_recycling.yaml")
    assert cfg.top_k == 8 and len(cfg.choices) == 80
    assert sorted(Counter(len(p) for p in cfg.choices).items()) == [(1, 8), (2, 21), (3, 25), (4, 15), (5, 8), (6, 3)]


def test_prompt_seeds_the_matrix_and_the_template_is_filled_breadth_first():
    d = drafter([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    d.start([4, 5], 6, torch.stack([ranked(5, 7, 8), ranked(9, 10, 11)]))  # prompt rows: 4 -> 5,7,8; 5 -> 9,10,11
    tree = d.propose(4, room=100)
    # [0] = 5, [1] = 7; [0,0] = 9, [0,1] = 10; 7's row unwritten: [1,0] left out; 9's row unwritten: [0,0,0] too
    assert tree.tokens.tolist() == [4, 5, 7, 9, 10]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1]
    assert tree.records["rank"] == [0, 1, 0, 1] and tree.records["depth"] == [1, 1, 2, 2]
    conf = torch.tensor(tree.records["confidence"])
    p4 = ranked(5, 7, 8).softmax(-1)
    assert torch.allclose(conf[:2], p4[[5, 7]])  # the target's probability when the row was written
    assert torch.allclose(torch.tensor(tree.records["value"])[2], p4[5] * ranked(9, 10, 11).softmax(-1)[9])


def test_every_verified_node_rewrites_its_row():
    d = drafter([[0], [1], [0, 0]])
    d.start([4], 6, ranked(5, 7, 8)[None])
    tree = d.propose(4, room=100)  # 4 -> 5, 7; 5 unwritten
    assert tree.tokens.tolist() == [4, 5, 7]
    d.observe_target(tree, torch.stack([ranked(7, 5, 1), ranked(2, 3, 1), ranked(12, 13, 14)]))
    assert d.successors[[4, 5, 7]].tolist() == [[7, 5, 1], [2, 3, 1], [12, 13, 14]]  # rejected nodes' rows too
    assert d.propose(4, room=100).tokens.tolist() == [4, 7, 5, 12]


def test_room_truncates_and_unknown_root_proposes_nothing():
    d = drafter([[0], [1], [2], [0, 0]])
    d.start([4, 5], 6, torch.stack([ranked(5, 7, 8), ranked(9, 10, 11)]))
    assert d.propose(4, room=3).tokens.tolist() == [4, 5, 7]
    assert len(d.propose(13, room=100)) == 1


def test_build_and_one_round_on_a_real_target(tiny):
    target = tiny[0]
    method = OmegaConf.create({"name": "token_recycling", "top_k": 4, "choices": [[0], [1], [0, 0]]})
    d = build_drafter(method, target, SamplingParams(), None)
    prompt = [2, 5, 3, 2, 5]
    with torch.no_grad():
        hidden = target.model(torch.tensor([prompt])).last_hidden_state[0]
        d.start(prompt, 3, hidden)
        tree = d.propose(2, room=100)
        top = target.lm_head(hidden).topk(4).indices  # the target's top-4 after each prompt position
    assert isinstance(tree, DraftTree) and tree.tokens[1:3].tolist() == top[3, :2].tolist()  # the last 2's row
