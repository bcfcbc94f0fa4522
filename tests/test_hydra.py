"""Hydra: the heads' format (strict, safe loading), the tree drafted depth by depth from each node's own
path, greedy identity with plain decoding (fp32, tiny random models; SmolLM2 with the shipped heads), exact
losslessness at T > 0 (the certification machinery of ``test_certification_exact.py``), training on a tiny
target, and the control: heads whose path input is blanked stay lossless (the acceptance rule guarantees
it) while drafting differently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.core.engine as engine
import tests.test_certification as cert
import tests.test_certification_exact as exact_cert
from eagle2.bench.methods import build_drafter
from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import choice_paths
from eagle2.drafters.hydra import HydraDrafter
from eagle2.heads.family import families
from eagle2.heads.hydra_heads import FAMILY, HydraHeads, load_hydra_heads, save_hydra_heads
from tests.conftest import tiny_llama
from tests.test_medusa import shipped_heads_accept_losslessly, wrong_commit_is_caught

GREEDY = SamplingParams()
PROJECT = Path(__file__).resolve().parents[1]
PROMPTS = [[2, 5, 3], [7, 7, 3, 9, 4, 11], [3]]
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
HYDRA = {"name": "hydra", "choices": [[0], [1], [2], [3], [0, 0], [1, 0], [2, 0], [3, 0]]}


def tiny_hydra(target, num_heads: int = 3, own_lm_head: bool = False, rank: int | None = None, seed: int = 3,
               std: float = 0.3) -> HydraHeads:
    """Random heads for ``target`` (block weights random, so the path matters); they read the target's
    embedding and share its LM head unless ``own_lm_head`` (then a copy of it)."""
    torch.manual_seed(seed)
    cfg = target.config
    heads = HydraHeads(num_heads, 1, cfg.hidden_size, cfg.vocab_size if own_lm_head else None, rank)
    with torch.no_grad():
        for name, p in heads.named_parameters():
            if name.split(".")[1] == "0" and name.endswith("weight"):  # the path block
                p.normal_(0, std)
            elif name.endswith(".1.weight"):  # an own LM head: the target's
                p.copy_(target.lm_head.weight)
    if not own_lm_head:
        heads.attach_lm_head(target.lm_head)
    return heads.attach_embedding(target.get_input_embeddings()).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)


# ---- format ----

@pytest.mark.parametrize("rank", [None, 3, [5, 0, 2]])
@pytest.mark.parametrize("own_lm_head", [False, True])
def test_save_load_round_trip(target, tmp_path, rank, own_lm_head):
    heads = tiny_hydra(target, rank=rank, own_lm_head=own_lm_head)
    heads.draft_vocab = torch.tensor([3, 1, 4, 5, 9, 2, 6])
    loaded = load_hydra_heads(save_hydra_heads(heads, tmp_path / "h"), target)
    assert set(loaded.state_dict()) == set(heads.state_dict())
    assert loaded.rank == rank and loaded.own_lm_head == own_lm_head
    assert torch.equal(loaded.draft_vocab, heads.draft_vocab)
    hidden, path = torch.randn(4, target.config.hidden_size), torch.randint(16, (4, 3))
    assert torch.allclose(loaded.path_logits(hidden, path), heads.path_logits(hidden, path))
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["hydra_num_heads"] == 3 and config["shared_lm_head"] == (not own_lm_head)
    first = "0.0.down.weight" if rank else "0.0.linear.weight"
    assert heads.state_dict()[first].shape[1] == 2 * target.config.hidden_size  # [f; e(root)]
    assert heads.state_dict()[first.replace("0.", "2.", 1)].shape[1] == 4 * target.config.hidden_size
    if isinstance(rank, list):  # one rank per head; 0 = that head's full matrix
        assert heads.state_dict()["0.0.down.weight"].shape[0] == 5 and "1.0.linear.weight" in heads.state_dict()


def test_loading_is_strict(target, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_hydra_heads(tiny_hydra(target), tmp_path / "h")
    state = load_file(str(folder / "hydra_heads.safetensors"))
    for name, broken in [("extra", {**state, "0.9.linear.weight": state["0.0.linear.bias"].clone()}),
                         ("missing", {k: v for k, v in state.items() if k != "1.0.linear.bias"}),
                         ("shape", {**state, "2.0.linear.weight": state["2.0.linear.weight"][:, :-1].contiguous()})]:
        bad = tmp_path / name
        bad.mkdir()
        (bad / "config.json").write_text((folder / "config.json").read_text())
        save_file(broken, str(bad / "hydra_heads.safetensors"))
        with pytest.raises((KeyError, ValueError, RuntimeError)):
            load_hydra_heads(bad, target)


def test_weight_kind_is_registered():
    assert families()["hydra_head"] is FAMILY


# ---- the tree: each node's children come from its own path ----

def test_children_depend_on_their_own_path(target):
    heads = tiny_hydra(target)
    drafter = HydraDrafter(heads, "cpu", choices=TREE)
    hidden = torch.randn(5, target.config.hidden_size)
    drafter.start([1, 2, 3, 4, 5], 6, hidden)
    tree = drafter.propose(root=6, room=100)
    paths = choice_paths(TREE)
    f = hidden[-1]
    for node, path in enumerate(paths, start=1):
        ancestors = [paths.index(path[:d]) + 1 for d in range(1, len(path))]  # tree indices of the drafted path
        drafted = torch.tensor([6] + [int(tree.tokens[a]) for a in ancestors])
        with torch.no_grad():
            logits = heads.head_logits(len(path) - 1, heads.head_features(len(path) - 1, f, drafted))
        assert int(tree.tokens[node]) == int(logits.argsort(descending=True)[path[-1]])
        probs = torch.softmax(logits, -1)
        assert abs(float(tree.confidence[node]) - float(probs.max() if path[-1] == 0 else
                                                          probs.sort(descending=True).values[path[-1]])) < 1e-5
    assert tree.records["depth"] == [len(p) for p in paths]
    assert len(drafter.propose(root=6, room=3)) == 3  # cut to the room left, parents kept


def test_tree_deeper_than_the_heads_is_refused(target):
    with pytest.raises(ValueError, match="4 deep"):
        HydraDrafter(tiny_hydra(target), "cpu", choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])


# ---- greedy identity ----

def decode(target, method, prompt, n, heads, params=GREEDY, generator=None):
    drafter = build_drafter(OmegaConf.create(method), target, params, generator, weights={"hydra_head": heads})
    return engine.generate(target, drafter, prompt, params, n, set(), generator)


def blank_path(heads: HydraHeads) -> HydraHeads:
    """The control: the same heads with every path token's embedding replaced by zeros (head k ignores the path)."""
    heads.embed = lambda tokens: torch.zeros(*tokens.shape, heads.hidden)
    return heads


