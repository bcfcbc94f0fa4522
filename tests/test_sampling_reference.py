"""``probabilities()`` against an independent float64 reference (tests/sampling_reference.py) and
transformers' own logits processors, at the boundaries: mass exactly at top_p, ties at top-k and at
the top-p cut, temperatures near 0."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from eagle2.core.sampling import SamplingParams, probabilities
from tests.sampling_reference import reference_for

DYADIC = torch.tensor([[0.0, math.log(0.5), math.log(0.25), math.log(0.25)]])  # softmax: exactly .5 .25 .125 .125


def _same(logits, params, atol=1e-6):
    ours, ref = probabilities(logits, params).double(), reference_for(logits, params)
    assert torch.allclose(ours, ref, atol=atol), f"{params}: ours {ours.tolist()} reference {ref.tolist()}"
    return ref


def test_dyadic_logits_give_exact_probabilities():  # the boundary cases below rely on it
    assert probabilities(DYADIC, SamplingParams(1.0)).tolist() == [[0.5, 0.25, 0.125, 0.125]]


def test_mass_exactly_at_top_p_ends_the_kept_set():
    ref = _same(DYADIC, SamplingParams(1.0, top_p=0.75))  # .5 + .25 reach .75 exactly: the .125s go
    assert ref[0].tolist() == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0], abs=1e-7)
    assert _same(DYADIC, SamplingParams(1.0, top_p=0.5))[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_tokens_tied_at_the_top_p_cut_stay_together():
    ref = _same(DYADIC, SamplingParams(1.0, top_p=0.8))  # needs one .125 token: its tie stays too
    assert ref[0].tolist() == pytest.approx([0.5, 0.25, 0.125, 0.125], abs=1e-7)
    uniform = torch.zeros(1, 8)
    assert _same(uniform, SamplingParams(1.0, top_p=0.3)).tolist() == [[0.125] * 8]


def test_ties_at_the_kth_logit_are_all_kept():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.5]])
    ref = _same(logits, SamplingParams(1.0, top_k=2))
    assert (ref > 0).tolist() == [[True, True, True, True, False, False]]
    assert (_same(logits, SamplingParams(0.7, top_k=1)) > 0).sum() == 1


@pytest.mark.parametrize("temperature", [1e-2, 1e-3, 1e-5, 0.0])
def test_temperature_near_zero_is_the_argmax(temperature):
    logits = torch.tensor([[0.3, 1.2, 1.1, -4.0]])
    ours = probabilities(logits, SamplingParams(temperature)).double()
    ref = reference_for(logits, SamplingParams(temperature))
    assert torch.allclose(ours, ref, atol=1e-5)  # float32 logits / T: relative error ~1e-7 of the quotient
    if temperature <= 1e-2:
        assert ref[0, 1] > 0.9999 and ours[0, 1] > 0.9999
    tied = torch.tensor([[2.0, 5.0, 5.0, 1.0]])  # the T -> 0 limit shares the mass between exact ties
    assert torch.allclose(probabilities(tied, SamplingParams(temperature)).double(),
                          reference_for(tied, SamplingParams(temperature)), atol=1e-6)


SETTINGS = [SamplingParams(1.0), SamplingParams(0.7, top_p=0.9, top_k=6), SamplingParams(1.3, top_p=0.5),
            SamplingParams(0.2, top_k=3), SamplingParams(2.0, top_p=0.95, top_k=20), SamplingParams(1.0, top_p=0.01)]


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_random_logits_match_the_reference_and_transformers(params):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=gen) * 3
    _same(logits, params)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(params.temperature)]
                                  + ([TopKLogitsWarper(params.top_k)] if params.top_k else [])
                                  + ([TopPLogitsWarper(params.top_p)] if params.top_p < 1 else []))
    theirs = torch.softmax(warpers(None, logits.clone()), dim=-1).double()
    assert torch.allclose(probabilities(logits, params).double(), theirs, atol=1e-6)
