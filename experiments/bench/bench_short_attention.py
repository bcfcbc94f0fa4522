"""SDPA against the short-query attention (``eagle2.core.short_attention``) on SmolLM2, side by side in one run:
plain decoding's tokens/s and one verification forward of a q-token tree, after prompts of several lengths, the
two attentions alternated (median of ``--reps``), and their ratio.

    python -m experiments.bench.bench_short_attention [--dtype bfloat16] [--threads 1] [--contexts 150,400,1000,1800]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from eagle2.core.clock import device_clock
from eagle2.core.cpu import cpu_kind
from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.plain import PlainDrafter

ROOT = Path(__file__).resolve().parents[2]


def load(short: bool, dtype: str):
    from hydra import compose, initialize_config_dir

    from eagle2.bench.models import load_target
    from eagle2.bench.resolvers import register

    register()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["model=smollm2", f"model.dtype={dtype}",
                                           f"model.short_attention={str(short).lower()}"])
    return load_target(cfg.model)[0]


def decode_rate(model, prompt: list[int], tokens: int) -> float:
    start = device_clock(model.device)
    out = generate(model, PlainDrafter(), prompt, SamplingParams(), tokens, set())
    return len(out.output_ids) / (device_clock(model.device) - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--contexts", default="150,400,1000,1800")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = {"sdpa": load(False, args.dtype), "short": load(True, args.dtype)}
    print(f"SmolLM2, {args.dtype}, {args.threads} thread(s), CPU kind {cpu_kind()}: plain decoding tokens/s")
    print("| prompt tokens | SDPA | short-query | ratio |\n|---:|---:|---:|---:|")
    for context in (int(c) for c in args.contexts.split(",")):
        prompt = torch.randint(100, 20000, (context,), generator=torch.Generator().manual_seed(context)).tolist()
        rates = {name: [] for name in models}
        for _ in range(args.reps):
            for name, model in models.items():  # alternated: a load change hits both
                rates[name].append(decode_rate(model, prompt, args.tokens))
        sdpa, short = (statistics.median(rates[n]) for n in ("sdpa", "short"))
        print(f"| {context} | {sdpa:.1f} | {short:.1f} | {short / sdpa:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
