"""Where the identity and certification tests run: this CPU in fp32 (always), and a CUDA device in fp16
and bf16, those cases marked ``gpu`` (``pytest -m gpu`` selects them; without a CUDA device they are
skipped). ``EAGLE2_GPU_TEST_DEVICE=cpu`` runs the gpu-marked half-precision cases on the CPU instead,
to check them on a machine without a GPU.

Greedy identity in half precision is the identity audit's (``eagle2.bench.identity.classify``): a tree
forward and a one-token forward round differently, so an output may leave plain decoding's at a
near-tie; that is allowed (``numeric``), a token no rounding explains (``algorithmic``) is not.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

GPU_DEVICE = os.environ.get("EAGLE2_GPU_TEST_DEVICE", "cuda")
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def device_params() -> list:
    """pytest params (device, dtype): cpu/fp32, then the gpu-marked half-precision cases."""
    no_device = GPU_DEVICE.startswith("cuda") and not torch.cuda.is_available()
    gpu_marks = [pytest.mark.gpu, pytest.mark.skipif(no_device, reason="no CUDA device")]
    return [pytest.param(("cpu", torch.float32), id="cpu-fp32"),
            *[pytest.param((GPU_DEVICE, dtype), id=f"gpu-{name}", marks=gpu_marks) for name, dtype in HALF.items()]]


def on(device_dtype, target, *others):
    """Copies of ``target`` and ``others`` (drafts, heads) on the device and dtype, heads attached to the
    copied target's embedding (fp32 on the CPU: the modules themselves)."""
    device, dtype = device_dtype
    if device == "cpu" and dtype == torch.float32:
        return (target, *others)
    copies = [copy.deepcopy(m).to(device, dtype) for m in (target, *others)]
    for module in copies[1:]:
        if hasattr(module, "attach_embedding"):  # an EAGLE head: the embedding is the target's, not its own
            module.attach_embedding(copies[0].get_input_embeddings())
    return tuple(copies)


def assert_greedy_lossless(target32, dtype: torch.dtype, prompt: list[int], output: list[int], plain: list[int]):
    """fp32: token-identical to plain decoding. Half precision: no algorithmic divergence (identity audit
    against ``target32``, the fp32 target, in float64)."""
    if dtype == torch.float32:
        assert output == plain
        return
    from eagle2.bench.identity import classify, reference_logits
    from eagle2.core.precision import dtype_name

    reference = copy.deepcopy(target32).to("cpu", torch.float64)
    record = classify(reference_logits(reference, prompt, output), output, plain, dtype_name(str(dtype)[6:]))
    assert record["status"] != "algorithmic", record
