"""Medusa: the published head format (strict, safe loading), the drafter's tree, and greedy identity
with plain decoding (fp32, tiny random models; SmolLM2 with the shipped head)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.core.engine as engine
from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import choice_paths
from eagle2.drafters.medusa import MedusaDrafter
from eagle2.heads.checkpoint import WeightFileError
from eagle2.heads.medusa_heads import MC_SIM_7B_63, MedusaHeads, load_medusa_heads, save_medusa_heads
from tests.conftest import tiny_llama

GREEDY = SamplingParams()
PROJECT = Path(__file__).resolve().parents[1]
PROMPTS = [[2, 5, 3], [7, 7, 3, 9, 4, 11], [3]]
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def tiny_medusa(target, num_heads: int = 3, own_lm_head: bool = True, seed: int = 3, std: float = 0.3):
    """Random heads for ``target`` (ResBlock weights random, so heads differ); own LM heads start as the
    target's, shared ones are the target's."""
    torch.manual_seed(seed)
    cfg = target.config
    heads = MedusaHeads(num_heads, 1, cfg.hidden_size, cfg.vocab_size if own_lm_head else None)
    with torch.no_grad():
        for head in heads:
            head[0].linear.weight.normal_(0, std)
            if own_lm_head:
                head[1].weight.copy_(target.lm_head.weight)
    if not own_lm_head:
        heads.attach_lm_head(target.lm_head)
    return heads.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)


def published_state(target, num_heads=5, seed=1) -> dict[str, torch.Tensor]:
    """A state dict laid out as the authors' ``medusa_lm_head.pt`` (1 layer, own LM heads)."""
    g = torch.Generator().manual_seed(seed)
    h, v = target.config.hidden_size, target.config.vocab_size
    state = {}
    for k in range(num_heads):
        state[f"{k}.0.linear.weight"] = torch.randn(h, h, generator=g)
        state[f"{k}.0.linear.bias"] = torch.randn(h, generator=g)
        state[f"{k}.1.weight"] = torch.randn(v, h, generator=g)
    return state


def write_published(folder: Path, state, config_heads=2, fmt="pt") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"base_model_name_or_path": "lmsys/vicuna-7b-v1.3",
                                                    "medusa_num_heads": config_heads, "medusa_num_layers": 1}))
    if fmt == "pt":
        torch.save(state, folder / "medusa_lm_head.pt")
    else:
        from safetensors.torch import save_file

        save_file(state, str(folder / "medusa_lm_head.safetensors"))
    return folder


# ---- format ----

@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_published_layout_loads_every_weight(target, tmp_path, caplog, fmt):
    state = published_state(target)
    with caplog.at_level(logging.WARNING):
        heads = load_medusa_heads(write_published(tmp_path / "m", state, fmt=fmt), target)
    assert len(heads) == 5 and heads.own_lm_head  # head count from the weights, not the config's 2
    assert "config.json says 2 heads" in caplog.text
    loaded = heads.state_dict()
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], state[k]) for k in state)
    x = torch.randn(4, target.config.hidden_size)
    ref = torch.stack([state[f"{k}.1.weight"] @ (x + torch.nn.functional.silu(
        x @ state[f"{k}.0.linear.weight"].T + state[f"{k}.0.linear.bias"])).T for k in range(5)]).transpose(1, 2)
    assert torch.allclose(heads(x), ref, atol=1e-4)


def test_missing_extra_and_misshaped_keys_are_named(target, tmp_path):
    state = published_state(target)
    for broken, name in [({k: v for k, v in state.items() if k != "3.0.linear.bias"}, "3.0.linear.bias"),
                         ({**state, "4.2.weight": state["4.1.weight"]}, "4.2.weight"),
                         ({**state, "medusa_head.0.0.linear.weight": state["0.0.linear.weight"]}, "medusa_head")]:
        with pytest.raises(KeyError, match=name.replace(".", r"\.")):
            load_medusa_heads(write_published(tmp_path / name, broken), target)
    with pytest.raises(ValueError, match="2.1.weight"):
        load_medusa_heads(write_published(tmp_path / "shape", {**state, "2.1.weight": state["2.1.weight"][:-1]}),
                          target)


