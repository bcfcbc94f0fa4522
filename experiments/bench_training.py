"""Training throughput: tokens/s per training step of the EAGLE-2 head and the EAGLE-3 head trainers on
SmolLM2-135M, side by side in one run, with the CPU kind printed:

- ``before``: the trainer and losses of commit ``BEFORE`` (read from git into this process): fp32
  forward and backward, the loss's LM head in ``loss_dtype`` (auto: bf16 here), foreach AdamW;
- ``fp32 now``: today's code with ``autocast=off`` (fused EAGLE-3 soft cross-entropy, fused AdamW);
- ``after``: today's code with ``autocast=auto`` (bf16 autocast where the CPU multiplies bf16 natively).

    python experiments/bench_training.py                      # artifacts/work/bench/corpus, 2 threads
    python experiments/bench_training.py --threads 1 --steps 6
    python experiments/bench_training.py --profile eagle3     # torch.profiler of one step, top ops

The corpus: any corpus folder with the EAGLE-3 taps; a small one is built by
``python train_head.py stage=corpus train.work_dir=artifacts/work/bench train.corpus.limit=64
train.corpus.max_batches=null`` (2 shards of 32 Alpaca answers, ~75 s). Variants are timed in turns
(A B A B ..., after one warm-up step each) on the same batches, so a load that changes during the run
(another job on the cores) hits every variant alike; the figure is the median over steps of
real (unpadded) tokens / step time, the recipe's ``tok_s`` definition.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BEFORE = "b8d34e7"  # the trainer before the throughput work
VARIANTS = {"before": {"autocast": "off"}, "fp32 now": {"autocast": "off"}, "after": {"autocast": "auto"}}


def _module_at(rev: str, path: str, name: str):
    """The module ``path`` as it was at commit ``rev`` (its imports resolve to today's modules)."""
    import subprocess
    import types

    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout
    module = types.ModuleType(name)
    module.__file__ = f"{rev}:{path}"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def _config(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="train_head", overrides=overrides)


def _trainer(kind: str, target, corpus: Path, cfg, out: Path, before: bool = False):
    from functools import partial

    from eagle2.training.data import train_val_sequences
    from eagle2.training.loop import Trainer
    from eagle2.training.train import eagle3_setup, head_setup

    torch.manual_seed(0)
    seqs, _, _ = train_val_sequences(corpus, 0.0)
    module, loss_fn, _ = head_setup(target, cfg) if kind == "head" else eagle3_setup(target, corpus, cfg)
    if before:  # the same loss settings, through the losses and trainer of commit BEFORE
        losses = _module_at(BEFORE, "eagle2/training/losses.py", "losses_before")
        loss_fn = partial(getattr(losses, loss_fn.func.__name__), *loss_fn.args, **loss_fn.keywords)
        trainer_cls = _module_at(BEFORE, "eagle2/training/loop.py", "loop_before").Trainer
        return trainer_cls(module, loss_fn, seqs, [], cfg, out, desc=kind, fingerprint_extra={})
    trainer = Trainer(module, loss_fn, seqs, [], cfg, out, desc=kind, fingerprint_extra={})
    return trainer


def bench(kind: str, target, corpus: Path, base_cfg, steps: int) -> dict[str, float]:
    """Median tokens/s per step of each variant on the same batches, timed in turns."""
    from omegaconf import OmegaConf

    from eagle2.core.engine import device_clock

    trainers = {}
    for name, over in VARIANTS.items():
        cfg = OmegaConf.merge(base_cfg, over)
        trainers[name] = _trainer(kind, target, corpus, cfg, Path(tempfile.mkdtemp(prefix=f"bench-{kind}-")),
                                  before=name == "before")
    plan = trainers["before"].plan[0]
    rates: dict[str, list[float]] = {name: [] for name in trainers}
    for i in range(steps + 1):
        batch = plan[i % len(plan)]
        for name, trainer in trainers.items():
            t0 = device_clock(trainer.device)
            step = batch if name == "before" else [batch]  # (today's steps: one batch per rank)
            _, _, tokens = trainer.train_step(step, with_stats=False)
            if i:  # step 0 warms up
                rates[name].append(tokens / (device_clock(trainer.device) - t0))
    return {name: statistics.median(r) for name, r in rates.items()} | {
        "autocast": trainers["after"].speed_info["autocast"]}


def profile(kind: str, target, corpus: Path, base_cfg, variant: str, rows: int = 18) -> None:
    from omegaconf import OmegaConf
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cfg = OmegaConf.merge(base_cfg, VARIANTS[variant])
    trainer = _trainer(kind, target, corpus, cfg, Path(tempfile.mkdtemp(prefix="bench-prof-")),
                       before=variant == "before")
    batch = trainer.plan[0][0]
    trainer.train_step(batch, with_stats=False)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train_step(batch, with_stats=False)
    print(f"--- profile: {kind}, {variant} ({cfg.autocast}), one step")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="artifacts/work/bench/corpus")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kinds", default="head,eagle3")
    ap.add_argument("--profile", default=None, help="head or eagle3: profile one step of each variant instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from eagle2.bench.models import load_target
    from eagle2.core.cpu import cpu_kind

    cfg = _config(["train=smollm2"])
    target, _ = load_target(cfg.model, kernels="stock")
    target.requires_grad_(False)
    corpus = ROOT / args.corpus
    print(f"CPU kind: {cpu_kind()}, threads {torch.get_num_threads()}, torch {torch.__version__}, corpus {corpus}")
    sections = {"head": cfg.train.head, "eagle3": cfg.train.eagle3}
    if args.profile:
        for variant in VARIANTS:
            profile(args.profile, target, corpus, sections[args.profile], variant)
        return
    print(f"tokens/s per training step (median of {args.steps}; before = commit {BEFORE})")
    print(f"{'trainer':8} {'before':>8} {'fp32 now':>9} {'after':>8} {'after/before':>13}  (after: autocast)")
    for kind in args.kinds.split(","):
        r = bench(kind, target, corpus, sections[kind], args.steps)
        print(f"{kind:8} {r['before']:8.0f} {r['fp32 now']:9.0f} {r['after']:8.0f} {r['after'] / r['before']:13.2f}"
              f"  ({r['autocast']})", flush=True)


if __name__ == "__main__":
    main()
