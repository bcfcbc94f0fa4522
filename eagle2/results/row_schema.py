"""The result row: its field names and types, said once.

Every finished question turn is one JSON row with exactly these fields (public interface: analysis,
reports and users' scripts read them by name); the runner checks each row it builds against this
schema before storing it, so a field renamed or dropped fails at the first write, not in a report.
Failed rows (``status: failed``) carry the identifying fields, ``error`` and what the failure adds.
"""

from __future__ import annotations

NUMBER = (int, float)
OPTIONAL_NUMBER = (int, float, type(None))

ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "question_id": (int, str), "turn": (int,), "category": (str, type(None)),
    "dataset": (str,), "model": (str,), "method": (str,), "config_hash": (str,), "dtype": (str,),
    "temperature": NUMBER, "top_p": NUMBER, "top_k": (int,), "seed": (int,), "max_new_tokens": (int,),
    "ignore_eos": (bool,),  # decoded past the stop tokens to max_new_tokens (config ignore_eos)
    "status": (str,), "error": (str, type(None)),
    "prompt_tokens": (int,), "prompt_ids": (list,), "new_tokens": (int,), "output_ids": (list,),
    "output_text": (str,), "accept_lengths": (list,), "target_forwards": (int,),
    "wall_time_s": NUMBER, "prefill_time_s": NUMBER, "tokens_per_s": OPTIONAL_NUMBER, "tau": OPTIONAL_NUMBER,
    # new_tokens / (prefill + decode time): the authors' rate (tokens_per_s: decode only)
    "e2e_tokens_per_s": OPTIONAL_NUMBER,
    "rounds": (dict,),  # per-round facts, column-wise: eagle2.core.engine.RoundStats fields + drafter facts
    # this config's peak: GPU memory allocated, summed over every GPU (CUDA), else the process's max RSS
    "peak_memory_mb": OPTIONAL_NUMBER,
    "gpu": (dict, type(None)),  # {names, driver, cuda, torch} of a CUDA run (eagle2.bench.gpu_facts); None on a CPU
    "method_config": (dict,),
    "authors_budget": (dict,),  # the tree budget as the EAGLE authors count it ({total_token, depth, top_k} or {})
    "weights": (dict,),  # drafter weights by model-config key -> content hash of the local files (None: hub id)
    "cpu_kind": (str,),  # the host CPU: bf16-native (AVX512-BF16 / AMX), avx2 or unknown (core.cpu.cpu_kind)
    # where the target's weights are: its device, or modules per GPU when spread (eagle2.bench.placement.summary)
    "placement": (str,),
    "kernels": (str,),  # the target's linears: packed (oneDNN, bf16-native CPUs) or stock; +short_attn; +compile
    "compile": (str,),  # engine.compile: true, false, or auto:true / auto:false (what auto chose; bench.compile_choice)
    "compile_s": OPTIONAL_NUMBER,  # seconds compiling the target's forward before any timed section (None: eager)
    "batch_size": (int,),  # requests decoded together (1: the batch-1 engine)
    "batch_id": (int, type(None)),  # the same for rows decoded together (None at batch 1)
    "batch_slot": (int, type(None)),  # the row of the batch this turn was decoded in
    # batched: whether rows that could drafted together (one draft-head forward per depth; None at batch 1)
    "batch_drafting": (bool, type(None)),
    # the batch's decode wall time (continuous batching: this row's span in flight)
    "batch_wall_time_s": OPTIONAL_NUMBER,
    "batch_admitted_at": OPTIONAL_NUMBER,  # seconds from the batch run's start to this turn's admission (its prefill)
    "batch_retired_at": OPTIONAL_NUMBER,  # seconds from the batch run's start to this turn leaving its row
    "batch_run_start": OPTIONAL_NUMBER,  # Unix time the batch run started (spans of separate runs never overlap)
    # the cost profile an auto budget or method.policy=pays priced with: {key, t1_s, noise, cached}
    # (eagle2.bench.profile_checks)
    "cost_profile": (dict, type(None)),
    # experiment=serving (eagle2.bench.serving_run): this request's times (arrival_s, admitted_s, first_token_s,
    # finished_s, ttft_s, tpot_s, e2e_s) and its rate's (rate_fraction, rate_rps, saturated_rps, seed); else None
    "serving": (dict, type(None)),
    "timestamp": NUMBER,
}
FAILED_ROW_FIELDS = ("question_id", "turn", "dataset", "model", "method", "temperature", "seed", "dtype",
                     "config_hash", "status", "error", "timestamp")


class RowSchemaError(ValueError):
    """A row that does not match the schema: a bug in whoever built it."""


def check_row(row: dict) -> None:
    """Raise ``RowSchemaError`` unless ``row`` is a finished row with exactly ``ROW_FIELDS``, or a
    failed row with at least ``FAILED_ROW_FIELDS``."""
    if row.get("status") != "ok":
        missing = [k for k in FAILED_ROW_FIELDS if k not in row]
        if missing:
            raise RowSchemaError(f"failed row lacks {missing}")
        return
    missing, extra = sorted(set(ROW_FIELDS) - set(row)), sorted(set(row) - set(ROW_FIELDS))
    if missing or extra:
        raise RowSchemaError(f"row fields differ from eagle2/results/row_schema.py: missing {missing}, "
                             f"unexpected {extra}")
    wrong = [f"{k}={type(row[k]).__name__}" for k, types in ROW_FIELDS.items()
             if not isinstance(row[k], types) or (types == (int,) and isinstance(row[k], bool))]
    if wrong:
        raise RowSchemaError(f"row fields of the wrong type: {', '.join(wrong)}")
