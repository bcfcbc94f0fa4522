"""Metrics computed from stored rows and per-node records, never from prints.

- tokens/s: decode tokens (tokens appended after the first, which prefill produces) over decode time;
- tau: decode tokens per target forward (bonus included); plain decoding has tau = 1;
- speedup: a method's tokens/s over plain decoding's on the SAME question turns, same model, dataset,
  temperature and machine; without a plain baseline there is no speedup (NaN, flagged). Plain decoding
  comes in two kinds, eager and compiled (the rows' ``compile``, ``eagle2.results.frames``): ``speedup`` is
  over plain of the config's own kind (``baseline`` names it), ``speedup_eager`` and ``speedup_compiled``
  over each (NaN where that plain has no rows) and ``speedup_fastest`` over the faster of the two (the baseline
  a speedup must beat on that machine); in a folder of one kind ``speedup`` is what it always was;
- time breakdown: draft forwards, verify forwards, everything else (bookkeeping), per round summed;
- per-position acceptance and calibration from the per-node records.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from eagle2.results.frames import (  # noqa: F401 (analysis's own names too)
    BASELINES,
    GROUP,
    baseline_rows,
    both_kinds,
    compiled,
    iter_rows,
    load_rows,
)
from eagle2.results.labels import ORACLE, _switched_on, config_settings, variant_labels  # noqa: F401 (same)
from eagle2.results.store import is_row
from eagle2.results.throughput import batch_throughput


def unreadable_lines(results: str | Path) -> list[str]:
    """``path:line`` of every non-blank line under ``results`` that is no row (a line torn by a kill or a
    full disk): the readers skip them, the report names them."""
    bad = []
    for path in sorted(Path(results).rglob("*.jsonl")):
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            if line.strip() and not is_row(line):
                bad.append(f"{path}:{number}")
    return bad


def load_nodes(results: str | Path) -> pd.DataFrame:
    files = sorted(Path(results).rglob("*.nodes/*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def _round_sum(rounds: dict, key: str) -> float:
    return float(sum(v for v in (rounds or {}).get(key, []) if v is not None))


def _round_mean(rounds_of_rows, key: str) -> float:
    """Mean of a per-round record over all rounds of all rows that record it (NaN if none do)."""
    values = [v for r in rounds_of_rows for v in (r or {}).get(key, []) if v is not None]
    return float(np.mean(values)) if values else np.nan


def method_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (model, dataset, method, temperature, config): tokens/s, tau, speedup, time shares;
    ``compiled`` (its kind), ``baseline`` (the plain ``speedup`` is over: ``eager`` or ``compiled``) and
    ``speedup_eager`` / ``speedup_compiled`` (over each plain, with ``..._turns`` the turns they share) and
    ``speedup_fastest`` (over the faster plain)."""
    out = []
    kinds = compiled(rows)
    for key, g in rows.groupby(GROUP, dropna=False):
        rec = dict(zip(GROUP, key))
        rec["dtype"] = g.dtype.iloc[0] if "dtype" in g else None  # in the hash: configs never mix dtypes
        rec.update(_aggregate(g))
        rec["speedup"], rec["baseline_turns"] = _speedup(g, baseline_rows(rows, g))
        rec["compiled"] = bool(kinds[g.index].iloc[0])  # in the hash too: a config is of one kind
        rec["baseline"] = BASELINES[rec["compiled"]]
        for kind in BASELINES:
            rec[f"speedup_{kind}"], rec[f"speedup_{kind}_turns"] = _speedup(g, baseline_rows(rows, g, kind))
        # over the faster of the two plains on these turns: the smaller of the two ratios
        ratios = [rec[f"speedup_{k}"] for k in BASELINES]
        rec["speedup_fastest"] = min((r for r in ratios if r == r), default=np.nan)
        out.append(rec)
    return pd.DataFrame(out)


