"""Measure how far a dtype's logits stray from a finer reference: the identity audit's tolerance.

For SmolLM2 in ``--dtype`` it decodes greedily (one-token forwards through a KV cache, as plain
decoding does) on benchmark prompts, then recomputes the logits of the same sequence (a) by one
teacher-forced forward in the same dtype (the shape of a tree verification) and (b) by one
teacher-forced forward in the reference dtype (float32, or float64 for a float32 run). For each
position and each run it takes the error of the gap between each of the reference top-5 tokens and
the reference top-1, divided by eps(dtype) * max|reference logit|: the quantity that
``eagle2.bench.identity.TOLERANCE_FACTORS`` must bound. It also counts the positions where the dtype
disagrees with itself (one-token vs teacher-forced argmax) and the reference margins there.

Run: ``python -m experiments.research.numeric_tolerance --dtype bfloat16 --prompts 8 --new-tokens 96`` (SmolLM2 on
this CPU). On a GPU, for the fp16 factor that the identity audit lacks: ``python -m
experiments.research.numeric_tolerance --device cuda --model vicuna7b --dtype float16`` (``--model`` is any
``conf/model`` config, ``--override model.path=/local/dir`` where the hub is unreachable; the run
dtype and its fp32 reference are both loaded: 13.5 + 27 GB at 7B). The last line is the factor to
pass to the audit (``python -m eagle2.bench.identity RESULTS --tolerance-factor float16=X``).
"""

from __future__ import annotations

import argparse

import torch

from eagle2.bench.identity import reference_dtype, reference_logits
from eagle2.core.cache import forward_target, new_cache
from eagle2.prompts.chat import encode_conversation
from eagle2.prompts.questions import benchmark_file, load_questions


@torch.no_grad()
def incremental_greedy(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the logits that chose them, one-token forwards through a cache."""
    cache = new_cache(model)
    hidden = forward_target(model, torch.tensor([prompt], device=model.device), cache)
    logits = [model.lm_head(hidden[0, -1]).double()]
    out = [int(logits[-1].argmax())]
    for _ in range(n - 1):
        hidden = forward_target(model, torch.tensor([[out[-1]]], device=model.device), cache)
        logits.append(model.lm_head(hidden[0, -1]).double())
        out.append(int(logits[-1].argmax()))
    return out, torch.stack(logits)


def gap_error_ratio(run: torch.Tensor, ref: torch.Tensor, eps: float) -> torch.Tensor:
    """Per position: max over the reference top-5 of |gap to top-1 (run) - gap to top-1 (ref)|, over eps*max|z|."""
    top = ref.topk(5, -1).indices
    g_run, g_ref = run.gather(1, top), ref.gather(1, top)
    err = ((g_run - g_run[:, :1]) - (g_ref - g_ref[:, :1])).abs().amax(1)
    return err / (eps * ref.abs().amax(1))


def model_config(name: str, overrides: list[str], device: str | None):
    """The ``conf/model/<name>.yaml`` entry (with Hydra overrides), on ``device`` when given."""
    from hydra import compose, initialize_config_dir

    from eagle2.prompts.questions import PROJECT_ROOT

    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={name}", *overrides])
    if device:
        cfg.model.device = device
    return cfg.model


def load_in(model_cfg, dtype: str):
    from eagle2.bench.models import load_target

    model_cfg = model_cfg.copy()
    model_cfg.dtype = dtype
    return load_target(model_cfg)  # the kernels the runs use (model.kernels)


def suggested_factor(ratios: torch.Tensor) -> float:
    """The measured maximum with a 25% margin, rounded up to a quarter (bf16's 3.44 gave 4)."""
    return float(torch.ceil(ratios.max() * 1.25 * 4) / 4)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--model", default="smollm2", help="a conf/model config (default: the embedded SmolLM2)")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: the model config's)")
    ap.add_argument("--override", action="append", default=[], help="a Hydra override, e.g. model.path=/dir")
    ap.add_argument("--dataset", default="mt_bench")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    args = ap.parse_args(argv)
    mcfg = model_config(args.model, args.override, args.device)
    model, tok = load_in(mcfg, args.dtype)
    ref_model, _ = load_in(mcfg, reference_dtype(args.dtype))
    eps = torch.finfo(model.dtype).eps
    ratios, margins, positions = [], [], 0
    for q in load_questions(benchmark_file(args.dataset), args.prompts):
        prompt = encode_conversation(tok, mcfg.template, q["turns"][:1], [], mcfg.system_prompt)
        out, inc = incremental_greedy(model, prompt, args.new_tokens)
        ref = reference_logits(ref_model, prompt, out)
        forced = reference_logits(model, prompt, out).to(ref.device)  # same dtype, one multi-token forward
        inc = inc.to(ref.device)
        ratios += [gap_error_ratio(inc, ref, eps), gap_error_ratio(forced, ref, eps)]
        for i in torch.nonzero(inc.argmax(1) != forced.argmax(1)).flatten().tolist():
            margins += [float(ref[i].max() - ref[i, int(run[i].argmax())]) for run in (inc, forced)]
        positions += len(out)
    r = torch.cat(ratios)
    print(f"{args.model} on {model.device}, {args.dtype} vs {reference_dtype(args.dtype)}: {positions} positions "
          "x 2 forward shapes")
    print(f"gap error / (eps * max|z|): median {r.median():.2f}, p99 {r.quantile(0.99):.2f}, max {r.max():.2f}")
    print(f"self-disagreements (one-token vs teacher-forced argmax): {len(margins) // 2}; "
          f"largest reference margin there {max(margins, default=0.0):.4f} logits")
    print(f"tolerance factor for the identity audit: --tolerance-factor {args.dtype}={suggested_factor(r):g}")


if __name__ == "__main__":
    main()
