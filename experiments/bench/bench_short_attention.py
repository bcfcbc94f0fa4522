"""SDPA against the short-query attention (``eagle2.core.short_attention``) on SmolLM2, side by side in one run:
plain decoding's tokens/s and one verification forward of a q-token tree, after prompts of several lengths, the
two attentions alternated (median of ``--reps``), and their ratio.

    python -m experiments.bench.bench_short_attention [--dtype bfloat16] [--threads 1] [--contexts 150,400,1000,1800]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from eagle2.core.cpu import cpu_kind
from experiments.bench.side_by_side import alternating_rates, plain_decoder, smollm2


def load(short: bool, dtype: str):
    return smollm2(dtype, "auto", f"model.short_attention={str(short).lower()}")[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--contexts", default="150,400,1000,1800")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    decoders = {"sdpa": plain_decoder(load(False, args.dtype), args.tokens),
                "short": plain_decoder(load(True, args.dtype), args.tokens)}
    print(f"SmolLM2, {args.dtype}, {args.threads} thread(s), CPU kind {cpu_kind()}: plain decoding tokens/s")
    print("| prompt tokens | SDPA | short-query | ratio |\n|---:|---:|---:|---:|")
    for context in (int(c) for c in args.contexts.split(",")):
        prompt = torch.randint(100, 20000, (context,), generator=torch.Generator().manual_seed(context)).tolist()
        rates = alternating_rates(decoders, [prompt], args.reps, echo=False)  # a load change hits both
        sdpa, short = (statistics.median(r[n] for r in rates) for n in ("sdpa", "short"))
        print(f"| {context} | {sdpa:.1f} | {short:.1f} | {short / sdpa:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
