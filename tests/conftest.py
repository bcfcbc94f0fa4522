"""Shared fixtures: tiny random Llama models (fast, exact fp32) and the real embedded SmolLM2."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import weakref

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import eagle2.bench  # noqa: F401  (registers what composing conf/ needs: the resolvers, the families' model keys)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# the cores are shared among pytest-xdist workers (`make test` runs two): one thread each on 2 cores
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
torch.set_num_threads(int(os.environ.get("EAGLE2_TEST_THREADS", max(1, min(2, torch.get_num_threads()) // _WORKERS))))


def pytest_configure(config):
    # registered here, not in pyproject.toml: editing that file makes `make` reinstall the environment
    config.addinivalue_line("markers", "gpu: identity and certification cases in fp16/bf16 on a CUDA device "
                            "(tests/devices.py); run with -m gpu")
    config.addinivalue_line("markers", "entrypoint: slow tests that start run.py in a subprocess; "
                            "`make test-entrypoints` (CI runs it after make test)")
    config.addinivalue_line("markers", "heavy: slow tests CI runs after make test (`make test-heavy`), out of "
                            "make test for its five minutes: the entrypoints, tests that start processes (run.py "
                            "beyond one start, torchrun ranks), the GPU check's tooling, and checks whose property a "
                            "faster default test also covers (each one's comment says which)")
    config.addinivalue_line("markers", "xdist_group(name): tests that share a costly set-up; `--dist loadgroup` "
                            "(make test-slow) runs each group on one worker (pytest-xdist's own marker)")


@pytest.hookimpl(tryfirst=True)  # before -m deselects: a heavy or entrypoint test is a slow one
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("heavy") or item.get_closest_marker("entrypoint"):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.heavy)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a slow test and its fixtures' teardown, the memory it freed goes back to the system: glibc keeps
    freed heap for reuse, and a pytest-xdist worker that compiled SmolLM2 seven times held 3.5 GB of it
    (returned by ``malloc_trim``) when the next test wrote and loaded a 5 GB Llama-3-8B-wide zoo target."""
    result = yield
    if item.get_closest_marker("slow"):
        return_freed_memory()
    return result


def return_freed_memory() -> None:
    """Collect garbage and hand the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere only
    the collection)."""
    import ctypes
    import gc

    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


# cost profiles measured by tests (method total_tokens=auto) go here, not to ~/.cache
PROFILE_DIR = tempfile.mkdtemp(prefix="eagle2-test-profiles-")
atexit.register(shutil.rmtree, PROFILE_DIR, ignore_errors=True)  # one per pytest process: not left behind


def tiny_llama(vocab: int = 64, layers: int = 2, seed: int = 0, hidden: int = 32, scale: float = 1.0):
    """A random Llama; ``scale`` multiplies the LM head (larger = peakier distributions)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def tiny_head(target, seed: int = 0):
    from eagle2.heads.eagle_head import EagleHead, head_config_from_target

    torch.manual_seed(seed)
    return EagleHead(head_config_from_target(target.config)).attach_embedding(target.get_input_embeddings()).eval()


def per_target(make):
    """``make(target)`` made once per target object and reused (tests that build thousands of drafters share it);
    the made ones are the function's ``made`` (a test may put its own there)."""
    made: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def shared(target):
        if target not in made:
            made[target] = make(target)
        return made[target]
    shared.made = made
    return shared


