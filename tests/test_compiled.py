"""The compiled decoding path (``eagle2.core.compiled``, ``engine.compile``) is lossless.

- The lean static-shape forward (not compiled: fast) is token-identical to the eager transformers forward
  for every method on tiny fp32 models, trees padded to buckets, EAGLE-3's tapped layers included.
- The same through ``torch.compile`` (inductor) on a tiny target: plain, a padded tree, SpS (its draft model
  compiled too).
- The exact certification round (``test_certification_exact``) on the compiled target: one real round's
  every outcome enumerated, against the target's exact joint distribution.
- Slow: the compiled SmolLM2 (and its compiled draft heads) in fp32 token-identical to eager plain decoding for
  every method on the certification prompts.
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.core.engine as engine
import tests.test_certification as cert
from eagle2.bench import compile_choice
from eagle2.core.compiled import BUCKETS, attach, bucket, padded_mask
from tests.test_certification_exact import PASS_DIFF, ExactCheck
from tests.test_greedy import GREEDY, PROMPTS, SPEC_METHODS, decode

pytestmark = pytest.mark.usefixtures("synthetic_cost_profile")  # auto budgets independent of machine load
models = cert.models  # tiny target, SpS draft, EAGLE head (module-scoped)


def with_path(target, compile: bool):
    """A copy of ``target`` decoding through the static path (the original stays eager)."""
    twin = copy.deepcopy(target)
    attach(twin, compile=compile)
    return twin


def test_buckets_and_padding_mask():
    assert [bucket(n) for n in (1, 2, 3, 9, 26, 64, 65)] == [1, 2, 4, 16, 32, 64, 65]
    assert BUCKETS[-1] == 64
    tree = torch.zeros(1, 1, 3, 5)  # 3 real rows after a prefix of 2, all visible
    mask = padded_mask(tree, prefix=2, n=3, q=4, span=8, dtype=torch.float32, device="cpu")[0, 0]
    low = torch.finfo(torch.float32).min
    assert (mask[:3, :5] == 0).all() and (mask[:3, 5:] == low).all()  # no real row sees padding or stale slots
    assert mask[3, 5] == 0 and (mask[3, :5] == low).all() and (mask[3, 6:] == low).all()  # padding sees itself


@pytest.mark.parametrize("name", ["plain", *SPEC_METHODS])
def test_static_path_equals_eager(tiny, name):
    target, draft, head = tiny
    static = with_path(target, compile=False)
    method = SPEC_METHODS.get(name, {"name": "plain"})
    for prompt in PROMPTS:
        eager = decode(target, method, prompt, 30, head=head, draft=draft).output_ids
        ours = decode(static, method, prompt, 30, head=head, draft=draft).output_ids
        assert ours == eager, (name, prompt)


@pytest.fixture(scope="module")
def compiled_tiny(tiny):
    target, draft, head = tiny
    return with_path(target, compile=True), target, draft, head


@pytest.mark.parametrize("name", ["plain", "eagle", "sps"])
def test_compiled_equals_eager_on_tiny(compiled_tiny, name):
    compiled, target, draft, head = compiled_tiny
    method = SPEC_METHODS.get(name, {"name": "plain"})
    for prompt in PROMPTS:
        eager = decode(target, {"name": "plain"}, prompt, 24).output_ids
        assert decode(compiled, method, prompt, 24, head=head, draft=draft).output_ids == eager, (name, prompt)


def test_sps_draft_on_the_compiled_path_equals_eager(compiled_tiny):
    """SpS with its draft model compiled too (``compile_choice.prepare`` attaches a draft language model)."""
    compiled, target, draft, head = compiled_tiny
    compiled_draft = with_path(draft, compile=True)
    for prompt in PROMPTS:
        eager = decode(target, SPEC_METHODS["sps"], prompt, 24, draft=draft)
        ours = decode(compiled, SPEC_METHODS["sps"], prompt, 24, draft=compiled_draft)
        assert ours.output_ids == eager.output_ids and ours.accept_lengths == eager.accept_lengths, prompt


def test_prepare_compiles_the_target_a_draft_model_and_a_head(tiny, monkeypatch):
    """Language models through ``compiled.attach``; a head through its own path (``tests/test_compiled_heads.py``)."""
    from eagle2.core import compiled
    from eagle2.heads import static_head

    target, draft, head = tiny
    attached, heads = [], []

    class Warm:
        def warm_up(self):
            return 1.5

    monkeypatch.setattr(compiled, "attach", lambda model: attached.append(model) or Warm())
    monkeypatch.setattr(static_head, "attach_head", lambda model, rows: heads.append((model, rows)) or Warm())
    cfg = OmegaConf.create({"engine": {"compile": "true"}, "model": {"device": "cpu"}, "batch_size": 1})
    assert compile_choice.prepare(cfg, target, {"sps_draft": draft, "head": head}) == 4.5
    assert attached == [target, draft] and heads == [(head, 1)]


@pytest.fixture(scope="module")
def compiled_exact(models):
    target, draft, head = models
    return ExactCheck((with_path(target, compile=True), draft, head))


@pytest.mark.parametrize("name", ["plain", "sps", "eagle"])
def test_compiled_round_is_exactly_lossless(compiled_exact, name):
    diff, _ = compiled_exact(cert.METHODS[name], cert.PARAMS[0])
    assert diff < PASS_DIFF


def test_compiled_runs_hash_apart():
    from eagle2.results.store import config_hash
    from tests.test_results_store import config

    cfg = config()
    hashes = {}
    for value in ("false", "auto:false", "true", "auto:true"):
        cfg.engine.compile = value
        hashes[value] = config_hash(cfg)
    assert hashes["false"] == hashes["auto:false"] != hashes["true"] == hashes["auto:true"]


def test_compile_choice():
    cfg = OmegaConf.create({"engine": {"compile": "auto"}, "model": {"device": "cpu"}, "batch_size": 4})
    assert compile_choice.resolve(cfg) == "auto:false"  # batched decoding stays eager
    cfg.engine.compile = True
    assert compile_choice.resolve(cfg) == "true"
    cfg.engine.compile = "sometimes"
    with pytest.raises(ValueError, match="engine.compile"):
        compile_choice.choice(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["plain", "sps", "eagle", "eagle2", "eagle3", "medusa", "pld"])
def test_compiled_smollm2_equals_eager_plain(smollm2, name):
    from eagle2.bench.methods import build_drafter
    from eagle2.bench.runner import resolve_artifact
    from eagle2.heads.family import families
    from eagle2.prompts.chat import encode_conversation
    from eagle2.registry import method_spec
    from tests.test_results_store import config

    target, tokenizer = smollm2
    cfg = config(f"method={name}")  # the real composition: method settings interpolate the model's
    method, model_cfg = cfg.method, cfg.model
    weights = {key: families()[key].load(resolve_artifact(model_cfg[key]), target)
               for key in method_spec(method).weights}
    compiled = with_path(target, compile=True)
    weights_c = {key: families()[key].load(resolve_artifact(model_cfg[key]), compiled)
                 for key in method_spec(method).weights}
    for part in compile_choice.compiled_heads(weights_c):  # the draft heads on the compiled path too
        part.warm_up()
    for question in ("What is the capital of France?", "Write a haiku about autumn leaves."):
        prompt = encode_conversation(tokenizer, "tokenizer", [question], [], None)
        plain = engine.generate(target, build_drafter(OmegaConf.create({"name": "plain"}), target, GREEDY, None,
                                                      weights={}), prompt, GREEDY, 32, set())
        ours = engine.generate(compiled, build_drafter(method, compiled, GREEDY, None, weights=weights_c),
                               prompt, GREEDY, 32, set())
        eager = engine.generate(target, build_drafter(method, target, GREEDY, None, weights=weights),
                                prompt, GREEDY, 32, set())
        assert ours.output_ids == eager.output_ids == plain.output_ids, (name, question)