@pytest.mark.parametrize("variant", ["shared", "own", "low_rank", "path_blanked"])
def test_hydra_equals_plain_on_tiny(target, variant):
    heads = tiny_hydra(target, own_lm_head=variant == "own", rank=3 if variant == "low_rank" else None)
    if variant == "path_blanked":
        heads = blank_path(heads)
    accepted = 0
    for prompt in PROMPTS:
        ref = decode(target, {"name": "plain"}, prompt, 40, heads).output_ids
        out = decode(target, {"name": "hydra", "choices": TREE}, prompt, 40, heads)
        assert out.output_ids == ref
        accepted += sum(out.accept_lengths) - out.target_forwards
    assert accepted > 0


def test_blanked_path_drafts_other_trees(target):
    """The control really changes drafting: with the path blanked the depth-2 nodes differ on some round."""
    hidden = torch.randn(8, 5, target.config.hidden_size)
    trees = []
    for heads in (tiny_hydra(target), blank_path(tiny_hydra(target))):
        drafter = HydraDrafter(heads, "cpu", choices=TREE)
        out = []
        for h in hidden:
            drafter.start([1, 2, 3, 4, 5], 6, h)
            out.append(drafter.propose(root=6, room=100).tokens.tolist())
        trees.append(out)
    assert trees[0] != trees[1]


def test_wrong_commit_breaks_identity(target, monkeypatch):
    """Negative control: committing the first nodes instead of the accepted path is caught."""
    assert wrong_commit_is_caught(decode, target, {"name": "hydra", "choices": TREE}, tiny_hydra(target), PROMPTS,
                                  monkeypatch)


@pytest.mark.slow
def test_hydra_equals_plain_on_smollm2_with_shipped_heads(smollm2):
    heads = load_hydra_heads(PROJECT / "artifacts/smollm2/hydra_head", smollm2[0])
    method = {"name": "hydra", "choices": [[0], [1], [0, 0], [0, 0, 0]]}
    assert shipped_heads_accept_losslessly(decode, smollm2, method, heads) > 0


# ---- lossless at T > 0: one real round, every random outcome enumerated ----

models = cert.models  # the module-scoped 8-token certification target


@pytest.fixture(scope="module")
def hydra_heads(models):
    return tiny_hydra(models[0], num_heads=2, own_lm_head=True, seed=4, std=0.5)


