"""Identity audit: tells numeric drift from algorithmic errors in greedy speculative outputs.

At temperature 0 a lossless method reproduces the target's greedy decoding. In fp32 that holds token
for token; in half precision the target disagrees with itself at a few percent of positions (a tree
forward and a one-token forward round differently), so a speculative output may leave plain
decoding's at a near-tie and then drift. This audit says which, per question turn:

- ``identical``: the output equals the matched plain turn's (same model, dataset, dtype, seed,
  max_new_tokens, temperature 0, same prompt);
- ``numeric``: it differs, and at the first differing position both tokens are within ``tol`` of the
  reference maximum, and every token of the speculative output is (the target could have emitted
  each one, given rounding);
- ``algorithmic``: some token is further than ``tol`` below the reference maximum: no rounding of
  the run's dtype explains it. An acceptance bug shows up here; it is a failed check.

The reference is one teacher-forced forward of prompt + output in float32 (float64 when the run
itself was float32).

**Tolerance.** A logit computed in a dtype with machine epsilon ``eps`` carries an error that grows
with the logit scale, so ``tol = TOLERANCE_FACTORS[dtype] * eps(dtype) * max|z|`` at each position,
with z the reference logits. The factors are measured, not guessed (``python -m
experiments.research.numeric_tolerance --dtype D``: SmolLM2-135M on MT-bench prompts, one-token forwards and
teacher-forced forwards in D against the reference): the error of the gap between any of the
reference top-5 tokens and the top-1, over eps * max|z|. bfloat16 (776 positions): median 0.56, 99th
percentile 1.58, maximum 3.44, and the 20 positions where bf16 disagreed with itself had fp32
margins <= 0.22 logits against a tolerance there of ~0.8 (eps = 2**-7, max|z| ~ 25); factor 4.
float32 (388 positions, fp64 reference): median 2.5, p99 7.1, maximum 9.6 (long fp32 dot products
accumulate more error per eps than bf16 kernels, which accumulate in fp32); factor 16. float16 is
UNMEASURED (not measurable on this CPU; its eps is 8x smaller than bf16's, so bf16's factor says
nothing about it): until ``python -m experiments.research.numeric_tolerance --device cuda --model vicuna7b
--dtype float16`` is run on a GPU and its factor passed (``--tolerance-factor float16=X``), an fp16
audit warns, its records say ``tolerance_measured: false``, and the command line refuses it unless
``--allow-unmeasured``. A wrong token accepted by a broken rule is typically several logits below
the maximum.

**The reference at 13B-70B.** The fp32 reference loads as the model config says (``model.device_map``:
weights streamed to the GPU, ``auto`` spreading them over the visible GPUs and then host memory): 28 GB
at 7B, 52 GB at 13B, 282 GB at 70B. Where that does not fit, ``--reference-dtype run`` computes the
reference in the run's own dtype (one more copy of the weights, 141 GB at 70B, or the run's own
copy when loaded in the same process); each of the two half-precision computations strays from fp32
by at most the dtype's factor, so the tolerance doubles (``HALF_REFERENCE_FACTOR``).

Records go beside the rows, ``<method>-<hash>.identity.ndjson`` (one JSON line per audited turn;
a rerun audits only new turns), and ``python -m analysis.report`` summarises them in
``identity.csv``. Run: ``python -m eagle2.identity RESULTS [--override model.path=...]`` (the command
line, ``eagle2.identity``); it exits non-zero when any divergence is algorithmic.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

TOLERANCE_FACTORS = {"bfloat16": 4.0, "float16": 4.0, "float32": 16.0}
MEASURED = {"bfloat16", "float32"}  # float16's entry is bfloat16's, borrowed until measured on a GPU
HALF_REFERENCE_FACTOR = 2.0  # a reference in the run's own half dtype: two half computations' errors add
MEASURE_COMMAND = "python -m experiments.research.numeric_tolerance --device cuda --model vicuna7b --dtype {dtype}"
_warned: set[str] = set()


class UnmeasuredToleranceError(ValueError):
    """An audit in a dtype whose tolerance factor was never measured, without leave to borrow one."""


def set_tolerance_factor(dtype_name: str, factor: float) -> None:
    """Use a factor measured by ``experiments.research.numeric_tolerance`` (for float16: on a GPU)."""
    from eagle2.core.precision import dtype_name as canonical

    if not factor > 0:
        raise ValueError(f"a tolerance factor must be positive, got {factor}")
    TOLERANCE_FACTORS[canonical(dtype_name)] = float(factor)
    MEASURED.add(canonical(dtype_name))


def tolerance_measured(dtype_name: str) -> bool:
    from eagle2.core.precision import dtype_name as canonical

    return canonical(dtype_name) in MEASURED


def tolerance(dtype_name: str, reference_logits: torch.Tensor, half_reference: bool = False) -> torch.Tensor:
    """Per-position tolerance (L,) for logits (L, V) of a run made in ``dtype_name`` (``half_reference``:
    the reference was computed in that same dtype, not in a finer one)."""
    from eagle2.core.precision import resolve_dtype

    eps = torch.finfo(resolve_dtype(dtype_name)).eps
    factor = tolerance_factor(dtype_name) * (HALF_REFERENCE_FACTOR if half_reference else 1.0)
    return factor * eps * reference_logits.abs().amax(-1)


def tolerance_factor(dtype_name: str) -> float:
    """The dtype's factor; an unmeasured one (float16) is borrowed with a warning, never silently."""
    from eagle2.core.precision import dtype_name as canonical

    name = canonical(dtype_name)
    if name not in MEASURED and name not in _warned:
        _warned.add(name)
        import logging

        logging.getLogger(__name__).warning(
            "the %s identity tolerance factor is UNMEASURED: borrowing %.1f (bfloat16's; %s's eps is "
            "different). Measure it: %s", name, TOLERANCE_FACTORS[name], name, MEASURE_COMMAND.format(dtype=name))
    return TOLERANCE_FACTORS[name]


