"""Benchmark: what a plain round costs around its verify, plain decoding against EAGLE-2 under
``method.policy=pays`` on the rounds the policy steps aside, side by side:

    python -m experiments.bench.bench_plain_round [--batch 8] [--rounds 300] [--reps 3] [--dtype float32]

The round is the engine's own (``eagle2.core.engine.decode_round``: propose, accept, commit, the drafter hearing
what was accepted, the round's records; at batch > 1 the clock read and the rows settled each round, as the batch
engine does) over SmolLM2's EAGLE head and vocabulary, with the verify replaced by a stand-in that returns fixed
logits and features at once: the target's forward and KV commit, the same for both methods and far longer, would
bury the difference in noise. The policy runs with a planted profile under which drafting never pays; only its
plain rounds are counted (not its probe bursts). The two decoders alternate, the order flipping every repetition;
each repetition prints both medians (ms per round) and their ratio. Rounds are timed in this thread's CPU time
(``time.thread_time``) with one torch thread: on a shared machine, wall time mostly measures the neighbours.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.clock import Clock
from eagle2.core.engine import Sequence, decode_round
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.budget import CostProfile
from eagle2.heads.eagle_head import load_head
from experiments.bench.side_by_side import first_turns, in_turn, smollm2

GREEDY = SamplingParams()
POLICY = {"name": "eagle2", "depth": 3, "top_k": 4, "total_tokens": 8, "policy": "pays"}


def never_paying(rows: int) -> CostProfile:
    """A profile under which drafting never pays: a drafting round costs nine plain rounds."""
    return CostProfile([0.03] * 65, [0.27] * 3, 256, {"planted": True}, rows=rows, draft_rows=rows)


class FixedVerifier:
    """A verify without a target: every node's logits the same fixed vector over the first ``vocab`` tokens (the
    acceptance's argmax, the same for both methods, kept short), every row's features fixed."""

    def __init__(self, rows: int, vocab: int, hidden: int):
        self.logits = torch.randn(64, vocab)
        self.features = torch.randn(rows, 64, hidden)

    def room(self, row: int) -> int:
        return 10**6

    def verify(self, trees):
        q = max(len(t) for t in trees.values())
        return {r: self.logits[: len(t)] for r, t in trees.items()}, self.features[:, :q], {}

    def commit(self, kept) -> None:
        pass


def plain_round_seconds(target, head, prompt: list[int], method: dict, rows: int, rounds: int) -> list[float]:
    """Seconds of each plain round of ``rounds`` rounds of ``rows`` sequences decoding with ``method``."""
    hidden = target.config.hidden_size
    seqs = {}
    for row in range(rows):
        drafter = build_drafter(OmegaConf.create(method), target, GREEDY, None, head=head,
                                weights={"policy_profile": never_paying(rows)})
        drafter.start(prompt, prompt[-1], torch.randn(len(prompt), hidden) if drafter.needs_hidden else None)
        seqs[row] = Sequence(drafter, None, [prompt[-1]])
    verifier, clock, times = FixedVerifier(rows, 256, hidden), Clock("cpu"), []
    for _ in range(rounds):
        start = time.thread_time()
        if rows > 1:  # the batch engine's round: its own clock, read and settled at once
            clock = Clock("cpu")
        decode_round(seqs, verifier, GREEDY, clock, batch_drafting=rows > 1)
        if rows > 1:
            seconds = clock.resolve()
            for seq in seqs.values():
                seq.settle(seconds)
        times.append(time.thread_time() - start)
    if rows == 1:
        seqs[0].settle(clock.resolve())
    choices = [r.drafter.get("policy_choice", "plain") for r in seqs[0].rounds]
    return [t for t, choice in zip(times, choices) if choice == "plain"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: every round's CPU time is this thread's)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg, target, tokenizer = smollm2(args.dtype)
    head = load_head(cfg.model.head, target)
    prompt = first_turns(tokenizer, 1)[0]
    methods = {"plain": {"name": "plain"}, "pays": POLICY}
    for method in methods.values():  # warm-up
        plain_round_seconds(target, head, prompt, method, args.batch, 20)
    for rep in range(args.reps):
        ms = {}
        for name in in_turn(list(methods), rep):
            seconds = plain_round_seconds(target, head, prompt, methods[name], args.batch, args.rounds)
            ms[name] = (1e3 * statistics.median(seconds), 1e3 * statistics.mean(seconds), len(seconds))
        print(f"rep {rep + 1}, B={args.batch}, {args.dtype}, {torch.get_num_threads()} threads: "
              + "; ".join(f"{n} {m[0]:.3f} ms median ({m[1]:.3f} mean, {m[2]} plain rounds)" for n, m in ms.items())
              + f"; pays - plain {ms['pays'][0] - ms['plain'][0]:+.3f} ms, pays / plain "
              f"{ms['pays'][0] / ms['plain'][0]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
