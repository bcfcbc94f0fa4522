"""Random-weight models for the GPU check: targets at the real shapes of the GPU model configs
(``eagle2.heads.shapes``, from ``conf/model/*.yaml``'s targets) whose greedy decoding follows a planted rule,
and draft heads in the authors' layouts. No download, no hub: a 7B model is built on a GPU in seconds.

A purely random target is useless for a speculative check: its greedy tokens are arbitrary, a random
head never guesses them, nothing is accepted and acceptance is never exercised. So the target is
*peaked*: a random permutation ``successor`` of the vocabulary, and for a random ``share`` of the
tokens t (the planted ones) the LM-head row of successor[t] is t's own embedding direction, with a
logit ``margin`` standard deviations above the random rows. The embedding is rescaled to unit RMS and
the layers' output projections (o_proj, down_proj) scaled so that all layers together add about
``residual`` RMS of context to the stream: the last hidden state is mostly the current token's vector,
and after a planted token the target emits its successor; after an unplanted one, whichever random row
the context tips it to. Every weight is still a random draw at the real shapes, every layer computes.

``planted_head``: an EAGLE-1/2 head (``eagle2.heads.eagle_head``, the authors' layout: fc over
[embedding, feature], one decoder layer without input norm) whose fc passes the embedding of the
token it is fed through unchanged (identity block) and the rest at random, scaled small: it predicts the
feature of that token, hence the successor rule; it drafts chains that are accepted after planted tokens
and rejected (or partly) after unplanted ones. ``random_eagle3_head``: an EAGLE-3 head in the official
layout (fused features of three layers, draft vocabulary with d2t/t2d), random, for draft costs.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from eagle2.heads.shapes import fill_random, llama_config, random_llama
from eagle2.registry import gpu_models, model_architecture

STD = 0.02  # random_llama's weight standard deviation
ROOT = Path(__file__).resolve().parents[3]


def target_config(name: str, layers: int | None = None, head_dim: int | None = None) -> LlamaConfig:
    """The published shape of ``name`` (a conf/model config), with ``layers`` decoder layers and a proxy
    head dimension ``head_dim`` when given (same heads, KV heads, vocabulary, RoPE)."""
    architecture = model_architecture(name)
    if not architecture:
        raise ValueError(f"conf/model/{name}.yaml states no architecture; GPU models: {gpu_models()}")
    width = head_dim * architecture["num_attention_heads"] if head_dim else None
    return llama_config(architecture, layers=layers, width=width)


@torch.no_grad()
def peaked_target(config: LlamaConfig, device="cpu", seed: int = 0, share: float = 0.7, margin: float = 10.0,
                  residual: float = 0.5):
    """A float32 target at ``config``'s shape following the planted successor rule (module docstring).
    Its ``successor`` (V,) and ``planted`` (V,) bool are attributes, on the CPU."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    model = random_llama(config, device=device, dtype=torch.float32, seed=seed)
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    embed = model.model.embed_tokens.weight  # (V, h)
    embed.mul_(1 / STD)  # unit RMS: the stream starts as the token's vector
    scale = output_scale(h, 2 * layers, residual)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.mul_(scale)
        layer.mlp.down_proj.weight.mul_(scale)
    gen = torch.Generator().manual_seed(seed + 1)  # on the CPU: the same rule on every device
    successor = torch.randperm(vocab, generator=gen)
    chosen = torch.randperm(vocab, generator=gen)[: max(1, round(share * vocab))]
    rows = embed[chosen.to(embed.device)]  # (n, h), unit RMS
    model.lm_head.weight[successor[chosen].to(embed.device)] = rows * (margin * STD / h**0.5)
    model.successor = successor
    model.planted = torch.zeros(vocab, dtype=torch.bool)
    model.planted[chosen] = True
    return model


def output_scale(width: int, sublayers: int, residual: float) -> float:
    """Factor for the output projections of ``sublayers`` random sublayers (weights of std STD on unit-RMS
    inputs add ~STD**2 * width RMS each) so that together they add ~``residual`` RMS."""
    return residual / (sublayers**0.5 * STD**2 * width)


def half_copy(model, dtype: torch.dtype):
    """A copy of ``model`` in ``dtype`` (the run's target; ``model`` stays the float32 reference), cast as a
    checkpoint loads: the rotary ``inv_freq`` tables stay float32 (``cast_like_target``; in fp16 the angles
    stray ~0.1 rad by position ~190, which would inflate the measured tolerance)."""
    from types import SimpleNamespace

    from eagle2.heads.checkpoint import cast_like_target

    twin = cast_like_target(copy.deepcopy(model), SimpleNamespace(device=model.device, dtype=dtype))
    for attr in ("successor", "planted"):
        setattr(twin, attr, getattr(model, attr, None))
    return twin