def reference_dtype(run_dtype: str) -> str:
    """The dtype name the reference logits are computed in: float64 for float32 runs, else float32."""
    from eagle2.core.precision import dtype_name

    return "float64" if dtype_name(run_dtype) == "float32" else "float32"


@torch.no_grad()
def reference_logits(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """(len(output), V) logits predicting each output token, by one teacher-forced forward."""
    ids = torch.tensor([prompt + output[:-1]], device=model.device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:]
    return logits.double()


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; the shorter length if one is a prefix; None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def classify(logits: torch.Tensor, output: list[int], plain_output: list[int] | None, run_dtype: str,
             half_reference: bool = False) -> dict:
    """Audit one turn from the reference logits over its own output (see the module docstring).
    ``plain_output`` is the matched plain turn's output when both had the same prompt, else None;
    ``half_reference``: the logits were computed in ``run_dtype`` itself (the tolerance doubles)."""
    tol = tolerance(run_dtype, logits, half_reference)
    best = logits.amax(-1)
    margins = best - logits[torch.arange(len(output)), torch.tensor(output)]
    off = torch.nonzero(margins > tol).flatten().tolist()
    record = {"tolerance_factor": tolerance_factor(run_dtype), "tolerance_measured": tolerance_measured(run_dtype),
              "half_reference": half_reference, "off_greedy": off,
              "max_margin_over_tol": float((margins / tol).max()) if len(output) else 0.0,
              "prompt_differs": plain_output is None, "first_divergence": None}
    if plain_output is not None:
        pos = first_difference(output, plain_output)
        if pos is None:
            return {**record, "status": "identical" if not off else "algorithmic"}
        record["first_divergence"] = pos
        if pos < min(len(output), len(plain_output)):
            plain_margin = float(best[pos] - logits[pos, plain_output[pos]])
            record.update(spec_token=output[pos], plain_token=plain_output[pos], spec_margin=float(margins[pos]),
                          plain_margin=plain_margin, tolerance=float(tol[pos]))
            if plain_margin > tol[pos]:
                off = sorted(set(off) | {pos})  # plain's own token is no near-tie: nothing explains the split
        else:  # one output is a prefix of the other: they stopped at different lengths
            off = sorted(set(off) | {pos}) if pos < len(output) else off
    return {**record, "off_greedy": off, "status": "algorithmic" if off else "numeric"}


# ---- over a results folder ------------------------------------------------------------------------

def audit_pairs(results: str | Path):
    """(rows file, spec rows, matched plain rows) for every greedy speculative config under ``results``."""
    from eagle2.results.frames import greedy_configs, load_rows

    for chash, g, base in greedy_configs(load_rows(results)):
        first = g.iloc[0]
        yield Path(results) / first.dataset / first.model / f"{first.method}-{chash}.jsonl", g, base


class ReferenceModels:
    """Loads each (model, reference dtype) once, from the model's config plus user overrides."""

    def __init__(self, overrides: list[str], reference_dtype: str = "auto"):
        if reference_dtype not in ("auto", "run"):
            raise ValueError(f"reference dtype {reference_dtype!r}: choose auto (float32/float64) or run")
        self.overrides, self.loaded, self.reference_dtype = overrides, {}, reference_dtype

    @property
    def half_reference(self) -> bool:
        return self.reference_dtype == "run"

    def dtype_for(self, run_dtype: str) -> str:
        return run_dtype if self.half_reference else reference_dtype(run_dtype)

    def get(self, model_name: str, run_dtype: str):
        key = (model_name, run_dtype)
        if key not in self.loaded:
            from hydra import compose, initialize_config_dir

            from eagle2.bench.models import load_target
            from eagle2.prompts.questions import PROJECT_ROOT

            with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
                cfg = compose("config", overrides=[f"model={model_name}", *self.overrides])
            cfg.model.dtype = self.dtype_for(run_dtype)
            self.loaded[key] = load_target(cfg.model)[0]
        return self.loaded[key]


def audit_config(models: ReferenceModels, rows_file: Path, spec, plain, redo: bool = False) -> list[dict]:
    """Audit every turn of one config not audited yet against this plain config; append the records."""
    from eagle2.results.identity_records import read_records, records_path

    path = records_path(rows_file)
    plain_hash = plain.config_hash.iloc[0] if not plain.empty else None
    done = set() if redo else {(r["question_id"], r["turn"]) for r in read_records(path)
                               if r.get("plain_config_hash") == plain_hash}
    by_turn = {(q, t): r for q, t, r in zip(plain.question_id, plain.turn, plain.to_dict("records"))}
    new = []
    for row in spec.to_dict("records"):
        key = (row["question_id"], row["turn"])
        ref_row = by_turn.get(key)
        if key in done or ref_row is None or not isinstance(row.get("prompt_ids"), list):
            continue  # no matched plain turn, or a row from before prompts were stored: stays unaudited
        run_dtype = row.get("dtype") or "float32"
        same_prompt = list(ref_row.get("prompt_ids") or []) == list(row["prompt_ids"])
        logits = reference_logits(models.get(row["model"], run_dtype), list(row["prompt_ids"]),
                                  list(row["output_ids"]))
        rec = classify(logits, list(row["output_ids"]), list(ref_row["output_ids"]) if same_prompt else None,
                       run_dtype, models.half_reference)
        rec.update(question_id=row["question_id"], turn=row["turn"], config_hash=row["config_hash"],
                   plain_config_hash=plain_hash, model=row["model"], dataset=row["dataset"],
                   method=row["method"], dtype=run_dtype, timestamp=time.time())
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        new.append(rec)
    return new


def audit_results(results: str | Path, overrides: list[str] | None = None, redo: bool = False,
                  reference: str = "auto", allow_unmeasured: bool = True) -> list[dict]:
    """Audit every greedy speculative turn under ``results``; return the new records. ``reference``:
    ``auto`` (float32, float64 for float32 runs) or ``run`` (the run's dtype, feasible at 70B).
    ``allow_unmeasured`` false refuses a dtype whose tolerance factor was never measured."""
    models = ReferenceModels(overrides or [], reference)
    new = []
    for rows_file, spec, plain in audit_pairs(results):
        for dtype in sorted({str(d) for d in spec.dtype.dropna()}) if "dtype" in spec else []:
            if not allow_unmeasured and not tolerance_measured(dtype):
                raise UnmeasuredToleranceError(
                    f"{rows_file}: the {dtype} tolerance factor is unmeasured. Measure it on a GPU "
                    f"({MEASURE_COMMAND.format(dtype=dtype)}) and pass --tolerance-factor {dtype}=X, "
                    "or pass --allow-unmeasured to borrow bfloat16's")
        new += audit_config(models, rows_file, spec, plain, redo)
    return new