def test_pickled_code_is_refused(target, tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("pickled code ran",))

    folder = write_published(tmp_path / "m", published_state(target))
    torch.save({**published_state(target), "0.1.weight": Payload()}, folder / "medusa_lm_head.pt")
    refused = f"refused: {folder}/medusa_lm_head.pt is a pickle, which can run code"
    with pytest.raises(WeightFileError, match=refused) as err:
        load_medusa_heads(folder, target)
    assert "(it calls print)" in str(err.value) and "weights_only" not in str(err.value)


@pytest.mark.parametrize("own_lm_head", [True, False])
def test_save_load_round_trip_is_exact(target, tmp_path, own_lm_head):
    heads = tiny_medusa(target, own_lm_head=own_lm_head)
    loaded = load_medusa_heads(save_medusa_heads(heads, tmp_path / "m"), target)
    assert loaded.own_lm_head == own_lm_head
    assert json.loads((tmp_path / "m" / "config.json").read_text())["shared_lm_head"] == (not own_lm_head)
    x = torch.randn(3, target.config.hidden_size)
    assert torch.equal(loaded(x), heads(x))


def test_base_config_tree_is_the_authors_mc_sim_7b_63():
    base = OmegaConf.load(PROJECT / "conf/model/_base.yaml")
    assert OmegaConf.to_container(base.medusa_choices) == MC_SIM_7B_63
    assert len(choice_paths(MC_SIM_7B_63)) == 63


# ---- the drafter's tree ----

def test_tree_nodes_are_the_heads_ranked_choices(target):
    heads = tiny_medusa(target)
    drafter = MedusaDrafter(heads, "cpu", choices=TREE)
    hidden = torch.randn(5, target.config.hidden_size)
    drafter.start([1, 2, 3, 4, 5], 6, hidden)
    tree = drafter.propose(root=6, room=100)
    ranked = heads(hidden[-1]).argsort(dim=-1, descending=True)  # (K, V)
    for node, path in enumerate(choice_paths(TREE), start=1):
        assert int(tree.tokens[node]) == int(ranked[len(path) - 1, path[-1]])
        parent = choice_paths(TREE).index(path[:-1]) + 1 if len(path) > 1 else 0
        assert int(tree.parents[node]) == parent
    assert len(drafter.propose(root=6, room=3)) == 3  # cut to the room left, parents kept


def test_tree_deeper_than_the_heads_is_refused(target):
    with pytest.raises(ValueError, match="4 deep"):
        MedusaDrafter(tiny_medusa(target, num_heads=3), "cpu", choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])


# ---- greedy identity ----

def decode(target, method, prompt, n, heads):
    drafter = build_drafter(OmegaConf.create(method), target, GREEDY, None, weights={"medusa_head": heads})
    return engine.generate(target, drafter, prompt, GREEDY, n, set())


@pytest.mark.parametrize("own_lm_head", [True, False])
def test_medusa_equals_plain_on_tiny(target, own_lm_head):
    heads = tiny_medusa(target, own_lm_head=own_lm_head)
    accepted = 0
    for prompt in PROMPTS:
        ref = decode(target, {"name": "plain"}, prompt, 40, heads).output_ids
        out = decode(target, {"name": "medusa", "choices": TREE}, prompt, 40, heads)
        assert out.output_ids == ref
        accepted += sum(out.accept_lengths) - out.target_forwards
    assert accepted > 0


def wrong_commit_is_caught(decode_fn, target, method: dict, heads, prompts, monkeypatch) -> bool:
    """Whether committing the first nodes instead of the accepted path changes the greedy output (a choice-tree
    method's negative control; Hydra's tests share it)."""
    real = engine.keep_tree_path
    monkeypatch.setattr(engine, "keep_tree_path",
                        lambda cache, prefix, kept: real(cache, prefix, list(range(len(kept)))))
    outs = [decode_fn(target, method, p, 40, heads).output_ids for p in prompts]
    monkeypatch.undo()
    return outs != [decode_fn(target, {"name": "plain"}, p, 40, heads).output_ids for p in prompts]


