"""Benchmark: what a plain round costs around its verify, plain decoding against EAGLE-2 under
``method.policy=pays`` on the rounds the policy steps aside, side by side:

    python -m experiments.bench.bench_plain_round [--batch 8] [--rounds 300] [--reps 3] [--dtype float32]

The round is the engine's own (``eagle2.core.engine.decode_round``: propose, accept, commit, the drafter hearing
what was accepted, the round's records; at batch > 1 the clock read and the rows settled each round, as the batch
engine does) over SmolLM2's EAGLE head and vocabulary, with the verify replaced by a stand-in that returns fixed
logits and features at once: the target's forward and KV commit, the same for both methods and far longer, would
bury the difference in noise. The policy runs with a planted profile under which drafting never pays; only its
plain rounds are counted (not its probe bursts). The two decoders' rounds interleave, who goes first alternating;
each repetition prints both medians (ms per round), their difference and their ratio. Rounds are timed in this
thread's CPU time (``time.thread_time``) with one torch thread: on a shared machine, wall time mostly measures the
neighbours, and the machine's speed drifts between runs (compare ratios, not milliseconds, across runs).
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


class Decoding:
    """``rows`` sequences decoding with ``method`` through the fixed verify, one round at a time (``timed_round``)."""

    def __init__(self, target, head, prompt: list[int], method: dict, rows: int):
        hidden = target.config.hidden_size
        self.seqs = {}
        for row in range(rows):
            drafter = build_drafter(OmegaConf.create(method), target, GREEDY, None, head=head,
                                    weights={"policy_profile": never_paying(rows)})
            drafter.start(prompt, prompt[-1], torch.randn(len(prompt), hidden) if drafter.needs_hidden else None)
            self.seqs[row] = Sequence(drafter, None, [prompt[-1]])
        self.rows, self.verifier, self.clock = rows, FixedVerifier(rows, 256, hidden), Clock("cpu")

    def timed_round(self) -> tuple[float, str]:
        """One round: (its seconds, the policy's choice)."""
        start = time.thread_time()
        if self.rows > 1:  # the batch engine's round: its own clock, read and settled at once
            self.clock = Clock("cpu")
        decode_round(self.seqs, self.verifier, GREEDY, self.clock, batch_drafting=self.rows > 1)
        if self.rows > 1:
            seconds = self.clock.resolve()
            for seq in self.seqs.values():
                seq.settle(seconds)
        elapsed = time.thread_time() - start
        facts = self.seqs[0].pending[-1].meta if self.rows == 1 else self.seqs[0].rounds[-1].drafter
        return elapsed, facts.get("policy_choice", "plain")


def plain_round_seconds(target, head, prompt: list[int], methods: dict, rows: int, rounds: int) -> dict:
    """Per method of ``methods`` (name -> method config), the seconds of each of its plain rounds, the methods'
    rounds interleaved (who goes first alternating), so that a drift of the machine falls on both."""
    decodings = {name: Decoding(target, head, prompt, method, rows) for name, method in methods.items()}
    seconds = {name: [] for name in methods}
    for i in range(rounds):
        for name in in_turn(list(methods), i):
            elapsed, choice = decodings[name].timed_round()
            if choice == "plain":
                seconds[name].append(elapsed)
    return seconds


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
    plain_round_seconds(target, head, prompt, methods, args.batch, 20)  # warm-up
    for rep in range(args.reps):
        ms = {name: (1e3 * statistics.median(s), len(s))
              for name, s in plain_round_seconds(target, head, prompt, methods, args.batch, args.rounds).items()}
        print(f"rep {rep + 1}, B={args.batch}, {args.dtype}, {torch.get_num_threads()} threads: "
              + "; ".join(f"{n} {m[0]:.3f} ms median ({m[1]} plain rounds)" for n, m in ms.items())
              + f"; pays - plain {ms['pays'][0] - ms['plain'][0]:+.3f} ms, pays / plain "
              f"{ms['pays'][0] / ms['plain'][0]:.2f}x", flush=True)

if __name__ == "__main__":
    main()
