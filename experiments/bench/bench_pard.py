"""Benchmark: the draft time of one round, PARD (one forward for K depths) against SpS (K forwards) at the same
depth, on SmolLM2 with random drafts at the SpS draft's shapes (2 layers of the target's width, its embedding and
LM head).

Both drafters start on the same MT-bench prompt; then rounds alternate, the order flipping every repetition, each
a ``propose`` followed by one committed token (a round that accepted nothing: SpS re-feeds one token and drafts K
more one by one, PARD feeds it with K - 1 mask slots in one forward and builds its choice tree). Prints the median
seconds per round of each and their ratio. Timings only: random weights draft nonsense.
Run: ``python -m experiments.bench.bench_pard [--depth 4] [--rounds 40] [--dtype bfloat16]``.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.clock import device_clock
from eagle2.core.sampling import SamplingParams
from eagle2.heads.draft_model import build_draft_model
from eagle2.heads.pard_draft import PardDraft
from experiments.bench.side_by_side import first_turns, in_turn, smollm2


def timed_round(drafter, committed: int, device) -> float:
    """Seconds of one ``propose`` on ``device``; then ``committed`` is the round's one new token."""
    start = device_clock(device)
    drafter.propose(drafter.sequence[-1], room=1 << 30)
    seconds = device_clock(device) - start
    drafter.observe([committed], None)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depth", type=int, default=4, help="K: SpS's k and PARD's depth")
    ap.add_argument("--top-k", type=int, default=1, help="PARD's choice tree (1: a chain, as SpS drafts)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    _, target, tok = smollm2(args.dtype)
    torch.manual_seed(0)
    lm = build_draft_model(target, 2, init_from_target=False).to(target.dtype)
    pard = PardDraft(lm, args.depth)
    prompt, params = first_turns(tok, 1)[0], SamplingParams()
    methods = {"sps": {"name": "sps", "k": args.depth},
               "pard": {"name": "pard", "depth": args.depth, "top_k": args.top_k, "total_tokens": 64}}
    drafters = {name: build_drafter(OmegaConf.create(m), target, params, None, sps_draft=lm, pard_draft=pard)
                for name, m in methods.items()}
    with torch.no_grad():
        for drafter in drafters.values():
            drafter.start(prompt[:-1], prompt[-1], None)
            timed_round(drafter, prompt[-1], target.device)  # the prompt's prefill and a warm-up round
        seconds = {name: [] for name in drafters}
        for rnd in range(args.rounds):
            for name in in_turn(list(drafters), rnd):
                seconds[name].append(timed_round(drafters[name], prompt[rnd % len(prompt)], target.device))
    median = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"SmolLM2 {args.dtype}, {torch.get_num_threads()} threads, context {len(prompt)}+, depth {args.depth}, "
          f"{args.rounds} alternating rounds: SpS {median['sps'] * 1e3:.2f} ms/round, PARD "
          f"{median['pard'] * 1e3:.2f} ms/round, SpS/PARD {median['sps'] / median['pard']:.2f}x")


if __name__ == "__main__":
    main()