def _aggregate(g: pd.DataFrame) -> dict:
    tokens, wall, forwards = g.decode_tokens.sum(), g.wall_time_s.sum(), g.target_forwards.sum()
    draft = sum(_round_sum(r, "draft_forward_s") for r in g.rounds)
    verify = sum(_round_sum(r, "verify_forward_s") for r in g.rounds)
    other = sum(_round_sum(r, "other_s") for r in g.rounds)
    total = draft + verify + other
    per_q = g.decode_tokens / g.wall_time_s
    return {"turns": len(g), "new_tokens": int(g.new_tokens.sum()), "tokens_per_s": tokens / wall if wall else np.nan,
            "tokens_per_s_std": float(per_q.std()) if len(g) > 1 else np.nan,
            "e2e_tokens_per_s": _end_to_end(g),
            "tau": tokens / forwards if forwards else np.nan,
            "draft_share": draft / total if total else np.nan, "verify_share": verify / total if total else np.nan,
            "other_share": other / total if total else np.nan,
            "ms_per_round": 1000 * total / forwards if forwards else np.nan,
            # EAGLE-2's verified nodes per round, and (total_tokens=auto) the cost model's expected
            # tokens per round, 1 + sum of the verified path values: beside tau, a calibration check
            "mean_budget": _round_mean(g.rounds, "budget"),
            "expected_tau": _round_mean(g.rounds, "expected_tokens"),
            "peak_memory_mb": float(g.peak_memory_mb.max()) if "peak_memory_mb" in g else np.nan,
            # batched decoding: all new tokens over the batch's wall span (eagle2.results.throughput); batch 1: e2e rate
            "batch_size": int(g.batch_size.max()) if "batch_size" in g and g.batch_size.notna().any() else 1,
            "throughput_tokens_per_s": batch_throughput(g.to_dict("records"))["throughput_tokens_per_s"]}


def _end_to_end(g: pd.DataFrame) -> float:
    """New tokens over prefill + decode time (the authors' rate); NaN for rows from before prefill was timed."""
    if "prefill_time_s" not in g or g.prefill_time_s.isna().any():
        return np.nan
    total = g.prefill_time_s.sum() + g.wall_time_s.sum()
    return float(g.new_tokens.sum() / total) if total else np.nan


BASELINE_KEYS = ("max_new_tokens", "seed", "dtype", "batch_size")  # besides model, dataset and temperature


def missing_baseline(rows: pd.DataFrame, g: pd.DataFrame) -> str:
    """Why config ``g`` has no speedup: the plain rows it would be compared with, named ('' when it has them)."""
    first = g.iloc[0]
    wanted = ", ".join(f"{k} {first[k]}" for k in BASELINE_KEYS if k in g and pd.notna(first.get(k)))
    what = f"plain rows of {first.model} on {first.dataset} at T={first.temperature:g}, {wanted}"
    base = baseline_rows(rows, g)
    if base.empty:
        return f"no {what}"
    if _speedup(g, base)[1] == 0:
        return f"the {what} share no question turn with it"
    return ""


def _speedup(g: pd.DataFrame, base: pd.DataFrame) -> tuple[float, int]:
    """tokens/s ratio on the question turns both have; NaN when there is no plain baseline."""
    if base.empty:
        return np.nan, 0
    keys = ["question_id", "turn"]
    common = g.merge(base, on=keys, suffixes=("", "_plain"))
    if common.empty:
        return np.nan, 0
    ours = common.decode_tokens.sum() / common.wall_time_s.sum()
    plain = common.decode_tokens_plain.sum() / common.wall_time_s_plain.sum()
    return ours / plain, len(common)


def per_position_acceptance(rows: pd.DataFrame, max_depth: int = 8) -> pd.DataFrame:
    """For each method: P(round accepts >= d drafts) and the conditional rate at depth d."""
    out = []
    for key, g in rows[rows.method != "plain"].groupby(GROUP, dropna=False):
        accepted = np.array([a - 1 for lengths in g.accept_lengths for a in lengths])
        if accepted.size == 0:
            continue
        for d in range(1, max_depth + 1):
            reach = (accepted >= d - 1).sum()
            out.append({**dict(zip(GROUP, key)), "depth": d, "p_at_least": float((accepted >= d).mean()),
                        "conditional": float((accepted >= d).sum() / reach) if reach else np.nan})
    return pd.DataFrame(out)


