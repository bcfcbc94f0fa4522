"""The four-method CPU table: plain, sps, eagle, eagle2 (and eagle2 with the cost-model budget,
``eagle2_auto``) on SmolLM2, side by side in one run, at one or more temperatures; also any other method
by name (``pld``, ``medusa``, ...), ``eagle2_lookup`` (EAGLE-2 with its lookup branch) and the oracle
(``oracle`` or ``oracleN``, depth N: list it after plain, whose temperature-0 rows it reads from the same
results folder; its tau is the ceiling, its speed is no method's).

Each (method, dataset, temperature) cell is an ordinary run through ``eagle2.bench.runner`` (so rows resume), then the
table is computed from the stored rows by ``analysis.metrics``: tokens/s, speedup over plain on the
same turns, tau, where round time goes (draft forwards, verify forwards, everything else), and the
cost-model prediction speedup ~ tau * T(1) / (T_draft + T_verify) beside the measured speedup.

``oracle_eff``: tau over the oracle's on the same turns, the oracle of the config's draft depth (else
the nearest deeper one) when the run has oracles (``analysis.metrics.oracle_efficiency``).

For ``eagle2_auto`` rows, ``mean_budget`` is the mean number of nodes it chose to verify and
``expected_tau`` the cost model's own estimate of tau (1 + the verified path values, per round).

Run: ``python -m experiments.four_methods --results results/four_methods [--limit 10]
[--temperatures 0,1] [overrides...]``
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from hydra import compose, initialize_config_dir

from analysis.metrics import ORACLE_NOTE, load_rows, method_table, oracle_efficiency
from eagle2.bench.results import config_hash
from eagle2.bench.runner import run

CONF = Path(__file__).resolve().parents[1] / "conf"
VARIANTS = {"eagle2_auto": ["method=eagle2", "method.total_tokens=auto"],  # name -> overrides
            "eagle2_fixed8": ["method=eagle2", "method.total_tokens=8"],
            "eagle2_lookup": ["method=eagle2", "method.lookup_branch=true"]}


def method_overrides(method: str) -> list[str]:
    """The Hydra overrides of a method name given here: a VARIANT, ``oracleN`` (the oracle at depth N),
    or a method config's name."""
    if method in VARIANTS:
        return VARIANTS[method]
    oracle = re.fullmatch(r"oracle(\d+)", method)
    return ["method=oracle", f"method.depth={oracle.group(1)}"] if oracle else [f"method={method}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default="results/four_methods")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--datasets", default="mt_bench,gsm8k")
    ap.add_argument("--methods", default="plain,sps,eagle,eagle2")
    ap.add_argument("--temperatures", default="0")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. model.eagle2.total_tokens=16")
    args = ap.parse_args()
    names = {}  # config hash -> the method name given here
    for temperature in args.temperatures.split(","):
        for dataset in args.datasets.split(","):
            for method in args.methods.split(","):
                with initialize_config_dir(str(CONF), version_base="1.3"):
                    cfg = compose("config", overrides=[
                        *method_overrides(method), f"dataset={dataset}",
                        f"dataset.limit={args.limit}", f"temperature={temperature}",
                        f"max_new_tokens={args.max_new_tokens}", f"paths.results={args.results}", "logger=none",
                        *args.overrides])
                names[config_hash(cfg)] = method
                run(cfg)
    rows = load_rows(args.results)
    rows = rows[rows.config_hash.isin(names)]  # this run's cells only
    table = cost_model(method_table(rows))
    table["method"] = [f"{names[h]} [{ORACLE_NOTE}]" if m == "oracle" else names[h]
                       for h, m in zip(table.config_hash, table.method)]
    efficiency = oracle_efficiency(rows)
    table["oracle_eff"] = table.config_hash.map(efficiency.set_index("config_hash").efficiency
                                                if not efficiency.empty else {})
    cols = ["dataset", "temperature", "method", "turns", "tokens_per_s", "speedup", "predicted", "tau", "oracle_eff",
            "expected_tau", "mean_budget", "ms_per_round", "draft_ms", "verify_ms", "other_share"]
    order = {h: names_order(args.methods).get(m, 99) for h, m in names.items()}
    table = table.sort_values(["dataset", "temperature", "config_hash"],
                              key=lambda c: c.map(order) if c.name == "config_hash" else c)
    print(table[cols].to_markdown(index=False, floatfmt=".3f"))
    print(greedy_identity(rows.assign(method=rows.config_hash.map(names))))


def names_order(methods: str) -> dict[str, int]:
    return {m: i for i, m in enumerate(methods.split(","))}


def greedy_identity(rows) -> str:
    """At temperature 0 every method must reproduce plain decoding's output_ids turn by turn."""
    greedy = rows[rows.temperature == 0]
    plain = greedy[greedy.method == "plain"].set_index(["dataset", "question_id", "turn"]).output_ids
    lines = []
    for method, g in greedy[greedy.method != "plain"].groupby("method"):
        pairs = [(ids, plain.get(key)) for key, ids in zip(zip(g.dataset, g.question_id, g.turn), g.output_ids)]
        pairs = [(ids, ref) for ids, ref in pairs if ref is not None]
        same = sum(list(ids) == list(ref) for ids, ref in pairs)
        lines.append(f"greedy identity {method} vs plain: {same}/{len(pairs)} turns token-identical"
                     + ("" if pairs else " (no plain turns to compare with)"))
    return "\n".join(lines)


def cost_model(table):
    """Add the cost-model prediction speedup ~ tau * T(1) / (T_draft + T_verify): per-round forward
    times from the rows, T(1) = plain decoding's time per round (one target forward) on that dataset."""
    table = table.copy()
    table["draft_ms"] = table.ms_per_round * table.draft_share
    table["verify_ms"] = table.ms_per_round * table.verify_share
    plain = table[table.method == "plain"].set_index(["dataset", "temperature"]).ms_per_round
    t1 = [plain.get((d, t)) for d, t in zip(table.dataset, table.temperature)]
    table["predicted"] = [tau * one / (dm + vm) if one else float("nan")
                          for tau, one, dm, vm in zip(table.tau, t1, table.draft_ms, table.verify_ms)]
    return table


if __name__ == "__main__":
    main()
