"""The published architectures of the GPU model configs, for random-weight stand-ins.

``PUBLISHED[name]`` holds the LlamaConfig facts of each ``conf/model/<name>.yaml`` target as its hub
``config.json`` states them (width, heads, KV heads, layers, vocabulary, RoPE, norm epsilon, context,
special token ids). From them ``llama_config`` builds a config with fewer layers, or a narrower proxy
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

_LLAMA2 = {"vocab_size": 32000, "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 10000.0,
           "hidden_act": "silu", "tie_word_embeddings": False}
_LLAMA3 = {"vocab_size": 128256, "bos_token_id": 128000, "eos_token_id": 128009, "rope_theta": 500000.0,
           "hidden_act": "silu", "tie_word_embeddings": False, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-5}

_LLAMA31 = {**_LLAMA3, "max_position_embeddings": 131072,  # Llama 3.1 / 3.3: 128k context, llama3 RoPE scaling
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}}


def _shape(hidden, intermediate, heads, kv_heads, layers, **rest) -> dict:
    return {"hidden_size": hidden, "intermediate_size": intermediate, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "num_hidden_layers": layers, **rest}


PUBLISHED: dict[str, dict] = {  # model-config name -> its target's config.json facts
    "vicuna7b": _shape(4096, 11008, 32, 32, 32, **_LLAMA2, max_position_embeddings=2048, rms_norm_eps=1e-6),
    "vicuna13b": _shape(5120, 13824, 40, 40, 40, **_LLAMA2, max_position_embeddings=2048, rms_norm_eps=1e-6),
    "llama2chat7b": _shape(4096, 11008, 32, 32, 32, **_LLAMA2, max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama2chat13b": _shape(5120, 13824, 40, 40, 40, **_LLAMA2, max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama2chat70b": _shape(8192, 28672, 64, 8, 80, **_LLAMA2, max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama3_8b": _shape(4096, 14336, 32, 8, 32, **_LLAMA3),
    "llama3_70b": _shape(8192, 28672, 64, 8, 80, **_LLAMA3),
    "llama31_8b": _shape(4096, 14336, 32, 8, 32, **_LLAMA31),
    "llama33_70b": _shape(8192, 28672, 64, 8, 80, **_LLAMA31),
}


def llama_config(name: str, layers: int | None = None, width: int | None = None) -> LlamaConfig:
    """The published config of ``name`` with ``layers`` decoder layers (default: all). ``width``
    narrows it into a proxy: same heads, KV heads, vocabulary and RoPE, head dimension width / heads,
    MLP width scaled by the same factor."""
    facts = dict(PUBLISHED[name])
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
