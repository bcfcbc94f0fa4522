"""Benchmark: the loss part of one joint training step (``train=sharegpt_family stage=joint``'s five heads) on SmolLM2.

One batch of real conversations (the tracked token shards, or ``--corpus``) is featurized once by the target; then
the five members' losses (forward and backward, under the training's autocast and loss-dtype rules for this CPU,
``with_stats`` off as on most steps) are timed two ways, alternating over ``--reps`` repetitions: ``shared`` (the
joint step: the target's logits computed once for every member, ``joint.joint_loss``) and ``each`` (each member's
loss on the batch with its own logits, as its own stage computes them). Prints seconds per step of both, each
repetition, and the median ratio. The machine may be shared: read the medians.
Run: ``python -m experiments.bench.bench_joint_loss [--token-budget 4096] [--reps 5]``.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from eagle2.core.clock import device_clock
from eagle2.training.data import collate, make_batches, split_shards, token_sequences
from eagle2.training.features import OnlineFeatures
from eagle2.training.objectives.joint import JointHeads, joint_loss, joint_members


def family_heads(target, corpus: str):
    """The family run's members (``conf/train/sharegpt_family.yaml``), fresh, their vocabularies from ``corpus``."""
    from hydra import compose, initialize_config_dir

    from eagle2.bench.resolvers import register
    from eagle2.registry import CONF_DIR

    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        train = compose("train_head", ["train=sharegpt_family"]).train
    heads, losses = {}, {}
    for name, member in joint_members(train).items():
        torch.manual_seed(train[name].seed)
        heads[name], losses[name], _ = member.setup(target, corpus, train[name])
    return JointHeads(heads, primary=train.joint.primary), losses


def timed(fn, amp) -> float:
    t0 = device_clock("cpu")
    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        loss = fn()
    loss.backward()
    return device_clock("cpu") - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", default="artifacts/corpus/smollm2_conversations")
    ap.add_argument("--token-budget", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from experiments.bench.bench_head_step import training_target

    target, amp = training_target()
    module, losses = family_heads(target, args.corpus)
    seqs = token_sequences(split_shards(args.corpus, 0.1, "tokens_*.npz")[0])
    plan = make_batches([len(s.tokens) for s in seqs], args.token_budget, 32, seed=0, epoch=0)
    batch = OnlineFeatures(target, module.tap_layers(), amp)(collate([seqs[i] for i in plan[0]], "cpu"))
    gen = torch.Generator()
    ways = {
        "shared": lambda: joint_loss(module, batch, losses=losses, generator=gen.manual_seed(0), with_stats=False)[0],
        "each": lambda: sum(losses[name](head, module.member_batch(name, batch), generator=gen.manual_seed(0),
                                         with_stats=False)[0] for name, head in module.heads.items()),
    }
    print(f"[bench_joint_loss] {int(batch['valid'].sum())} tokens, heads {list(module.heads)}, autocast {amp}")
    for fn in ways.values():  # warm-up
        timed(fn, amp)
        module.zero_grad(set_to_none=True)
    seconds = {name: [] for name in ways}
    for rep in range(args.reps):
        order = list(ways) if rep % 2 == 0 else list(ways)[::-1]
        for name in order:
            seconds[name].append(timed(ways[name], amp))
            module.zero_grad(set_to_none=True)
        print(f"  rep {rep}: " + "  ".join(f"{n} {seconds[n][-1]:.2f}s" for n in ways))
    for name, values in seconds.items():
        print(f"  {name:>6}: median {statistics.median(values):.2f} s/step")
    ratios = [e / s for s, e in zip(seconds["shared"], seconds["each"])]
    print(f"  median ratio each/shared: {statistics.median(ratios):.2f}x (machine shared with other jobs)")


if __name__ == "__main__":
    main()
