"""The Hydra control on the shipped SmolLM2 heads: the same heads with the path's token embeddings blanked
(zeros: head k ignores the drafted tokens before it) must stay lossless (same outputs as plain decoding,
fp32) but accept less. Prints tau (tokens per target forward) and the outputs' identity for both.

    python -m experiments.research.hydra_path_control --prompts 5 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json

import torch
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from eagle2.heads.hydra_heads import load_hydra_heads
from experiments.bench.side_by_side import smollm2_with_prompts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--heads", default="artifacts/smollm2/hydra_head")
    ap.add_argument("--choices", default="[[0], [1], [0, 0]]")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, _, prompts = smollm2_with_prompts(args.prompts, "float32")
    greedy, method = SamplingParams(), OmegaConf.create({"name": "hydra", "choices": json.loads(args.choices)})
    plain = OmegaConf.create({"name": "plain"})
    blanked = load_hydra_heads(args.heads, model)
    blanked.embed = lambda tokens: torch.zeros(*tokens.shape, blanked.hidden)
    for name, heads in (("hydra", load_hydra_heads(args.heads, model)), ("hydra, path blanked", blanked)):
        tokens = forwards = same = 0
        for p in prompts:
            out = generate(model, build_drafter(method, model, greedy, None, weights={"hydra_head": heads}), p,
                           greedy, args.new_tokens, set())
            ref = generate(model, build_drafter(plain, model, greedy, None, weights={}), p, greedy,
                           args.new_tokens, set())
            tokens, forwards = tokens + sum(out.accept_lengths), forwards + out.target_forwards
            same += out.output_ids == ref.output_ids
        print(f"{name}: tau {tokens / forwards:.3f} ({tokens} tokens, {forwards} target forwards), "
              f"fp32 outputs equal to plain: {same}/{len(prompts)}", flush=True)


if __name__ == "__main__":
    main()
