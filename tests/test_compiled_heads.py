"""The compiled draft heads (``engine.compile``: ``eagle2.heads.static_head`` for EAGLE / EAGLE-2 / EAGLE-3,
``eagle2.heads.compiled_stack`` for Medusa / Hydra) are lossless and draft the same trees.

In fp32 on tiny models, greedy decoding with a head on the compiled path is token-identical to the eager head
for eagle, eagle2, eagle3, medusa and hydra, and every round's drafted tree is the same (tokens, parents;
confidences within float tolerance): through the lean static forward uncompiled (fast, the padding and the
static buffer), and through ``torch.compile`` (inductor). A long prompt crosses the buffer's span (the buffer
grows). ``compile_choice.prepare`` compiles the heads; batched drafting refuses a head compiled for batch 1
(a head compiled for the batch: ``tests/test_compiled_batch_heads.py``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.core.engine as engine
from eagle2.bench.methods import build_drafter
from eagle2.core.compiled import CompileUnsupportedError
from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
from eagle2.heads.compiled_stack import attach_stack
from eagle2.heads.static_head import StaticHeadKV, attach_head
from tests.conftest import tiny_eagle3_head, tiny_head, tiny_llama
from tests.test_greedy import GREEDY, PROMPTS, SPEC_METHODS
from tests.test_hydra import tiny_hydra
from tests.test_medusa import tiny_medusa

pytestmark = pytest.mark.usefixtures("synthetic_cost_profile")
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
METHODS = {  # method -> (its config, the weights key of its head)
    "eagle": (SPEC_METHODS["eagle"], "head"),
    "eagle2": (SPEC_METHODS["eagle2"], "head"),
    "eagle3": (SPEC_METHODS["eagle3"], "eagle3_head"),
    "medusa": ({"name": "medusa", "choices": TREE}, "medusa_head"),
    "hydra": ({"name": "hydra", "choices": TREE}, "hydra_head"),
}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)


@pytest.fixture(scope="module")
def heads(target):
    """Eager heads of every kind, by weights key."""
    return {"head": tiny_head(target, seed=2), "eagle3_head": tiny_eagle3_head(target, seed=5),
            "medusa_head": tiny_medusa(target), "hydra_head": tiny_hydra(target)}


def on_compiled_path(head, compile: bool):
    """A copy of ``head`` on the compiled path (``compile=False``: the lean static forward, not compiled)."""
    twin = copy.deepcopy(head)
    (attach_stack if hasattr(twin, "own_lm_head") else attach_head)(twin, compile=compile)
    return twin


def decode_recording(target, method: dict, weights: dict, prompt, n: int):
    """(the greedy output, every round's drafted tree)."""
    drafter = build_drafter(OmegaConf.create(method), target, GREEDY, None, weights=weights)
    trees, propose = [], drafter.propose
    drafter.propose = lambda root, room: trees.append(propose(root, room)) or trees[-1]
    return engine.generate(target, drafter, prompt, GREEDY, n, set()), trees


def assert_same_drafting(target, name: str, eager_head, path_head, prompts, n: int = 30):
    method, key = METHODS[name]
    for prompt in prompts:
        eager, eager_trees = decode_recording(target, method, {key: eager_head}, prompt, n)
        ours, our_trees = decode_recording(target, method, {key: path_head}, prompt, n)
        assert ours.output_ids == eager.output_ids, (name, prompt)
        assert ours.accept_lengths == eager.accept_lengths, (name, prompt)
        assert len(our_trees) == len(eager_trees) > 0
        for a, b in zip(our_trees, eager_trees):
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents), (name, prompt)
            torch.testing.assert_close(a.confidence, b.confidence, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(METHODS))
def test_lean_static_head_drafts_as_eager(target, heads, name):
    head = heads[METHODS[name][1]]
    assert_same_drafting(target, name, head, on_compiled_path(head, compile=False), PROMPTS)


@pytest.fixture(scope="module")
def compiled_heads(heads):
    return {key: on_compiled_path(head, compile=True) for key, head in heads.items()}


@pytest.mark.parametrize("name", list(METHODS))
def test_compiled_head_drafts_as_eager(target, heads, compiled_heads, name):
    key = METHODS[name][1]
    if key in ("head", "eagle3_head"):
        assert compiled_heads[key].static_decoder.compiled
    assert_same_drafting(target, name, heads[key], compiled_heads[key], PROMPTS)


def test_a_long_context_grows_the_static_buffer(target, heads):
    """A prompt of 250 tokens and 30 more: the head's buffer grows past its first span while decoding."""
    head = on_compiled_path(heads["head"], compile=False)
    prompt = torch.randint(16, (250,), generator=torch.Generator().manual_seed(1)).tolist()
    assert_same_drafting(target, "eagle2", heads["head"], head, [prompt])
    assert head.static_decoder.capacity() >= 512


def test_prepare_compiles_every_head_kind(target, heads, monkeypatch):
    from eagle2.bench import compile_choice
    from eagle2.core import compiled
    from eagle2.heads import compiled_stack, static_head

    attached = []

    class Warm:
        def warm_up(self):
            return 1.0

    for module, name in ((compiled, "attach"), (static_head, "attach_head"), (compiled_stack, "attach_stack")):
        monkeypatch.setattr(module, name, lambda w, name=name, rows=1: attached.append((name, w)) or Warm())
    cfg = OmegaConf.create({"engine": {"compile": "true"}, "model": {"device": "cpu"}, "batch_size": 1})
    assert compile_choice.prepare(cfg, target, dict(heads)) == 5.0
    assert attached == [("attach", target), ("attach_head", heads["head"]), ("attach_head", heads["eagle3_head"]),
                        ("attach_stack", heads["medusa_head"]), ("attach_stack", heads["hydra_head"])]


def test_batched_drafting_refuses_a_compiled_head(target, heads):
    head = on_compiled_path(heads["head"], compile=False)
    rows = [Eagle2Drafter(head, target.lm_head, "cpu", depth=3, top_k=2, total_tokens=4) for _ in range(2)]
    for drafter in rows:
        drafter.start([1, 2, 3], 4, torch.randn(4, target.config.hidden_size))
    assert isinstance(rows[0].cache, StaticHeadKV)
    with pytest.raises(CompileUnsupportedError, match="one row at a time"):
        Eagle2Drafter.propose_batch(rows, [4, 4], [10, 10])
