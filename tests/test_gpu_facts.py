"""A GPU row's GPU facts (eagle2.bench.gpu_facts): names, driver and CUDA versions, and the peak memory
over every GPU, on a CPU with two GPUs' answers faked in torch.cuda (and a fake nvidia-smi)."""

from __future__ import annotations

import os

import torch

from eagle2.bench import gpu_facts

GIB = 2**30


def two_gpus(monkeypatch, tmp_path):
    peaks, resets = {0: 1 * GIB, 1: 3 * GIB}, []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"NVIDIA H200 #{i}")
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: peaks[i])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 580.159.04\necho 580.159.04\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gpu_facts.driver_version.cache_clear()
    return resets


def test_a_spread_targets_peak_is_over_every_gpu(monkeypatch, tmp_path):
    resets = two_gpus(monkeypatch, tmp_path)
    gpu_facts.reset_peak_memory("cuda:0")
    assert resets == [0, 1]  # every GPU's count starts with the config, not only cuda:0's
    assert gpu_facts.peak_memory_mb("cuda:0") == 4 * 1024  # 1 GiB on cuda:0 + 3 GiB on cuda:1


def test_gpu_rows_name_their_gpus_driver_and_cuda(monkeypatch, tmp_path):
    two_gpus(monkeypatch, tmp_path)
    facts = gpu_facts.gpu_facts("cuda:0")
    assert facts["names"] == ["NVIDIA H200 #0", "NVIDIA H200 #1"] and facts["driver"] == "580.159.04"
    assert facts["cuda"] == torch.version.cuda and facts["torch"] == torch.__version__
    gpu_facts.driver_version.cache_clear()


def test_a_cpu_row_has_no_gpu_facts():
    assert gpu_facts.gpu_facts("cpu") is None and gpu_facts.peak_memory_mb("cpu") > 0
