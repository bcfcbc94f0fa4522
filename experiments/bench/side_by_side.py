"""What the side-by-side benchmarks share: SmolLM2 composed from ``conf/`` as ``run.py`` composes it, with
MT-bench first-turn prompts; our plain decoding and transformers' ``generate()`` as decoders of the same
prompts; one alternating timer (the order flips every repetition); and the comparison of two decoders'
outputs: equal in fp32, audited (``eagle2.bench.identity``) in half precision. The ``bench_*`` scripts are
thin over this module; nothing here is a script."""

from __future__ import annotations

import statistics

import torch

from eagle2.bench.identity import classify, reference_dtype, reference_logits
from eagle2.bench.models import load_target
from eagle2.core.clock import device_clock
from eagle2.core.engine import generate
from eagle2.core.precision import dtype_name
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.plain import PlainDrafter
from eagle2.prompts.chat import encode_conversation
from eagle2.prompts.questions import benchmark_file, load_questions
from eagle2.registry import CONF_DIR


def add_common_arguments(ap, reps: int) -> None:
    """The options the side-by-side benchmarks take: prompts, new tokens, repetitions, dtype."""
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--dtype", default="bfloat16", help="the target's (and draft's) dtype: bfloat16 or float32")


def run_config(*overrides: str):
    """``conf/config.yaml`` composed with ``overrides`` (Hydra's override syntax), as ``run.py`` composes it."""
    from hydra import compose, initialize_config_dir

    from eagle2.bench.resolvers import register

    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def smollm2_config(dtype: str = "float32", kernels: str = "auto", *overrides: str):
    """The run config of ``model=smollm2`` in ``dtype`` with ``kernels`` (``model.kernels``) and any further
    ``overrides`` (e.g. ``method=eagle2``, ``model.short_attention=false``)."""
    return run_config("model=smollm2", f"model.dtype={dtype}", f"model.kernels={kernels}", *overrides)


def smollm2(dtype: str = "float32", kernels: str = "auto", *overrides: str):
    """(run config, model, tokenizer) of ``smollm2_config(dtype, kernels, *overrides)``."""
    cfg = smollm2_config(dtype, kernels, *overrides)
    return cfg, *load_target(cfg.model)


def first_turns(tokenizer, n_prompts: int) -> list[list[int]]:
    """The prompt ids of the first ``n_prompts`` MT-bench first turns."""
    return [encode_conversation(tokenizer, "tokenizer", q["turns"][:1], [])
            for q in load_questions(benchmark_file("mt_bench"), n_prompts)]


def smollm2_with_prompts(n_prompts: int, dtype: str = "float32"):
    """(model, tokenizer, prompt id lists) for the first ``n_prompts`` MT-bench first turns."""
    _, model, tok = smollm2(dtype)
    return model, tok, first_turns(tok, n_prompts)


def plain_decoder(model, new_tokens: int):
    """Our plain decoding, greedy, exactly ``new_tokens`` tokens (EOS off): prompt ids -> output ids."""
    return lambda prompt: generate(model, PlainDrafter(), prompt, SamplingParams(), new_tokens, set()).output_ids


def generate_decoder(model, tokenizer, new_tokens: int, **options):
    """transformers' ``model.generate()``, greedy, exactly ``new_tokens`` tokens (EOS off), with ``options``
    (e.g. ``assistant_model=``): prompt ids -> output ids."""
    def decode(prompt):
        ids = torch.tensor([prompt], device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=tokenizer.pad_token_id, **options)
        return out[0, len(prompt):].tolist()
    return decode


def in_turn(items: list, turn: int) -> list:
    """``items`` in order on even turns, reversed on odd ones: who runs first alternates."""
    return items if turn % 2 == 0 else items[::-1]


def alternating_rates(decoders: dict, prompts: list[list[int]], reps: int, device="cpu",
                      echo: bool = True) -> list[dict[str, float]]:
    """Tokens/s of each decoder (name -> prompt -> output ids) per repetition; the order flips every
    repetition so that neither side always runs on a warmer machine. ``echo``: print one line per repetition
    (the first two decoders and their ratio). ``device``: where the decoders run (the clock waits for it)."""
    names = list(decoders)
    rates = []
    for rep in range(reps):
        rate = {}
        for name in in_turn(names, rep):
            start = device_clock(device)
            tokens = sum(len(decoders[name](p)) for p in prompts)
            rate[name] = tokens / (device_clock(device) - start)
        if echo:
            first, second = names[:2]
            print(f"rep {rep}: {first} {rate[first]:.2f} tok/s, {second} {rate[second]:.2f} tok/s, "
                  f"ratio {rate[first] / rate[second]:.3f}", flush=True)
        rates.append(rate)
    return rates


def ratio_line(rates: list[dict[str, float]], first: str, second: str) -> str:
    """The median, min and max of ``first``/``second`` over the repetitions of ``alternating_rates``."""
    ratios = [r[first] / r[second] for r in rates]
    return (f"median ratio {first}/{second} over {len(ratios)} reps: {statistics.median(ratios):.3f} "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


def identity_line(dtype: str, decoders: dict, prompts: list[list[int]]) -> str:
    """Decode every prompt with both decoders and compare: in fp32 the outputs must be equal (raises
    otherwise); in half precision each difference is classified by the identity audit (numeric or
    algorithmic, both sides checked against a finer reference)."""
    (name_a, a), (name_b, b) = decoders.items()
    pairs = [(p, a(p), b(p)) for p in prompts]
    if dtype_name(dtype) == "float32":
        same = sum(x == y for _, x, y in pairs)
        assert same == len(pairs), f"{name_a} and {name_b} disagree in fp32 on {len(pairs) - same} prompts"
        return f"outputs identical on {same}/{len(pairs)} prompts (fp32)"
    _, ref, _ = smollm2(reference_dtype(dtype))
    statuses = []
    for p, x, y in pairs:
        both = [classify(reference_logits(ref, p, out), out, other, dtype_name(dtype))["status"]
                for out, other in ((x, y), (y, x))]
        statuses.append("algorithmic" if "algorithmic" in both else both[0])
    counts = {s: statuses.count(s) for s in ("identical", "numeric", "algorithmic")}
    return f"identity audit over {len(pairs)} prompts ({dtype_name(dtype)}): {counts}"


def side_by_side(decoders: dict, prompts: list[list[int]], reps: int, dtype: str) -> list[dict[str, float]]:
    """The two decoders' outputs compared (printed; also the warm-up), then their alternating rates."""
    print(identity_line(dtype, decoders, prompts), flush=True)
    return alternating_rates(decoders, prompts, reps)


def ours_against_generate(model, tokenizer, prompts: list[list[int]], new_tokens: int, reps: int, dtype: str,
                          generate_model=None) -> list[dict[str, float]]:
    """Our plain decoding (``model``) against transformers' ``generate()`` (``generate_model``, default the
    same model) on the same prompts, side by side: rates per repetition under the names ours, generate."""
    decoders = {"ours": plain_decoder(model, new_tokens),
                "generate": generate_decoder(generate_model or model, tokenizer, new_tokens)}
    return side_by_side(decoders, prompts, reps, dtype)
