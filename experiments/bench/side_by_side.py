"""What the side-by-side benchmarks share: SmolLM2 with MT-bench first-turn prompts, timing two
decoders over the same prompts in alternating order, repetition after repetition, and comparing
their outputs: equal in fp32, audited (``eagle2.bench.identity``) in half precision."""

from __future__ import annotations

from omegaconf import OmegaConf

from eagle2.bench.identity import classify, reference_dtype, reference_logits
from eagle2.bench.models import load_target
from eagle2.core.clock import device_clock
from eagle2.core.precision import dtype_name
from eagle2.prompts.chat import encode_conversation
from eagle2.prompts.questions import benchmark_file, load_questions


def add_common_arguments(ap, reps: int) -> None:
    """The options both side-by-side benchmarks take: prompts, new tokens, repetitions, dtype."""
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--dtype", default="bfloat16", help="the target's (and draft's) dtype: bfloat16 or float32")


def smollm2(dtype: str = "float32"):
    return load_target(OmegaConf.create({"source": "smollm2_gguf", "dtype": dtype, "device": "cpu"}))


def smollm2_with_prompts(n_prompts: int, dtype: str = "float32"):
    """(model, tokenizer, prompt id lists) for the first ``n_prompts`` MT-bench first turns."""
    model, tok = smollm2(dtype)
    prompts = [encode_conversation(tok, "tokenizer", q["turns"][:1], [])
               for q in load_questions(benchmark_file("mt_bench"), n_prompts)]
    return model, tok, prompts


def alternating_rates(decoders: dict, prompts: list[list[int]], reps: int, device="cpu") -> list[dict[str, float]]:
    """Tokens/s of each decoder (name -> prompt -> output ids) per repetition; the order flips every
    repetition so that neither side always runs on a warmer machine. Prints one line per repetition.
    ``device``: where the decoders run (the clock waits for its queued work)."""
    names = list(decoders)
    rates = []
    for rep in range(reps):
        rate = {}
        for name in names if rep % 2 == 0 else names[::-1]:
            start = device_clock(device)
            tokens = sum(len(decoders[name](p)) for p in prompts)
            rate[name] = tokens / (device_clock(device) - start)
        first, second = names
        print(f"rep {rep}: {first} {rate[first]:.2f} tok/s, {second} {rate[second]:.2f} tok/s, "
              f"ratio {rate[first] / rate[second]:.3f}", flush=True)
        rates.append(rate)
    return rates


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
    ref, _ = smollm2(reference_dtype(dtype))
    statuses = []
    for p, x, y in pairs:
        both = [classify(reference_logits(ref, p, out), out, other, dtype_name(dtype))["status"]
                for out, other in ((x, y), (y, x))]
        statuses.append("algorithmic" if "algorithmic" in both else both[0])
    counts = {s: statuses.count(s) for s in ("identical", "numeric", "algorithmic")}
    return f"identity audit over {len(pairs)} prompts ({dtype_name(dtype)}): {counts}"
