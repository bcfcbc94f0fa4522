"""Batched decoding on the compiled path (``eagle2.core.compiled_batch``) is lossless: in fp32 the greedy outputs of
ragged prompts decoded B at a time through the target's static-shape forward (uncompiled: fast; and through
inductor on a tiny target) are token-identical to the eager batched engine's, which equal batch-1 plain decoding
(``tests/test_batch.py``); ``compile_choice.prepare`` at batch B compiles the target, its B-row graphs included,
and the EAGLE heads for B rows (their batched drafting: ``tests/test_compiled_batch_heads.py``), a draft model and
Medusa / Hydra staying eager. Slow: SmolLM2 in fp32 with its heads compiled for the batch, plain decoding's tokens.

Negative controls (by hand, once), ``test_batched_static_path_equals_eager``: ``StaticBatchKV.forward`` ignoring
the verifier's mask (every row sees every column, other rows' stale entries included) failed for every method;
ignoring the rows' own position ids (every row at the batch width) failed for eagle, eagle2, pld_tree and medusa
(plain, sps and eagle3 kept their greedy tokens on the tiny model).
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

from eagle2.bench import compile_choice
from eagle2.core.batch_cache import BatchCache
from eagle2.core.compiled import attach
from eagle2.core.compiled_batch import StaticBatchKV
from tests.test_batch import METHODS, batch_decode
from tests.test_batch import weights as weights  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("synthetic_cost_profile")  # auto budgets independent of machine load
BATCH_METHODS = ["plain", "sps", "eagle", "eagle2", "eagle3", "pld_tree", "medusa"]


def with_path(target, compile: bool):
    """A copy of ``target`` decoding through the static path (the original stays eager)."""
    twin = copy.deepcopy(target)
    attach(twin, compile=compile)
    return twin


def outputs(results) -> list[list[int]]:
    return [r.output.output_ids for r in results]


@pytest.mark.parametrize("name", BATCH_METHODS)
def test_batched_static_path_equals_eager(tiny, weights, name):  # noqa: F811
    target = tiny[0]
    static = with_path(target, compile=False)
    for batch_size, refill in ((3, True), (4, False)):
        eager = outputs(batch_decode(target, METHODS[name], weights, batch_size, refill=refill))
        ours = outputs(batch_decode(static, METHODS[name], weights, batch_size, refill=refill))
        assert ours == eager, (name, batch_size)


@pytest.fixture(scope="module")
def compiled_twin(tiny):
    return with_path(tiny[0], compile=True)


@pytest.mark.parametrize("name", ["plain", "eagle2"])
def test_batched_compiled_equals_eager_on_tiny(tiny, compiled_twin, weights, name):  # noqa: F811
    eager = outputs(batch_decode(tiny[0], METHODS[name], weights, 3))
    assert outputs(batch_decode(compiled_twin, METHODS[name], weights, 3)) == eager
    assert isinstance(BatchCache(compiled_twin, 3).cache, StaticBatchKV)


def test_prepare_at_batch_b_compiles_the_target_and_the_heads_for_b_rows(tiny, weights, monkeypatch):  # noqa: F811
    from eagle2.heads.static_head_batch import StaticBatchHeadKV

    target, weights = copy.deepcopy(tiny[0]), copy.deepcopy(weights)
    warmed = []
    for kind in (StaticBatchKV, StaticBatchHeadKV):
        monkeypatch.setattr(kind, "warm_up", lambda self, *a, kind=kind: warmed.append((kind, self.rows)) or 1.0)
    monkeypatch.setattr("eagle2.core.compiled.StaticDecoder.warm_up", lambda self, *a: 0.5)
    cfg = OmegaConf.create({"engine": {"compile": "true"}, "model": {"device": "cpu"}, "batch_size": 4})
    assert compile_choice.prepare(cfg, target, weights) == 3.5  # the target's two, the two EAGLE heads'
    assert target.static_decoder is not None
    assert warmed == [(StaticBatchKV, 4), (StaticBatchHeadKV, 4), (StaticBatchHeadKV, 4)]
    assert [key for key, w in weights.items() if getattr(w, "static_batch", None) is not None] == ["head",
                                                                                                 "eagle3_head"]
    assert all(getattr(w, "static_decoder", None) is None for w in weights.values())  # their own caches: eager
    assert all(getattr(w, "compiled_blocks", None) is None for w in weights.values())  # Medusa, Hydra: eager


def test_batched_cost_profile_on_the_static_path(tiny):
    """An auto budget at batch B measures ``T_B(q)`` on the path the run uses: B equal rows in a ``StaticBatchKV``,
    the prompt causal, each tree cropped off again."""
    import eagle2.bench.cost_profile as cp

    static = with_path(tiny[0], compile=False)
    times = cp.measure_verify(static, context=8, max_q=3, reps=1, rows=3)
    assert len(times) == 3 and all(t > 0 for t in times)
    cache = cp.new_cache(static, rows=3)
    assert isinstance(cache, StaticBatchKV)
    prompt = torch.arange(15).reshape(3, 5) % 16
    eager = cp.forward_target(tiny[0], prompt, cp.new_cache(tiny[0]))
    ours = cp.forward_target(static, prompt, cache)
    assert ours.shape == eager.shape and (ours - eager).abs().max() < 1e-5  # a causal prompt of 3 rows
    cache.crop(2)
    assert cache.get_seq_length() == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["plain", "eagle2"])
def test_batched_compiled_smollm2_equals_eager_plain(smollm2, name):
    """The real target in fp32, 4 prompts 3 at a time through the compiled B-row forward, its heads compiled for
    the 3 rows as ``compile_choice.prepare`` compiles them: batch-1 eager plain's tokens."""
    from collections import deque

    import eagle2.core.batch_engine as batch_engine
    import eagle2.core.engine as engine
    from eagle2.bench.methods import build_drafter
    from eagle2.bench.runner import resolve_artifact
    from eagle2.heads.family import families
    from eagle2.prompts.chat import encode_conversation
    from eagle2.registry import method_spec
    from tests.test_results_store import config

    target, tokenizer = smollm2
    method = config(f"method={name}").method
    compiled = with_path(target, compile=True)
    weights = {key: families()[key].load(resolve_artifact(config(f"method={name}").model[key]), compiled)
               for key in method_spec(method).weights}
    for part in compile_choice.compiled_heads(weights, rows=3):
        part.warm_up()
    questions = ("What is the capital of France?", "Write a haiku about autumn leaves.", "Name three primes.",
                 "Why is the sky blue? Answer in one sentence.")
    prompts = [encode_conversation(tokenizer, "tokenizer", [q], [], None) for q in questions]
    greedy = engine.SamplingParams()
    plain = [engine.generate(target, build_drafter(OmegaConf.create({"name": "plain"}), target, greedy, None,
                                                   weights={}), p, greedy, 24, set()).output_ids for p in prompts]
    queue = deque(batch_engine.BatchRequest(p, build_drafter(method, compiled, greedy, None, weights=weights), 24,
                                            key=i) for i, p in enumerate(prompts))
    done = {}
    batch_engine.BatchEngine(compiled, greedy, set(), 3).run(queue, lambda r: done.__setitem__(r.request.key, r))
    assert [done[i].output.output_ids for i in range(len(prompts))] == plain