def _with_parent_accepted(nodes: pd.DataFrame) -> pd.DataFrame:
    """Verified nodes that were really tried: the parent was on the accepted path and, under sampling
    (temperature > 0, where siblings are tried in order and trying stops at the first accepted),
    no better-ranked sibling was accepted. At temperature 0 every child of an accepted parent is
    compared with the target's argmax, so all count."""
    verified = nodes[nodes.tree_index >= 0].copy()
    keys = ["config_hash", "question_id", "turn", "round"]
    acc = verified[verified.accepted][keys + ["tree_index"]].rename(columns={"tree_index": "parent_tree_index"})
    acc["parent_ok"] = True
    merged = verified.merge(acc, on=keys + ["parent_tree_index"], how="left")
    merged["parent_ok"] = merged["parent_ok"].fillna(False).astype(bool) | (merged.parent_tree_index == 0)
    tried = merged[merged.parent_ok]
    sampled = tried.temperature > 0
    if sampled.any():
        winner = tried[tried.accepted][keys + ["parent_tree_index", "rank"]].rename(columns={"rank": "won_rank"})
        tried = tried.merge(winner, on=keys + ["parent_tree_index"], how="left")
        late = (tried.temperature > 0) & tried.won_rank.notna() & (tried["rank"] > tried.won_rank)
        tried = tried[~late].drop(columns="won_rank")
    return tried


def calibration(nodes: pd.DataFrame, bins: int = 10, by_depth: bool = False) -> pd.DataFrame:
    """Confidence bins -> empirical acceptance (nodes whose parent was accepted), with counts. Nodes
    without a confidence (a hybrid tree's lookup nodes: NaN) are left out."""
    tried = _with_parent_accepted(nodes)
    tried = tried[tried.confidence.notna()].copy()
    edges = np.linspace(0, 1, bins + 1)
    tried["bin"] = np.clip(np.digitize(tried.confidence, edges) - 1, 0, bins - 1)
    keys = ["method", "bin"] + (["depth"] if by_depth else [])
    table = tried.groupby(keys).agg(confidence=("confidence", "mean"), acceptance=("accepted", "mean"),
                                    count=("accepted", "size")).reset_index()
    table["bin_low"], table["bin_high"] = edges[table.bin], edges[table.bin + 1]
    return table


def expected_calibration_error(nodes: pd.DataFrame, bins: int = 10) -> pd.Series:
    table = calibration(nodes, bins)
    def ece(g):
        return float((g["count"] * (g.confidence - g.acceptance).abs()).sum() / g["count"].sum())
    return table.groupby("method").apply(ece)


def acceptance_by_rank(nodes: pd.DataFrame) -> pd.DataFrame:
    tried = _with_parent_accepted(nodes)
    return tried.groupby(["method", "rank"]).agg(acceptance=("accepted", "mean"), count=("accepted", "size")
                                                 ).reset_index()


# --- harness additions: failures, per-config settings, tree-budget lines ---------------------------------

TREE_KEYS = ("total_tokens", "depth", "top_k")


def load_failures(results: str | Path) -> pd.DataFrame:
    """Failures still standing: cells that failed as a whole and question turns that failed.

    A cell failure (``question_id`` None) counts until an ok row of the same config is stored after it;
    a failed turn counts until that turn is stored ok. ``scope`` is 'cell' or 'turn'.
    """
    failed, ok_turns, last_ok = [], set(), {}
    for row in iter_rows(results):
        if row.get("status") == "ok":
            ok_turns.add((row.get("config_hash"), row.get("question_id"), row.get("turn")))
            chash = row.get("config_hash")
            last_ok[chash] = max(last_ok.get(chash, 0.0), row.get("timestamp") or 0.0)
        elif row.get("status") == "failed":
            failed.append(row)
    out = []
    for row in failed:
        cell = row.get("question_id") is None
        if cell and (row.get("timestamp") or 0.0) < last_ok.get(row.get("config_hash"), -1.0):
            continue
        if not cell and (row.get("config_hash"), row["question_id"], row.get("turn")) in ok_turns:
            continue
        out.append({**{k: row.get(k) for k in GROUP + ["question_id", "turn", "error", "timestamp"]},
                    "scope": "cell" if cell else "turn"})
    cols = GROUP + ["scope", "question_id", "turn", "error", "timestamp"]
    frame = pd.DataFrame(out, columns=cols)
    if frame.empty:
        return frame
    # a cell failed again and again is one standing failure: keep its latest error
    cells = frame[frame.scope == "cell"].sort_values("timestamp").drop_duplicates(GROUP, keep="last")
    return pd.concat([cells, frame[frame.scope == "turn"]], ignore_index=True)[cols]


