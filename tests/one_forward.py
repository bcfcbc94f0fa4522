"""What the tests of the one-forward drafters (P-EAGLE, DFlash, PARD) share: their tiny target, a context's tapped
features, the check that a round costs one draft forward, and a short training run of an objective's loss."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

import eagle2.core.engine as engine
from eagle2.bench.methods import build_drafter
from eagle2.core.features import LayerTap
from eagle2.core.sampling import SamplingParams
from tests.conftest import tiny_llama


def models_fixture(make):
    """A module-scoped fixture ``models``: (the tiny target of these tests (32 tokens, 2 layers, peaked
    distributions), ``make(target)``: its drafter's module)."""

    @pytest.fixture(scope="module")
    def models():
        target = tiny_llama(vocab=32, layers=2, seed=0, scale=4.0)
        return target, make(target)
    return models


@torch.no_grad()
def taps_of(target, layers, ids: list[int]) -> torch.Tensor:
    """(len(ids), k*H) the inputs of the target's ``layers`` over ``ids``, concatenated as a head reads them."""
    with LayerTap(target, layers) as tap:
        target(torch.tensor([ids]))
        return tap.read()[0]


def one_per_round(monkeypatch, module: torch.nn.Module, target, method: dict, weights: dict):
    """Decode 20 tokens after [3, 5, 7] with ``method`` and assert that every round ran ``module`` once (at least 5
    rounds) and drafted every depth 1..K, each node with a confidence in (0, 1]. Returns the drafter."""
    calls, original = [], type(module).forward
    monkeypatch.setattr(type(module), "forward",
                        lambda self, *a, **k: (calls.append(1) if self is module else None) or original(self, *a, **k))
    drafter = build_drafter(OmegaConf.create(method), target, SamplingParams(), None, weights=weights)
    out = engine.generate(target, drafter, [3, 5, 7], SamplingParams(), 20, set())
    assert len(out.rounds) >= 5 and len(calls) == len(out.rounds)
    assert set(out.nodes["depth"]) == set(range(1, drafter.depth + 1))
    assert all(0 < c <= 1 for c in out.nodes["confidence"])
    return drafter


def train_steps(module: torch.nn.Module, loss_fn, batch: dict, steps: int = 30) -> tuple[dict, dict]:
    """``steps`` Adam steps (lr 3e-3) of ``loss_fn(module, batch, generator=...)`` (step s draws with seed s) over
    ``module``'s trainable parameters; returns (the first step's stats, the last's)."""
    opt = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=3e-3)
    first = None
    for step in range(steps):
        loss, stats = loss_fn(module, batch, generator=torch.Generator().manual_seed(step))
        first = first or stats
        opt.zero_grad()
        loss.backward()
        opt.step()
    return first, stats


@torch.no_grad()
def tapped_batch(target, layers) -> dict:
    """A training batch of two random 16-token rows (answers from positions 4 and 6) with the target's last hidden
    states (``features``) and the inputs of ``layers`` (``layer_features``)."""
    tokens = torch.randint(32, (2, 16), generator=torch.Generator().manual_seed(3))
    with LayerTap(target, layers) as tap:
        hidden = target(tokens, output_hidden_states=True).hidden_states[-1]
        taps = tap.read()
    return {"tokens": tokens, "layer_features": taps, "features": hidden, "valid": torch.ones_like(tokens).bool(),
            "start": torch.tensor([4, 6])}


def refused_without(folder, key: str, load, target) -> None:
    """Drop ``key`` from ``folder``'s model.safetensors and assert that ``load(folder, target)`` names it."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    del state[key]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(KeyError, match=key):
        load(folder, target)