def shipped_heads_accept_losslessly(decode_fn, smollm2, method: dict, heads) -> int:
    """Drafts accepted over two chat prompts on SmolLM2 with shipped heads, each output asserted equal to plain
    decoding's (fp32)."""
    from eagle2.prompts.chat import encode_conversation

    model, tok = smollm2
    accepted = 0
    for q in ["Write a haiku about the sea.", "What is 17 times 23? Explain step by step."]:
        prompt = encode_conversation(tok, "tokenizer", [q], [])
        out = decode_fn(model, method, prompt, 48, heads)
        assert out.output_ids == decode_fn(model, {"name": "plain"}, prompt, 48, heads).output_ids
        accepted += sum(out.accept_lengths) - out.target_forwards
    return accepted


def test_wrong_commit_breaks_identity(target, monkeypatch):
    """Negative control: committing the first nodes instead of the accepted path is caught."""
    assert wrong_commit_is_caught(decode, target, {"name": "medusa", "choices": TREE}, tiny_medusa(target), PROMPTS,
                                  monkeypatch)


@pytest.mark.slow
def test_medusa_equals_plain_on_smollm2_with_shipped_head(smollm2):
    heads = load_medusa_heads(PROJECT / "artifacts/smollm2/medusa_head", smollm2[0])
    method = {"name": "medusa", "choices": [[0], [1], [0, 0], [0, 0, 0]]}
    assert shipped_heads_accept_losslessly(decode, smollm2, method, heads) > 0


def test_draft_vocabulary_round_trips_and_restricts_the_tree(target, tmp_path):
    heads = tiny_medusa(target, own_lm_head=False)
    heads.draft_vocab = torch.tensor([5, 3, 9, 12, 0, 7])
    loaded = load_medusa_heads(save_medusa_heads(heads, tmp_path / "m"), target)
    assert torch.equal(loaded.draft_vocab, heads.draft_vocab)
    drafter = MedusaDrafter(loaded, "cpu", choices=TREE)
    hidden = torch.randn(5, target.config.hidden_size)
    drafter.start([1, 2, 3, 4, 5], 6, hidden)
    tree = drafter.propose(root=6, room=100)
    ranked = heads(hidden[-1]).argsort(dim=-1, descending=True)  # (K, 6) columns of the vocabulary
    for node, path in enumerate(choice_paths(TREE), start=1):
        assert int(tree.tokens[node]) == int(heads.draft_vocab[ranked[len(path) - 1, path[-1]]])
    for prompt in PROMPTS:  # lossless whatever the vocabulary
        assert (decode(target, {"name": "medusa", "choices": TREE}, prompt, 30, loaded).output_ids
                == decode(target, {"name": "plain"}, prompt, 30, loaded).output_ids)


def test_heads_draft_from_the_last_accepted_tokens_hidden_state(target):
    """After a round accepts several tokens, the next tree comes from the hidden state of the last of them
    (the one whose LM-head output is the new root), not of the round's first."""
    heads = tiny_medusa(target, num_heads=3)
    hidden = torch.randn(4, target.config.hidden_size, generator=torch.Generator().manual_seed(0)) * 3

    def proposal(prompt_hidden, observed=None):
        drafter = MedusaDrafter(heads, "cpu", choices=TREE)
        drafter.start([2, 5, 3], 4, prompt_hidden)
        if observed is not None:
            drafter.observe([4, 6, 9, 1], observed)  # kept nodes: the root and three accepted tokens
        return drafter.propose(1, room=50).tokens.tolist()

    last, first = proposal(hidden[-1:]), proposal(hidden[:1])
    assert last != first  # the check below can tell them apart
    assert proposal(hidden[:2], observed=hidden) == last
