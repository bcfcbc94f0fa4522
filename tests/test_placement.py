"""Placement you can trust (eagle2.bench.placement): a target that does not fit its GPUs is refused in one
line before loading, or placed within explicit per-GPU budgets; nothing goes to host memory or disk
unless ``model.allow_offload``; every row records where the weights are.

The sizes are the real ones (LLaMA-3-70B's config, counted on the meta device); the GPUs' free memory
is what ``torch.cuda.mem_get_info`` would report on an H200 (faked: this machine has no GPU).
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from eagle2.bench import placement
from eagle2.bench.placement import (
    PlacementError,
    check_offload,
    largest_layer_bytes,
    max_memory,
    summary,
    weights_bytes,
)
from eagle2.heads.shapes import llama_config
from eagle2.registry import model_architecture

GIB = 2**30
H200_FREE = 140 * GIB  # an idle 141 GB H200: ~140 GiB free


def model_cfg(**extra):
    return OmegaConf.create({"name": "llama3_70b", "device_map": "auto", "max_memory": None, "gpu_reserve_gib": 6,
                             "allow_offload": False, **extra})


@pytest.fixture
def gpus(monkeypatch):
    def install(n: int, free: int = H200_FREE):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=None: (free, free + 3 * GIB))
    return install


def test_70b_in_fp16_on_one_h200_is_placed_within_an_explicit_budget(gpus):
    """131.5 GiB of weights: accelerate's default 90% of 140 GiB (126 GiB) would offload the last layers;
    the explicit budget (free memory less the 6 GiB reserve: 134 GiB) keeps them all on the GPU."""
    needed = weights_bytes(llama_config(model_architecture("llama3_70b")), torch.float16)
    assert 0.9 * H200_FREE < needed < H200_FREE - 6 * GIB  # 70.6 B parameters x 2 bytes
    gpus(1)
    largest = largest_layer_bytes(llama_config(model_architecture("llama3_70b")), torch.float16)
    plan = max_memory("llama3_70b", needed, placement.gpu_budgets(model_cfg()), allow_offload=False, largest=largest)
    assert plan == {0: H200_FREE - 6 * GIB}  # no "cpu", no "disk": nowhere to offload


def test_a_margin_under_accelerates_reserve_is_refused_in_one_line(gpus):
    """accelerate keeps the largest layer's size free on the first GPU (LLaMA-3-70B: its 128k-row LM head,
    1.96 GiB): a target with less to spare than that would end in transformers' offload_folder error."""
    config = llama_config(model_architecture("llama3_70b"))
    needed, largest = weights_bytes(config, torch.float16), largest_layer_bytes(config, torch.float16)
    assert largest == 128256 * 8192 * 2  # the LM head, the largest layer accelerate finds
    gpus(1, free=needed + 6 * GIB + GIB)  # one GiB to spare after the reserve: under the LM head
    with pytest.raises(PlacementError, match="largest layer") as exc:
        max_memory("llama3_70b", needed, placement.gpu_budgets(model_cfg()), allow_offload=False, largest=largest)
    assert "\n" not in str(exc.value)


def test_70b_in_fp16_on_one_80gb_gpu_is_refused_in_one_line(gpus):
    needed = weights_bytes(llama_config(model_architecture("llama3_70b")), torch.float16)
    gpus(1, free=79 * GIB)
    budgets = placement.gpu_budgets(model_cfg())
    with pytest.raises(PlacementError) as exc:
        max_memory("llama3_70b", needed, budgets, allow_offload=False)
    message = str(exc.value)
    assert "\n" not in message and "do not fit" in message and "model.allow_offload=true" in message
    plan = max_memory("llama3_70b", needed, budgets, allow_offload=True)  # asked for: host memory takes the rest
    assert plan[0] == budgets[0] and "cpu" in plan


def test_70b_over_two_h200s_gets_explicit_budgets_and_no_host_memory(gpus):
    gpus(2)
    needed = weights_bytes(llama_config(model_architecture("llama3_70b")), torch.float16)
    plan = max_memory("llama3_70b", needed, placement.gpu_budgets(model_cfg()), allow_offload=False)
    assert plan == {0: H200_FREE - 6 * GIB, 1: H200_FREE - 6 * GIB}  # no "cpu", no "disk": nowhere to offload


def test_explicit_max_memory_is_used_as_given(gpus):
    gpus(2)
    cfg = model_cfg(max_memory={0: "60GiB", 1: "70GiB"})
    assert placement.gpu_budgets(cfg) == {0: 60 * GIB, 1: 70 * GIB}
    with pytest.raises(PlacementError, match="130.0 GiB"):
        max_memory("llama3_70b", weights_bytes(llama_config(model_architecture("llama3_70b")), torch.float16),
                   placement.gpu_budgets(cfg), allow_offload=False)


def test_modules_placed_off_the_gpus_are_refused_unless_allowed():
    spread = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1, "lm_head": 1}
    check_offload("t", spread, "cuda", allow_offload=False)  # all on GPUs: fine
    offloaded = {**spread, "model.layers.1": "cpu", "lm_head": "disk"}
    with pytest.raises(PlacementError, match="2 module\\(s\\) were placed off the GPUs") as exc:
        check_offload("t", offloaded, "cuda", allow_offload=False)
    assert "\n" not in str(exc.value) and "lm_head -> disk" in str(exc.value)
    check_offload("t", offloaded, "cuda", allow_offload=True)
    check_offload("t", {"": "cpu"}, "cpu", allow_offload=False)  # a CPU run on the CPU is no offload
    with pytest.raises(PlacementError):
        check_offload("t", {"model": "cpu", "lm_head": "disk"}, "cpu", allow_offload=False)


def test_the_placement_summary(tmp_path):
    from tests.conftest import tiny_llama

    model = tiny_llama()
    assert summary(model) == "cpu"
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
                           "lm_head": 1}
    assert summary(model) == "cuda:0 x2, cuda:1 x3"
    model.hf_device_map = {"": 0}
    assert summary(model) == "cuda:0"


def test_a_loaded_spread_target_records_its_placement(tmp_path):
    """device_map: auto on this CPU (accelerate puts every module on the CPU): loads, passes the offload
    check (the run's device is the CPU) and sums up as cpu."""
    from transformers import LlamaConfig

    from eagle2.bench.models import load_target
    from tests.test_large_targets import model_cfg as tiny_cfg
    from tests.zoo_fixtures import write_target

    folder = write_target(tmp_path / "t", LlamaConfig(vocab_size=32000, hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=2, num_attention_heads=4))
    model, _ = load_target(tiny_cfg(folder, device_map="auto"))
    assert summary(model) == "cpu"


def test_every_row_has_a_placement_field():
    from eagle2.results.row_schema import ROW_FIELDS

    assert ROW_FIELDS["placement"] == (str,)
