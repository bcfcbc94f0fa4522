"""Attention for a few query rows against a long cache, three ways side by side, in one run: the fp32 matrix
products ``eagle2.core.short_attention`` uses, the same products in bf16 (fp32 softmax), and SDPA; per layer, at
SmolLM2's head shapes (9 query heads over 3 KV heads, head dim 64), with each one's largest error against float64:

    python -m experiments.bench.bench_attention_kernels [--threads 2]

The shapes: a batch's decode step (many rows of one query each: the regeneration's 48 rows), one row, and a tree
verification (32 query rows). Time it on a quiet machine. Whole decoding with either attention:
``experiments.bench.bench_short_attention``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from eagle2.core.clock import device_clock

SHAPES = [(48, 1, 900), (48, 1, 400), (16, 1, 600), (8, 1, 900), (1, 1, 1000), (1, 32, 1000)]  # rows, queries, keys
KV_HEADS, GROUPS, DIM = 3, 3, 64
WAYS = ("fp32 products", "bf16 products", "SDPA")  # the columns, in ``ways``' order


def timed(fn, reps: int = 40) -> float:
    """Milliseconds per call (two warm-up calls)."""
    fn(), fn()
    start = device_clock("cpu")
    for _ in range(reps):
        fn()
    return (device_clock("cpu") - start) / reps * 1e3


def ways(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """The three attentions of bf16 ``q`` (B, H, Q, D) over ``k``/``v`` (B, KVH, K, D), outputs in bf16."""
    rows, queries, scale = q.shape[0], q.shape[2], q.shape[-1] ** -0.5
    grouped = q.reshape(rows, KV_HEADS, GROUPS * queries, DIM)
    return {WAYS[0]: lambda: ((grouped.float() @ k.float().transpose(-1, -2) * scale).softmax(-1)
                                      @ v.float()).to(torch.bfloat16),
            WAYS[1]: lambda: ((grouped @ k.transpose(-1, -2)).float() * scale).softmax(-1).to(torch.bfloat16)
            @ v,
            WAYS[2]: lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| rows x queries x keys | " + " | ".join(f"{n} ms (max error)" for n in WAYS)
          + " |\n|---|---:|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for rows, queries, keys in SHAPES:
        q = torch.randn(rows, KV_HEADS * GROUPS, queries, DIM, generator=gen).bfloat16()
        k, v = (torch.randn(rows, KV_HEADS, keys, DIM, generator=gen).bfloat16() for _ in range(2))
        exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
        cells = [f"{timed(fn):.2f} ({(fn().double().reshape(exact.shape) - exact).abs().max():.1e})"
                 for fn in ways(q, k, v).values()]
        print(f"| {rows} x {queries} x {keys} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
