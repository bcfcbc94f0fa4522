"""The fast kernels chosen at load (eagle2.core.kernels) and the dtype that ``auto`` resolves to."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eagle2.core import cpu, precision
from eagle2.core.kernels import PackedLinear, accelerate, kernels_in_use, packing_available, wants_packing
from tests.conftest import tiny_llama

needs_packing = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN linear packing")


@needs_packing
@torch.no_grad()
def test_packed_linear_computes_the_stock_linear():
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    packed = PackedLinear(linear)
    for rows in (1, 9, 17):
        x = torch.randn(1, rows, 64, dtype=torch.bfloat16)
        assert torch.allclose(packed(x).float(), linear(x).float(), rtol=2e-2, atol=2e-2)
    assert packed.weight is linear.weight  # readers of .weight see the original tensor


@needs_packing
def test_packed_linear_under_autograd_is_the_stock_linear():
    """With gradients on, the packed op would compute no gradient for ``weight`` (and ran ~90x slower in a
    SmolLM2 forward): the module then applies the original weight, so gradients match the stock linear's."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    packed = PackedLinear(linear)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    packed(x).float().square().sum().backward()
    grad, linear.weight.grad = linear.weight.grad.clone(), None
    linear(x).float().square().sum().backward()
    assert torch.equal(grad, linear.weight.grad)


@needs_packing
@torch.no_grad()
def test_packed_target_decodes_like_the_stock_one():
    from eagle2.core.engine import generate
    from eagle2.core.sampling import SamplingParams
    from eagle2.drafters.plain import PlainDrafter

    stock, fast = tiny_llama().to(torch.bfloat16), tiny_llama().to(torch.bfloat16)
    accelerate(fast, "packed", short_attention=False)  # (the attention: tests/test_short_attention.py)
    assert kernels_in_use(fast) == "packed" and kernels_in_use(stock) == "stock"
    assert not any(type(m) is nn.Linear for m in fast.modules())
    prompt = [3, 9, 4, 7, 2]
    outs = [generate(m, PlainDrafter(), prompt, SamplingParams(), 12, set()).output_ids for m in (stock, fast)]
    assert outs[0] == outs[1]


def test_auto_packs_only_bf16_on_a_bf16_native_cpu(monkeypatch):
    model = tiny_llama().to(torch.bfloat16)
    assert not wants_packing(tiny_llama(), "auto")  # fp32: MKL is the fast path already
    assert not wants_packing(model, "stock")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # as on an AVX2-only CPU
    assert cpu.cpu_kind() == "avx2" and not wants_packing(model, "auto")
    with pytest.raises(ValueError, match="unknown kernels"):
        wants_packing(model, "fastest")


def test_auto_dtype_is_the_cpus_faster_precision(monkeypatch):
    assert precision.concrete_dtype("bf16") == "bfloat16" and precision.concrete_dtype("fp32", "cpu") == "float32"
    assert precision.concrete_dtype("auto", "cuda") == "bfloat16"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert precision.concrete_dtype("auto", "cpu") == "float32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "")
    monkeypatch.setattr(cpu, "cpu_has_native_bf16", lambda: True)
    assert precision.concrete_dtype("auto", "cpu") == "bfloat16"


def test_config_hash_reads_auto_as_what_it_resolves_to(monkeypatch):
    """A run with model.dtype=auto hashes (and so stores and resumes) as the same run with the dtype
    auto stands for on this machine; every explicit dtype hashes as before."""
    from omegaconf import OmegaConf

    from eagle2.results.store import config_hash
    from tests.test_harness import compose_cfg

    explicit = {d: config_hash(compose_cfg(f"model.dtype={d}")) for d in ("bfloat16", "float32")}
    for native, dtype in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(cpu, "cpu_has_native_bf16", lambda native=native: native)
        cfg = compose_cfg("model.dtype=auto")
        assert config_hash(cfg) == explicit[dtype]
        OmegaConf.update(cfg, "model.dtype", precision.concrete_dtype("auto", "cpu"))
        assert config_hash(cfg) == explicit[dtype]
