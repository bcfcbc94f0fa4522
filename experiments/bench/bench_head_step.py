"""Benchmark: training steps of the draft heads on SmolLM2, two comparisons side by side.

``--compare joint`` (the default): the EAGLE and the EAGLE-3 head both trained on the same batches, end to
end (the target's teacher-forced forward included), the old way (each head its own forward, fp32 weights under
the training autocast) against the joint step (``eagle2/training/objectives/joint.py``: one forward on the bf16 copy of
the target's weights where native, both heads' steps after it); prints tokens/s of both heads per way and the
median ratio.

``--compare vocab``: one EAGLE-head step with the soft cross-entropy over the full vocabulary against the
same step over the drafting vocabulary (``train.head.cls_vocab_size``).

Batches are real conversations (the tracked self-instruct token shards, or ``--corpus``), featurized once by
the target (online features; that forward is timed on its own, since it costs the same for either loss).
Each variant runs ``--steps`` optimizer steps per repetition, in alternating order over ``--reps``
repetitions, under the training's own autocast and loss-dtype rules for this CPU; prints tokens/s per step
for each and the median ratio. With ``--quality-steps N`` it also trains a fresh head N steps with each loss
and prints the held-out top-1 (full-vocabulary agreement, fp32) of both at equal steps.
Run: ``python -m experiments.bench.bench_head_step [--compare vocab]``.
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial

import torch

from eagle2.core.clock import device_clock
from eagle2.core.cpu import cpu_kind
from eagle2.training.data import collate, make_batches, split_shards, token_sequences
from eagle2.training.features import OnlineFeatures
from eagle2.training.objectives.eagle import head_loss, new_head
from eagle2.training.support.losses import LossProjection, evaluate_loss, loss_dtype
from eagle2.training.support.precision import autocast_dtype


def _batches(corpus: str, token_budget: int, count: int, val_fraction: float = 0.1):
    train_paths, val_paths = split_shards(corpus, val_fraction, "tokens_*.npz")
    seqs = token_sequences(train_paths)
    plan = make_batches([len(s.tokens) for s in seqs], token_budget, 32, seed=0, epoch=0)
    return [[seqs[i] for i in b] for b in plan[:count]], token_sequences(val_paths)


def _step(head, opt, loss_fn, batch, amp):
    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        loss, _ = loss_fn(head, batch, train=True, with_stats=False)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def _heads(target, vocab):
    """Fresh EAGLE and EAGLE-3 heads with the SmolLM2 recipe's losses (drafting vocabulary ``vocab``)."""
    from eagle2.training.objectives.eagle3 import eagle3_loss, new_eagle3_head

    torch.manual_seed(0)
    ldt = loss_dtype("auto")
    lm_head = target.get_output_embeddings()
    head = new_head(target)
    eagle3 = new_eagle3_head(target, vocab[:8192])
    return {"head": (head, partial(head_loss, proj=LossProjection(lm_head, ldt, vocab), noise=0.1, w_reg=1.0,
                                   w_cls=0.1)),
            "eagle3": (eagle3, partial(eagle3_loss, proj=LossProjection(lm_head, ldt), unroll=3,
                                       unroll_cls_fraction=0.5))}


def compare_joint(target, raw, vocab, reps: int, amp) -> None:
    """Both heads per batch: separate forwards (fp32 weights, autocast) vs one joint forward (bf16 body)."""
    from eagle2.training.features import body_dtype
    from eagle2.training.objectives.joint import JointHeads, joint_loss

    heads = _heads(target, vocab)
    taps = heads["eagle3"][0].feature_layers
    old_feats = {"head": OnlineFeatures(target, (), amp), "eagle3": OnlineFeatures(target, taps, amp)}
    joint = JointHeads({name: h for name, (h, _) in heads.items()}, primary="eagle3")
    new_feats = OnlineFeatures(target, taps, amp, body_dtype("auto", torch.device("cpu")))
    losses = {name: fn for name, (_, fn) in heads.items()}
    opts = {name: torch.optim.AdamW([p for p in h.parameters() if p.requires_grad], lr=1e-4)
            for name, (h, _) in heads.items()}
    joint_opt = torch.optim.AdamW([p for p in joint.parameters() if p.requires_grad], lr=1e-4)

    def old_way(batch):
        for name, (head, fn) in heads.items():
            _step(head, opts[name], fn, old_feats[name](collate(batch, "cpu")), amp)

    def new_way(batch):
        _step(joint, joint_opt, partial(joint_loss, losses=losses), new_feats(collate(batch, "cpu")), amp)

    ways = {"separate": old_way, "joint": new_way}
    for way in ways.values():
        way(raw[0])  # warm-up
    tokens = sum(sum(len(s.tokens) for s in b) for b in raw)
    rates = {name: [] for name in ways}
    for rep in range(reps):
        for name in (list(ways) if rep % 2 == 0 else list(ways)[::-1]):
            t0 = device_clock("cpu")
            for b in raw:
                ways[name](b)
            rates[name].append(tokens / (device_clock("cpu") - t0))
    print(f"CPU {cpu_kind()}, {torch.get_num_threads()} thread(s), autocast {amp}, joint forward weights "
          f"{next(new_feats.body.parameters()).dtype}; {len(raw)} batches x {tokens // len(raw)} real tokens; "
          f"both heads per batch, target forward included")
    for name in ways:
        print(f"  {name:>10}: {statistics.median(rates[name]):7.0f} tokens/s (reps: "
              + ", ".join(f"{r:.0f}" for r in rates[name]) + ")")
    ratios = [b / a for a, b in zip(rates["separate"], rates["joint"])]
    print(f"  median ratio joint/separate: {statistics.median(ratios):.2f}x")


