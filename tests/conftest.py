"""Shared fixtures: tiny random Llama models (fast, exact fp32) and the real embedded SmolLM2."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
torch.set_num_threads(int(os.environ.get("EAGLE2_TEST_THREADS", min(2, torch.get_num_threads()))))


def pytest_configure(config):
    # registered here, not in pyproject.toml: editing that file makes `make` reinstall the environment
    config.addinivalue_line("markers", "gpu: identity and certification cases in fp16/bf16 on a CUDA device "
                            "(tests/devices.py); run with -m gpu")


# cost profiles measured by tests (method total_tokens=auto) go here, not to ~/.cache
PROFILE_DIR = tempfile.mkdtemp(prefix="eagle2-test-profiles-")


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
    from eagle2.head import EagleHead, head_config_from_target

    torch.manual_seed(seed)
    return EagleHead(head_config_from_target(target.config)).attach_embedding(target.get_input_embeddings()).eval()


@pytest.fixture(scope="session")
def smollm2():
    from omegaconf import OmegaConf

    from eagle2.models import load_target

    return load_target(OmegaConf.create({"source": "smollm2_gguf", "dtype": "float32", "device": "cpu"}))