@pytest.fixture
def with_hydra(monkeypatch, hydra_heads):
    def build(*args, weights=None, **kwargs):
        return build_drafter(*args, weights={**(weights or {}), "hydra_head": hydra_heads}, **kwargs)

    monkeypatch.setattr(exact_cert, "build_drafter", build)


@pytest.fixture(scope="module")
def exact(models):
    return exact_cert.ExactCheck(models)


@pytest.mark.parametrize("params", exact_cert.PARAMS, ids=["T1", "T0.7-p0.9-k6"])
def test_hydra_round_is_exactly_lossless(exact, with_hydra, params):
    diff, full = exact(HYDRA, params)
    print(f"hydra {params}: max abs diff {diff:.2e}, P(bonus after full acceptance) {full:.3f}")
    assert diff < exact_cert.PASS_DIFF
    assert full > exact_cert.MIN_FULL


def test_hydra_with_blanked_path_is_exactly_lossless(exact, monkeypatch, models):
    heads = blank_path(tiny_hydra(models[0], num_heads=2, own_lm_head=True, seed=4, std=0.5))
    monkeypatch.setattr(exact_cert, "build_drafter",
                        lambda *a, weights=None, **k: build_drafter(*a, weights={"hydra_head": heads}, **k))
    diff, _ = exact(HYDRA, SamplingParams(1.0))
    assert diff < exact_cert.PASS_DIFF


@pytest.mark.parametrize("control", ["always_accept", "parent_bonus"])
def test_hydra_negative_control_is_rejected_exactly(exact, with_hydra, control):
    accept = {"always_accept": exact_cert._always_accept, "parent_bonus": exact_cert._parent_bonus}[control]
    diff, _ = exact(HYDRA, SamplingParams(1.0), accept)
    print(f"control {control} on hydra: max abs diff {diff:.2e}")
    assert diff > exact_cert.REJECT_DIFF


# ---- training (the Medusa trainer with Hydra heads) ----

def test_training_lowers_the_loss_and_ranks_read_the_true_path(tmp_path):
    from eagle2.training.data import collate
    from eagle2.training.loop import fit
    from eagle2.training.objectives.hydra import new_hydra_heads
    from eagle2.training.objectives.medusa import medusa_loss, true_ranks
    from eagle2.training.support.losses import LossProjection
    from tests.test_medusa_training import FIT, sequences

    small = tiny_llama(vocab=16, layers=1, seed=0, scale=10.0)
    small.requires_grad_(False)
    seqs = sequences(small)
    settings = OmegaConf.create({"num_heads": 2, "num_layers": 1, "own_lm_head": False, "rank": 4})
    heads, extra = new_hydra_heads(small, settings)
    assert extra == {"kind": "hydra", "rank": 4}
    proj = LossProjection(small.lm_head)
    batch = collate(seqs, "cpu")
    before = medusa_loss(heads, batch, proj=proj, train=False)[1]
    fit(heads, lambda m, b, **kw: medusa_loss(m, b, proj=proj, **kw), seqs, [], OmegaConf.create(FIT), tmp_path)
    after = medusa_loss(heads, batch, proj=proj, train=False)[1]
    assert after["loss"] < before["loss"] - 0.5
    assert after["top1_h1"] > before["top1_h1"]
    assert set(heads.state_dict()) == {f"{k}.0.{w}" for k in range(2) for w in ("down.weight", "up.weight", "up.bias")}
    # the held-out rank of head 1 is its rank given the sequence's own tokens t+1, t+2 (brute force)
    seq = seqs[0]
    ranks = true_ranks(heads, small.lm_head, seq)
    want = small.lm_head(seq.features).argmax(-1)
    with torch.no_grad():
        for row, t in enumerate(range(seq.start - 1, len(seq.tokens) - 2)):
            logits = heads.head_logits(1, heads.head_features(1, seq.features[t], seq.tokens[t + 1: t + 3]))
            order = logits.argsort(descending=True).tolist()
            assert int(ranks[row, 1]) == min(order.index(int(want[t + 2])), 10)


def test_training_reads_the_tokens_after_each_position():
    from eagle2.training.objectives.medusa import path_tokens

    tokens = torch.arange(10, 18)[None]  # (1, 8): token t is 10 + t
    assert path_tokens(tokens, 8, 0)[0, :, 0].tolist() == list(range(11, 18))  # head 0 at t reads x[t+1]
    assert path_tokens(tokens, 8, 2)[0, 2].tolist() == [13, 14, 15]  # head 2 at t=2 reads x[3], x[4], x[5]
