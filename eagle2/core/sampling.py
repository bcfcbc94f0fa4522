"""Turning logits into the distributions that decoding and acceptance use, and the random draws.

Temperature, top-k and top-p are applied in one place, identically to the target's logits (``p_target``)
and to a drafter's logits (``q_draft``): top-k keeps every token tied with the k-th; top-p keeps the
most likely tokens until their mass reaches top_p, and every token tied with the last of them.
Temperature 0 means greedy: no distribution, just the argmax. Nothing here knows about trees or caches.

Every random draw of decoding goes through a ``Draws`` object: ``accept(numerator, denominator)`` (a
Bernoulli coin) and ``categorical(probs)`` (one token). Production uses ``TorchDraws``, a thin wrapper
around a ``torch.Generator`` (or None) making exactly the calls decoding always made — one
``torch.rand`` per coin, one ``torch.multinomial`` per token — so seeded outputs do not depend on the
indirection. Tests pass their own ``Draws`` to enumerate every outcome of a round exactly. Functions
taking a ``generator`` accept a ``torch.Generator``, None or a ``Draws`` (``as_draws``).

A generator on a GPU would make each coin a host sync (a uniform drawn there, then read). There
``TorchDraws`` draws ``GPU_BATCH`` uniforms (float64) at once and reads them in one transfer, and a
token from a host distribution is drawn by inverting its cumulative sum at one such uniform: the same
distributions (independent uniforms either way), another random stream than the one-by-one calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"invalid sampling settings {self}: need temperature >= 0, 0 < top_p <= 1, top_k >= 0")


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities after temperature, top-k and top-p."""
    logits = logits.float() / max(params.temperature, 1e-6)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p = torch.sort(probs, dim=-1, descending=True).values
        before = sorted_p.cumsum(-1) - sorted_p  # mass above each token in sorted order
        # the least likely token needed to reach top_p; every token as likely stays too (ties go together)
        cutoff = sorted_p.masked_fill(before >= params.top_p, float("inf")).amin(-1, keepdim=True)
        probs = probs.masked_fill(probs < cutoff, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class Draws(Protocol):
    def accept(self, numerator: float, denominator: float = 1.0) -> bool:
        """True with probability min(1, numerator / denominator); False when denominator <= 0."""

    def categorical(self, probs: torch.Tensor) -> int:
        """One index drawn with probability proportional to the 1D non-negative ``probs``."""


GPU_BATCH = 64  # uniforms drawn and read at once from a generator on a GPU


class TorchDraws:
    """Draws from the torch random stream of ``generator`` (None: the global one). ``batch``: uniforms
    drawn at once (default 1 on the host, the calls it always made; ``GPU_BATCH`` for a GPU generator)."""

    def __init__(self, generator: torch.Generator | None, batch: int | None = None):
        self.generator = generator
        self.device = generator.device if generator is not None else torch.device("cpu")
        self.batch = batch or (1 if self.device.type == "cpu" else GPU_BATCH)
        self.uniforms: list[float] = []

    def uniform(self) -> float:
        if self.batch == 1:  # drawn on the generator's device (a CUDA generator cannot make a CPU tensor)
            return float(torch.rand((), generator=self.generator, device=self.device))
        if not self.uniforms:  # one transfer for the next ``batch`` coins
            drawn = torch.rand(self.batch, generator=self.generator, device=self.device, dtype=torch.float64)
            self.uniforms = drawn.tolist()[::-1]
        return self.uniforms.pop()

    def accept(self, numerator: float, denominator: float = 1.0) -> bool:
        # the uniform is drawn even when denominator <= 0 (one draw per coin, whatever the outcome);
        # with the default denominator 1.0, u * 1.0 == u exactly: the test is u < numerator
        u = self.uniform()
        return denominator > 0 and u * denominator < numerator

    def categorical(self, probs: torch.Tensor) -> int:
        if self.batch == 1 and probs.device == self.device:
            return int(torch.multinomial(probs, 1, generator=self.generator))
        return inverse_cdf(probs, self.uniform())


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The index i with cdf[i-1] <= u * total < cdf[i] (never a zero-probability index), ``probs`` 1D."""
    cdf = probs.detach().to("cpu", torch.float64).cumsum(0)
    index = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True))
    if index >= len(cdf):  # u * total rounded up to the total: the last token with mass
        index = int(torch.nonzero(probs.detach().cpu() > 0).max())
    return index


def as_draws(generator: torch.Generator | Draws | None) -> Draws:
    """A ``Draws`` from a torch.Generator, None (torch's global stream) or a ``Draws`` (returned as is)."""
    if generator is None or isinstance(generator, torch.Generator):
        return TorchDraws(generator)
    return generator


def sample(probs: torch.Tensor, generator: torch.Generator | Draws | None) -> int:
    """One token from a 1D distribution."""
    return as_draws(generator).categorical(probs)


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | Draws | None) -> int:
    """The next token from 1D logits: argmax when greedy, else a sample."""
    if params.greedy:
        return int(logits.argmax())
    return sample(probabilities(logits, params), generator)