def tiny_fused_layers(target) -> tuple[int, ...]:
    """The layers a tiny EAGLE-3-style head fuses: EAGLE-3's (2, L//2, L-3) from 4 layers, else (0, L//2, L-1)."""
    from eagle2.core.features import eagle3_layers

    layers = target.config.num_hidden_layers
    return eagle3_layers(layers) if layers >= 4 else (0, layers // 2, layers - 1)


def tiny_eagle3_head(target, seed: int = 0, draft_vocab_size: int | None = None, eagle31: bool = False):
    """A random EAGLE-3 head for ``target`` on its device and dtype. A target shallower than 4 layers
    fuses layers (0, L//2, L-1); a reduced draft vocabulary takes a random subset of the tokens; ``eagle31``:
    an EAGLE-3.1 head, its norms' weights random (so that they matter)."""
    from eagle2.heads.eagle3_head import Eagle3Head, eagle3_config_from_target

    fused = tiny_fused_layers(target)
    vocab = target.config.vocab_size
    torch.manual_seed(seed)
    head = Eagle3Head(eagle3_config_from_target(target.config, draft_vocab_size or vocab, eagle31=eagle31), fused)
    for norm in head.tap_norms or ():
        torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    if draft_vocab_size and draft_vocab_size < vocab:
        head.set_draft_vocabulary(torch.randperm(vocab)[:draft_vocab_size])
    head.attach_embedding(target.get_input_embeddings())
    return head.to(target.device, target.dtype).eval()


shared_eagle3_head = per_target(lambda target: tiny_eagle3_head(target, seed=5))


def tiny_peagle_head(target, seed: int = 0, para_depths: int = 4):
    """A random P-EAGLE head for ``target`` (fused layers as ``tiny_eagle3_head``'s, the full vocabulary as its
    draft vocabulary, a random ``mask_hidden``), on its device and dtype."""
    from eagle2.heads.peagle_head import PEagleHead, peagle_config_from_target

    fused = tiny_fused_layers(target)
    torch.manual_seed(seed)
    head = PEagleHead(peagle_config_from_target(target.config, target.config.vocab_size, para_depths), fused)
    torch.nn.init.normal_(head.mask_hidden)
    head.attach_embedding(target.get_input_embeddings())
    return head.to(target.device, target.dtype).eval()


shared_peagle_head = per_target(lambda target: tiny_peagle_head(target, seed=6))


def tiny_dflash_head(target, seed: int = 0, block_size: int = 5, layers: int = 2):
    """A random DFlash draft model for ``target`` (``default_taps``, the target's last id as the mask token), on
    its device and dtype."""
    from eagle2.heads.dflash_head import DFlashHead, default_taps, dflash_config_from_target

    torch.manual_seed(seed)
    config = dflash_config_from_target(target.config, layers=layers, block_size=block_size)
    head = DFlashHead(config, default_taps(target.config.num_hidden_layers)).attach_target(target)
    return head.to(target.device, target.dtype).eval()


shared_dflash_head = per_target(lambda target: tiny_dflash_head(target, seed=7))


def tiny_pard_draft(target, seed: int = 0, para_depths: int = 4):
    """A PARD draft for ``target``: an SpS draft of up to 2 layers started from the target's first and last (for a
    2-layer target depth 1 is the target's own next-token distribution: often accepted), sharing its embedding, a
    random mask embedding."""
    from eagle2.heads.draft_model import build_draft_model
    from eagle2.heads.pard_draft import PardDraft

    draft = PardDraft(build_draft_model(target, min(2, target.config.num_hidden_layers)), para_depths)
    torch.manual_seed(seed)
    torch.nn.init.normal_(draft.mask_embedding)
    return draft.to(target.device, target.dtype).eval()


shared_pard_draft = per_target(lambda target: tiny_pard_draft(target, seed=7))


def load_each_target_once(patch: pytest.MonkeyPatch, store: dict, keep: int) -> None:
    """The runner's ``load_target`` (and the identity audit's reference loads, from ``eagle2.bench.models``) made
    to load each target config once and hand that loaded model to every later run of the same config, from
    ``store``; the ``keep`` last loaded are kept (an older one is dropped and collected before the next loads).
    Decoding never changes the target (a run that did would make the later runs differ from plain); a run that
    compiles attaches its compiled path (``model.static_decoder``), so such a model is loaded afresh instead."""
    import gc

    from omegaconf import OmegaConf

    import eagle2.bench.models as models
    import eagle2.bench.runner as runner

    load = models.load_target

    def load_once(model_cfg, *args, **kwargs):
        key = (OmegaConf.to_yaml(model_cfg), args, tuple(sorted(kwargs.items())))
        if key in store and hasattr(store[key][0], "static_decoder"):
            del store[key]
        if key not in store:
            while store and len(store) >= keep:
                del store[next(iter(store))]
            gc.collect()  # the dropped target gone before the next one loads
            store[key] = load(model_cfg, *args, **kwargs)
        return store[key]

    patch.setattr(runner, "load_target", load_once)
    patch.setattr(models, "load_target", load_once)


@pytest.fixture(scope="session")
def session_target_loads() -> dict:
    """The targets loaded by ``shared_target_loads`` (or a wider-scoped fixture's ``load_each_target_once``)."""
    return {}


@pytest.fixture
def shared_target_loads(monkeypatch, session_target_loads):
    """In this test the runner loads each SmolLM2 config (fp32, bf16) once per pytest process and hands it to every
    later run of a test that uses this fixture (``load_each_target_once``): what a run records does not depend on
    whether its target was loaded for it; the loading itself has its own tests (the ``smollm2`` fixture, run.py's
    subprocess tests, test_large_targets, test_placement)."""
    load_each_target_once(monkeypatch, session_target_loads, keep=2)
    return session_target_loads


@pytest.fixture(scope="session")
def smollm2():
    from omegaconf import OmegaConf

    from eagle2.bench.models import load_target

    return load_target(OmegaConf.create({"source": "smollm2_gguf", "dtype": "float32", "device": "cpu"}))


def unloadable_weights(folder):
    """A weights folder that passes every check from the files alone (JSON config, whole safetensors) but that
    no loader accepts (no key it expects): a run with it fails after the target loads, naming the folder."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": 576}))
    save_file({"x": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def steady_timings(monkeypatch):
    """Cost-profile measurements that return steady timings (verify 10 + q ms, draft 2 ms per depth) instead of
    a tiny model's timings on this shared machine, which are load noise (the profile checks refuse them):
    the caching and checking logic is what the tests that use it test; the measuring functions have their own
    (test_batch_budget)."""
    import eagle2.bench.cost_profile as cost_profile

    monkeypatch.setattr(cost_profile, "measure_verify",
                        lambda target, *, max_q, **_: [0.010 + 0.001 * q for q in range(1, max_q + 1)])
    monkeypatch.setattr(cost_profile, "measure_draft",
                        lambda target, head, make_drafter, *, depth, **_: [0.002 * d for d in range(1, depth + 1)])
    monkeypatch.setattr(cost_profile, "measure_catch_up", lambda *_, **__: 0.0001)


@pytest.fixture
def synthetic_cost_profile(monkeypatch):
    """``total_tokens=auto`` budgets from a fixed cost profile (verify 1 + 0.05 q, draft 0.1 per depth)
    instead of timings measured on this (shared, noisy) machine: certification results must not depend
    on the machine's load. The measured path has its own tests (test_cost_budget)."""
    import eagle2.bench.cost_profile as cost_profile
    from eagle2.drafters.budget import CostProfile

    def fixed(target, head, drafting, make_drafter, *, depth, top_k, max_q=64, **_):
        return CostProfile([1.0 + 0.05 * q for q in range(1, max_q + 1)], [0.1 * d for d in range(1, depth + 1)],
                           256, {"synthetic": True})

    monkeypatch.setattr(cost_profile, "get_profile", fixed)


@pytest.fixture(scope="module")
def tiny():
    """(target, SpS draft, EAGLE head): tiny random models with a 16-token vocabulary (greedy identity tests)."""
    target = tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)
    return target, tiny_llama(vocab=16, layers=1, seed=1, scale=10.0), tiny_head(target, seed=2)



