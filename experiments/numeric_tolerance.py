"""Measure how far a dtype's logits stray from a finer reference: the identity audit's tolerance.

For SmolLM2 in ``--dtype`` it decodes greedily (one-token forwards through a KV cache, as plain
decoding does) on benchmark prompts, then recomputes the logits of the same sequence (a) by one
teacher-forced forward in the same dtype (the shape of a tree verification) and (b) by one
teacher-forced forward in the reference dtype (float32, or float64 for a float32 run). For each
position and each run it takes the error of the gap between each of the reference top-5 tokens and
the reference top-1, divided by eps(dtype) * max|reference logit|: the quantity that
``eagle2.bench.identity.TOLERANCE_FACTORS`` must bound. It also counts the positions where the dtype
disagrees with itself (one-token vs teacher-forced argmax) and the reference margins there.

Run: ``python -m experiments.numeric_tolerance --dtype bfloat16 --prompts 8 --new-tokens 96``.
"""

from __future__ import annotations

import argparse

import torch

from eagle2.bench.chat import encode_conversation
from eagle2.bench.data import benchmark_file, load_questions
from eagle2.bench.identity import reference_dtype, reference_logits
from eagle2.core.cache import forward_target, new_cache
from experiments.side_by_side import smollm2


@torch.no_grad()
def incremental_greedy(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the logits that chose them, one-token forwards through a cache."""
    cache = new_cache(model)
    hidden = forward_target(model, torch.tensor([prompt]), cache)
    logits = [model.lm_head(hidden[0, -1]).double()]
    out = [int(logits[-1].argmax())]
    for _ in range(n - 1):
        hidden = forward_target(model, torch.tensor([[out[-1]]]), cache)
        logits.append(model.lm_head(hidden[0, -1]).double())
        out.append(int(logits[-1].argmax()))
    return out, torch.stack(logits)


def gap_error_ratio(run: torch.Tensor, ref: torch.Tensor, eps: float) -> torch.Tensor:
    """Per position: max over the reference top-5 of |gap to top-1 (run) - gap to top-1 (ref)|, over eps*max|z|."""
    top = ref.topk(5, -1).indices
    g_run, g_ref = run.gather(1, top), ref.gather(1, top)
    err = ((g_run - g_run[:, :1]) - (g_ref - g_ref[:, :1])).abs().amax(1)
    return err / (eps * ref.abs().amax(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--dataset", default="mt_bench")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    args = ap.parse_args()
    model, tok = smollm2(args.dtype)
    ref_model, _ = smollm2(reference_dtype(args.dtype))
    eps = torch.finfo(model.dtype).eps
    ratios, margins, positions = [], [], 0
    for q in load_questions(benchmark_file(args.dataset), args.prompts):
        prompt = encode_conversation(tok, "tokenizer", q["turns"][:1], [])
        out, inc = incremental_greedy(model, prompt, args.new_tokens)
        ref = reference_logits(ref_model, prompt, out)
        forced = reference_logits(model, prompt, out)  # same dtype, one multi-token forward
        ratios += [gap_error_ratio(inc, ref, eps), gap_error_ratio(forced, ref, eps)]
        for i in torch.nonzero(inc.argmax(1) != forced.argmax(1)).flatten().tolist():
            margins += [float(ref[i].max() - ref[i, int(run[i].argmax())]) for run in (inc, forced)]
        positions += len(out)
    r = torch.cat(ratios)
    print(f"{args.dtype} vs {reference_dtype(args.dtype)}: {positions} positions x 2 forward shapes")
    print(f"gap error / (eps * max|z|): median {r.median():.2f}, p99 {r.quantile(0.99):.2f}, max {r.max():.2f}")
    print(f"self-disagreements (one-token vs teacher-forced argmax): {len(margins) // 2}; "
          f"largest reference margin there {max(margins, default=0.0):.4f} logits")


if __name__ == "__main__":
    main()
