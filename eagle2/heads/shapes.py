"""Random-weight stand-ins at a GPU model's published shapes.

A GPU model config states its target's hub ``config.json`` facts as ``architecture`` (width, heads, KV heads,
layers, vocabulary, RoPE, norm epsilon, context, special token ids; read by ``eagle2.registry.model_architecture``).
From them ``llama_config`` builds a config with fewer layers, or a narrower proxy
(same heads, KV heads, vocabulary and RoPE; a smaller head dimension) where the real width does not
fit, and ``random_llama`` a model with random weights initialised in one pass on the target device
(no per-module init: a 7B model is ready in seconds on a GPU; ``fill_random`` does the same for any
module). Used by ``experiments.ops.gpu_check.models`` (the GPU check's models at the real shapes, no hub) and the
zoo smoke tests (tests/test_zoo.py).
Nothing here downloads anything.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding


def llama_config(architecture: dict, layers: int | None = None, width: int | None = None) -> LlamaConfig:
    """The config of a model config's ``architecture`` with ``layers`` decoder layers (default: all). ``width``
    narrows it into a proxy: same heads, KV heads, vocabulary and RoPE, head dimension width / heads,
    MLP width scaled by the same factor."""
    facts = dict(architecture)
    if layers is not None:
        facts["num_hidden_layers"] = layers
    if width is not None and width != facts["hidden_size"]:
        if width % facts["num_attention_heads"]:
            raise ValueError(f"proxy width {width} is not a multiple of {facts['num_attention_heads']} heads")
        facts["intermediate_size"] = facts["intermediate_size"] * width // facts["hidden_size"]
        facts["hidden_size"] = width
    config = LlamaConfig(**facts)
    config._attn_implementation = "sdpa"
    return config


@torch.no_grad()
def random_llama(config: LlamaConfig, device="cpu", dtype=torch.float32, seed: int = 0, std: float = 0.02):
    """A ``LlamaForCausalLM`` with random weights of standard deviation ``std`` (uniform: the fastest draw
    on a CPU; norms 1), built on ``device`` in one pass."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(dtype)
    model = model.to_empty(device=device)  # allocated once, in the target dtype
    fill_random(model, seed, std)
    model.model.rotary_emb = LlamaRotaryEmbedding(config).to(device)  # its buffers were left empty (fp32)
    return model.eval()


@torch.no_grad()
def fill_random(module: torch.nn.Module, seed: int = 0, std: float = 0.02) -> torch.nn.Module:
    """Every parameter of ``module`` drawn uniform with standard deviation ``std`` on its own device,
    norm weights (names ending in ``norm.weight``) set to 1; buffers untouched."""
    device = next(module.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in module.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.uniform_(-std * 3**0.5, std * 3**0.5, generator=gen)
    return module