def training_target():
    """(the SmolLM2 target in fp32 with stock kernels and frozen weights, the autocast dtype this CPU trains in):
    what a head-training benchmark teaches from."""
    from experiments.bench.side_by_side import smollm2

    _, target, _ = smollm2("float32", "stock")
    target.requires_grad_(False)
    return target, autocast_dtype("auto", torch.device("cpu"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--compare", choices=("joint", "vocab"), default="joint")
    ap.add_argument("--corpus", default="artifacts/corpus/smollm2_conversations")
    ap.add_argument("--token-budget", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cls-vocab-size", type=int, default=16384)
    ap.add_argument("--quality-steps", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from eagle2.training.data import tokens_by_frequency

    target, amp = training_target()
    featurize = OnlineFeatures(target, (), amp)
    raw, val = _batches(args.corpus, args.token_budget, args.steps * 2 + args.quality_steps)
    if args.compare == "joint":
        compare_joint(target, raw[: args.steps], tokens_by_frequency(args.corpus, limit=args.cls_vocab_size),
                      args.reps, amp)
        return
    t0 = device_clock("cpu")
    batches = [featurize(collate(b, "cpu")) for b in raw[: args.steps]]
    feat_s = (device_clock("cpu") - t0) / len(batches)
    tokens = sum(int(b["valid"].sum()) for b in batches)
    vocab = tokens_by_frequency(args.corpus, limit=args.cls_vocab_size)
    lm_head, ldt = target.get_output_embeddings(), loss_dtype("auto")
    variants = {"full": LossProjection(lm_head, ldt), f"vocab{len(vocab)}": LossProjection(lm_head, ldt, vocab)}
    heads = {}
    for name, proj in variants.items():
        torch.manual_seed(0)
        head = new_head(target)
        heads[name] = (head, torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-4),
                       partial(head_loss, proj=proj, noise=0.1, w_reg=1.0, w_cls=0.1))
        _step(*heads[name], batches[0], amp)  # warm-up
    rates = {name: [] for name in heads}
    for rep in range(args.reps):
        for name in (list(heads) if rep % 2 == 0 else list(heads)[::-1]):
            t0 = device_clock("cpu")
            for b in batches:
                _step(*heads[name], b, amp)
            rates[name].append(tokens / (device_clock("cpu") - t0))
    names = list(heads)
    ratios = [b / a for a, b in zip(rates[names[0]], rates[names[1]])]
    print(f"CPU {cpu_kind()}, {torch.get_num_threads()} thread(s), autocast {amp}, loss dtype {ldt}; "
          f"{len(batches)} batches x {tokens // len(batches)} real tokens")
    for name in names:
        print(f"  {name:>10}: {statistics.median(rates[name]):7.0f} tokens/s per step (reps: "
              + ", ".join(f"{r:.0f}" for r in rates[name]) + ")")
    print(f"  median ratio {names[1]}/{names[0]}: {statistics.median(ratios):.2f}x; the online feature forward "
          f"alone: {tokens / len(batches) / feat_s:.0f} tokens/s (the same for both)")
    if args.quality_steps:
        cfg = dict(token_budget=args.token_budget, max_batch=32, max_sequences=48, device="cpu", featurize=featurize)
        for name, proj in variants.items():
            torch.manual_seed(0)
            head = new_head(target)
            opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-3)
            loss_fn = partial(head_loss, proj=proj, noise=0.1, w_reg=1.0, w_cls=0.1)
            for b in raw[: args.quality_steps]:
                _step(head, opt, loss_fn, featurize(collate(b, "cpu")), amp)
            stats = evaluate_loss(head, loss_fn, val, **cfg)
            print(f"  {name:>10}: held-out top-1 {stats['top1']:.3f} after {args.quality_steps} steps (fresh head)")


if __name__ == "__main__":
    main()