@torch.no_grad()
def planted_head(target, seed: int = 1, residual: float = 0.3):
    """An EAGLE-1/2 head for ``target`` (its device and dtype) that knows the successor rule (module
    docstring), attached to the target's embedding."""
    from eagle2.heads.eagle_head import EagleHead, head_config_from_target

    config = head_config_from_target(target.config)
    h = config.hidden_size
    with torch.device("meta"):
        head = EagleHead(config, bias=True)
    head = fill_random(head.to_empty(device=target.device), seed=seed)
    head.fc.weight[:, :h] = torch.eye(h, device=target.device)  # the fed token's embedding passes through
    head.fc.weight[:, h:].mul_(residual / (STD * h**0.5 * 2**0.5))  # the feature: half the context noise
    head.fc.bias.zero_()
    scale = output_scale(h, 2, residual / 2**0.5)
    for layer in head.layers:
        layer.self_attn.o_proj.weight.mul_(scale)
        layer.mlp.down_proj.weight.mul_(scale)
    head.rotary_emb = LlamaRotaryEmbedding(config).to(target.device)
    head.attach_embedding(target.get_input_embeddings())
    return head.to(target.dtype).eval()


@torch.no_grad()
def random_eagle3_head(target, seed: int = 2, draft_vocab: int = 32000):
    """An EAGLE-3 head in the official layout for ``target``: fused layers (2, L//2, L-3) (0, L//2, L-1
    below 4 layers), a random draft vocabulary of ``draft_vocab`` tokens (the official LLaMA-3.1-8B head
    drafts over 32000), random weights."""
    from eagle2.core.features import eagle3_layers
    from eagle2.heads.eagle3_head import Eagle3Head, eagle3_config_from_target

    layers, vocab = target.config.num_hidden_layers, target.config.vocab_size
    fused = eagle3_layers(layers) if layers >= 4 else (0, layers // 2, layers - 1)
    draft_vocab = min(draft_vocab, vocab)
    with torch.device("meta"):
        head = Eagle3Head(eagle3_config_from_target(target.config, draft_vocab), fused)
    head = fill_random(head.to_empty(device=target.device), seed=seed)
    head.d2t.zero_()
    head.t2d.zero_()
    head.rotary_emb = LlamaRotaryEmbedding(head.config).to(target.device)
    gen = torch.Generator().manual_seed(seed)
    head.set_draft_vocabulary(torch.randperm(vocab, generator=gen)[:draft_vocab])
    head.attach_embedding(target.get_input_embeddings())
    return head.to(target.dtype).eval()


def planted_prompt(target, length: int, seed: int) -> list[int]:
    """``length`` random token ids (any token: the rule and the random rows decide what follows)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(target.config.vocab_size, (length,), generator=gen).tolist()


def rule_share(target, tokens: list[int]) -> float:
    """Share of consecutive pairs in ``tokens`` that follow the planted successor rule."""
    pairs = list(zip(tokens, tokens[1:]))
    return sum(int(target.successor[a]) == b for a, b in pairs) / max(1, len(pairs))


def config_dtype(name: str) -> torch.dtype:
    """The dtype ``conf/model/NAME.yaml`` runs in (its ``dtype``, else ``_base.yaml``'s; read with yaml alone)."""
    import yaml

    from eagle2.core.precision import resolve_dtype

    for file in (f"{name}.yaml", "_base.yaml"):
        dtype = (yaml.safe_load((ROOT / "conf" / "model" / file).read_text()) or {}).get("dtype")
        if dtype:
            return resolve_dtype(dtype)
    raise ValueError(f"conf/model/{name}.yaml names no dtype")


def eagle2_budget(name: str, scale) -> dict:
    """The model config's EAGLE-2 budget (conf/model/NAME.yaml ``eagle2``; read with yaml alone)."""
    if scale.budget:
        return dict(scale.budget)
    import yaml

    return dict(yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())["eagle2"])


def drafter(head, target, budget: dict):
    from eagle2.drafters.eagle2_dynamic import Eagle2Drafter

    return Eagle2Drafter(head, target.lm_head, target.device, depth=int(budget["depth"]),
                         top_k=int(budget["top_k"]), total_tokens=int(budget["total_tokens"]))