@pytest.fixture
def nan_empty(monkeypatch):
    """Every ``Tensor.new_empty`` buffer (the KV caches' growth and rows) starts full of NaN instead of
    whatever memory it got: an entry read before it is written shows up, every time."""
    original = torch.Tensor.new_empty

    def nan_filled(self, *size, **kw):
        out = original(self, *size, **kw)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch.Tensor, "new_empty", nan_filled)


@per_target
def shared_rest_datastore(target):
    """One REST datastore per target object: the target's own greedy continuation (24 tokens) of each of
    the first 16 one-token prompts, so that retrieved drafts are often right, and as many random
    sequences, so that they are often wrong too."""
    from eagle2.heads.rest_datastore import Datastore

    vocab, gen, entries = target.config.vocab_size, torch.Generator().manual_seed(7), []
    with torch.no_grad():
        for first in range(min(vocab, 16)):
            ids = torch.tensor([[first]], device=target.device)
            for _ in range(24):
                ids = torch.cat([ids, target(ids).logits[:, -1:].argmax(-1)], dim=1)
            entries += [ids[0].tolist(), torch.randint(vocab, (24,), generator=gen).tolist()]
    return Datastore.from_entries(entries)


def shared_drafter_weights(target, method=None) -> dict:
    """The drafter data tests share per target that no fixture passes by name (an EAGLE-3, P-EAGLE or DFlash head,
    a PARD draft, a REST datastore): the kinds ``method`` (a method config) needs, or all of them."""
    from omegaconf import OmegaConf

    from eagle2.registry import method_spec

    makers = {"eagle3_head": shared_eagle3_head, "rest_datastore": shared_rest_datastore,
              "peagle_head": shared_peagle_head, "dflash_head": shared_dflash_head, "pard_draft": shared_pard_draft}
    needed = makers if method is None else method_spec(OmegaConf.create(method)).weights
    return {kind: makers[kind](target) for kind in needed if kind in makers}
