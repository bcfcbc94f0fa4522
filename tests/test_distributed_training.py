"""Data-parallel head training with real torch.distributed (gloo, 2 processes under ``torchrun``) on a tiny
random target: 2 ranks reach the weights of 1 process training on the union batches; ranks that skip the
gradient all-reduce do not (the negative control); a run killed mid-way resumes under torchrun to the
uninterrupted weights; another world size is refused with one line. About 30 s on 2 CPU cores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle2.training.corpora.prompts import build_corpus
from eagle2.training.data import train_val_sequences
from eagle2.training.loop import Trainer, WorldSizeMismatch
from eagle2.training.objectives.eagle import head_setup, train_head
from tests.ddp_script import ddp_cfg
from tests.test_training import ByteTokenizer, tiny_target, train_losses

ROOT = Path(__file__).resolve().parents[1]
# 2 ranks vs 1 process on the union batch: fp32 sums in another order, through a few AdamW steps
ATOL = 1e-5


# prompts of very different lengths: batches of 1-4 sequences, so the ranks of a step hold different
# numbers of loss positions (a plain mean of their gradients is then wrong) and some steps leave a rank idle
PROMPTS = [f"q{i} " + "xyz" * (i * i // 2) for i in range(16)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp_corpus")
    build_corpus(tiny_target(), ByteTokenizer(), PROMPTS, out, template="vicuna", system_prompt="S", batch_size=4,
                 max_new_tokens=16, max_prompt_tokens=256, temperature=0.0, samples_per_prompt=1, seed=0)
    return out


def torchrun(*args, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "ddp_script.py"), *map(str, args)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    if check and done.returncode != 0:
        raise AssertionError(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def two_ranks(corpus, tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """(out_dir, final weights) of an uninterrupted 2-process run."""
    tmp = tmp_path_factory.mktemp("ddp_run")
    torchrun(corpus, tmp / "run", tmp / "head.safetensors")
    return tmp / "run", load_file(str(tmp / "head.safetensors"))


def union_batch_reference(corpus: Path, out_dir: Path) -> dict[str, torch.Tensor]:
    """One process, each step's batch the union of the two ranks' batches of that step."""
    cfg = ddp_cfg()
    target = tiny_target()
    torch.manual_seed(cfg.seed)  # as train_head: the head's init drawn after the target's
    target.requires_grad_(False)
    train, val, _ = train_val_sequences(corpus, cfg.val_fraction)
    head, loss_fn, extra = head_setup(target, cfg)
    trainer = Trainer(head, loss_fn, train, val, cfg, out_dir, desc="ref", fingerprint_extra=extra)
    batches = [[step[0] for step in epoch] for epoch in trainer.plan]  # world size 1: one batch a step
    trainer.use_plan([[[sum(b[i:i + 2], [])] for i in range(0, len(b), 2)] for b in batches])
    trainer.run()
    return {k: v for k, v in head.state_dict().items() if "rotary" not in k}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.heavy  # two gloo ranks under torchrun (processes): in CI after make test (make test-heavy)
def test_two_ranks_match_one_process_on_the_union_batch(corpus, two_ranks, tmp_path):
    out, weights = two_ranks
    reference = union_batch_reference(corpus, tmp_path / "ref")
    print("2 ranks vs union batch, max |diff|:", max_difference(weights, reference))
    assert max_difference(weights, reference) < ATOL
    rows = train_losses(out, "world_size")
    assert set(rows.values()) == {2}
    per_step = train_losses(out, "tokens_per_step")
    ref_tokens = train_losses(tmp_path / "ref", "tokens_per_step")
    assert per_step == ref_tokens  # the global tokens of each step: the union batch's


@pytest.mark.heavy  # the negative control of the test above: in CI after make test
def test_ranks_that_skip_the_all_reduce_differ(corpus, two_ranks, tmp_path):
    """Negative control: the same run with each rank keeping its own gradients fails the comparison."""
    torchrun(corpus, tmp_path / "run", tmp_path / "head.safetensors", "--skip-allreduce")
    broken = load_file(str(tmp_path / "head.safetensors"))
    print("skip-all-reduce vs 2 ranks, max |diff|:", max_difference(broken, two_ranks[1]))
    assert max_difference(broken, two_ranks[1]) > 100 * ATOL


@pytest.mark.heavy  # torchrun in subprocesses: in CI after make test
def test_killed_run_resumes_under_torchrun_and_refuses_another_world_size(corpus, two_ranks, tmp_path):
    out = tmp_path / "run"
    killed = torchrun(corpus, out, tmp_path / "head.safetensors", "--crash-at", 3, check=False)
    assert killed.returncode != 0 and not (tmp_path / "head.safetensors").exists()
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["step"] == 2 and state["fingerprint"]["world_size"] == 2 and len(state["rank_rng"]) == 2
    with pytest.raises(WorldSizeMismatch, match="written by 2 process"):
        train_head(tiny_target(), corpus, ddp_cfg(), out)  # one process on a 2-process checkpoint
    torchrun(corpus, out, tmp_path / "head.safetensors")
    assert max_difference(load_file(str(tmp_path / "head.safetensors")), two_ranks[1]) == 0.0
    assert train_losses(out) == train_losses(two_ranks[0])  # every step logged once, as uninterrupted