def tree_budget_table(rows: pd.DataFrame) -> pd.DataFrame:
    """``method_table`` lines of EAGLE-2 configs with their tree settings (total_tokens, depth, top_k)."""
    e2 = rows[rows.method == "eagle2"] if not rows.empty else rows
    if e2.empty:
        return pd.DataFrame()
    table = method_table(rows)
    table = table[table.method == "eagle2"].copy()
    settings = config_settings(e2).set_index("config_hash")
    for key in TREE_KEYS:
        table[key] = table.config_hash.map(settings[key]) if key in settings else np.nan
    return table.reset_index(drop=True)


# --- oracle efficiency ----------------------------------------------------------------------------

def draft_depth(settings: dict) -> float:
    """The deepest draft a method config can propose: ``depth`` (EAGLE-2, oracle; with a lookup branch
    the longer of depth and lookup_k), ``k`` (SpS, PLD), the longest ``choices`` path (static trees);
    NaN when unknown (plain: 0)."""
    if settings.get("choices"):
        return float(max(len(c) for c in settings["choices"]))
    depth = settings.get("depth", settings.get("k"))
    if depth is None:
        return 0.0 if settings.get("name") == "plain" else np.nan
    if _switched_on(settings.get("lookup_branch")):
        return float(max(int(depth), int(settings.get("lookup_k") or depth)))
    return float(depth)


def oracle_efficiency(rows: pd.DataFrame) -> pd.DataFrame:
    """Each drafting config's tau as a share of the oracle's on the same question turns.

    The oracle (``method=oracle``, temperature 0) proposes what the target will emit: its tau is the
    ceiling of any drafter drafting at most as deep. Each config is matched with the oracle of the same
    model, dataset, temperature, dtype and max_new_tokens whose depth equals the config's
    ``draft_depth``, else the shallowest deeper one, else the deepest; ``oracle_depth`` says which."""
    rows = rows[rows.temperature == 0] if not rows.empty else rows  # at T > 0 the oracle is no ceiling
    if rows.empty or not (rows.method == ORACLE).any():
        return pd.DataFrame()
    depth = {r.config_hash: draft_depth(r.method_config if isinstance(r.method_config, dict) else {})
             for r in rows.drop_duplicates("config_hash").itertuples()}
    labels, out = variant_labels(rows), []
    keys = [k for k in ("model", "dataset", "temperature", "dtype", "max_new_tokens") if k in rows]
    for key, g in rows.groupby(keys, dropna=False):
        oracles = g[g.method == ORACLE]
        if oracles.empty:
            continue
        depths = sorted({depth[h] for h in oracles.config_hash})
        for chash, m in g[~g.method.isin(["plain", ORACLE])].groupby("config_hash"):
            want = depth[chash]
            deeper = [d for d in depths if d >= want]
            pick = want if want in depths else (deeper[0] if deeper else depths[-1])
            oracle = oracles[oracles.config_hash.map(depth) == pick]
            common = m.merge(oracle, on=["question_id", "turn"], suffixes=("", "_oracle"))
            if common.empty:
                continue
            tau = common.decode_tokens.sum() / common.target_forwards.sum()
            ceiling = common.decode_tokens_oracle.sum() / common.target_forwards_oracle.sum()
            out.append({**dict(zip(keys, key)), "method": m.method.iloc[0], "label": labels[chash],
                        "config_hash": chash, "draft_depth": want, "oracle_depth": pick, "turns": len(common),
                        "tau": tau, "oracle_tau": ceiling, "efficiency": tau / ceiling})
    return pd.DataFrame(out)


METHOD_COLUMNS = ["model", "dataset", "temperature", "label", "turns", "tokens_per_s", "speedup", "predicted", "tau",
                  "expected_tau", "mean_budget", "ms_per_round", "draft_ms", "verify_ms", "other_share"]


def with_cost_model(table: pd.DataFrame) -> pd.DataFrame:
    """``method_table`` plus the cost model's prediction, speedup ~ tau * T(1) / (T_draft + T_verify): per-round
    forward times from the rows, T(1) plain decoding's time per round (one target forward) on the same model,
    dataset and temperature (NaN without plain rows)."""
    table = table.copy()
    table["draft_ms"] = table.ms_per_round * table.draft_share
    table["verify_ms"] = table.ms_per_round * table.verify_share
    plain = table[table.method == "plain"].groupby(["model", "dataset", "temperature"]).ms_per_round.first()
    one = [plain.get(key, np.nan) for key in zip(table.model, table.dataset, table.temperature)]
    table["predicted"] = table.tau * one / (table.draft_ms + table.verify_ms)
    return table
