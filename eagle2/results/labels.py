"""Readable names for stored configs: each config's method settings, the name a config is shown under
(``eagle2+lookup``, the oracle marked as a ceiling) and the label that tells apart configs of one method
(``eagle2 (total_tokens=8, depth=3)``; configs of one method and settings that ran with different drafter
weights, such as REST over two datastores, also by the weights: ``rest (rest_datastore 1a2b3c4d)``;
``eagle2 [compiled]`` / ``eagle2 [eager]`` when the rows hold both kinds of target forward,
``eagle2.results.frames.compiled``). Read from rows only; the report and the identity audit share them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from eagle2.results.frames import both_kinds, compiled


def config_settings(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per config_hash: its method settings (from ``method_config``), flattened, plus sampling."""
    if rows.empty:
        return pd.DataFrame(columns=["config_hash"])
    first = rows.drop_duplicates("config_hash")
    out = []
    for _, r in first.iterrows():
        settings = r.get("method_config") if isinstance(r.get("method_config"), dict) else {}
        out.append({"config_hash": r.config_hash, "method": r.method,
                    **{k: v for k, v in settings.items() if k != "name"},
                    **{f"sampling_{k}": r.get(k) for k in ("top_p", "top_k") if k in r},
                    **({"seed": r.get("seed")} if "seed" in r else {})})
    return pd.DataFrame(out)


ORACLE = "oracle"
ORACLE_NOTE = "ceiling, not a speed"  # the oracle runs the target to look ahead: its speed is no method's


def _switched_on(value) -> bool:
    """A boolean setting that is on (pandas turns a missing one into NaN and bools into numpy bools)."""
    return isinstance(value, (bool, np.bool_)) and bool(value)


def display_method(method: str, settings: dict) -> str:
    """The name a config is shown under: ``eagle2+lookup`` for EAGLE-2 with its lookup branch, the
    oracle marked as a ceiling, else the method's name."""
    if method == ORACLE:
        return f"{ORACLE} [{ORACLE_NOTE}]"
    if _switched_on(settings.get("lookup_branch")):
        return f"{method}+lookup"
    return str(method)


WEIGHTS_PREFIX = "weights:"  # a label column holding a drafter-weights fingerprint (rows' ``weights``)


def weights_settings(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per config_hash: ``weights:<model-config key>`` -> the first 8 characters of the content
    hash of those drafter weights (``hub`` for a hub id), from the rows' ``weights`` (none before it existed)."""
    out = []
    for _, r in rows.drop_duplicates("config_hash").iterrows():
        weights = r.get("weights") if isinstance(r.get("weights"), dict) else {}
        out.append({"config_hash": r.config_hash,
                    **{f"{WEIGHTS_PREFIX}{k}": (v[:8] if isinstance(v, str) else "hub") for k, v in weights.items()}})
    return pd.DataFrame(out, columns=["config_hash"] if not out else None)


def variant_labels(rows: pd.DataFrame) -> dict[str, str]:
    """config_hash -> a readable label: the method's display name (``display_method``), plus the method
    settings that vary between configs shown under that name (e.g. ``eagle2 (total_tokens=8, depth=3)``),
    plus the drafter weights when they vary there (``rest (rest_datastore 1a2b3c4d)``, for every weighted
    method), plus `` [compiled]`` or `` [eager]`` when ``rows`` hold both kinds; a folder of one kind whose
    configs share their weights keeps its labels."""
    settings = config_settings(rows)
    settings["method"] = [display_method(m, r.to_dict()) for m, (_, r) in zip(settings.method, settings.iterrows())]
    if not rows.empty:
        settings = settings.merge(weights_settings(rows), on="config_hash", how="left")
    labels = {}
    for method, g in settings.groupby("method", sort=False):
        varying = [c for c in g.columns if c not in ("config_hash", "method")
                   and not c.startswith("lookup") and g[c].astype(str).nunique(dropna=False) > 1]
        for _, r in g.iterrows():
            extra = ", ".join(f"{c[len(WEIGHTS_PREFIX):]} {r[c]}" if c.startswith(WEIGHTS_PREFIX)
                              else f"{c}={_plain_value(r[c])}" for c in varying)
            labels[r.config_hash] = f"{method} ({extra})" if extra else str(method)
    if both_kinds(rows):
        kind = dict(zip(rows.config_hash, compiled(rows)))
        labels = {h: f"{label} [{'compiled' if kind[h] else 'eager'}]" for h, label in labels.items()}
    return labels


def _plain_value(value):
    """8.0 -> 8 (pandas turns int settings into floats once another config lacks them); a static tree's
    choice paths -> ``<n> nodes, depth <d>``."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(p, (list, tuple)) for p in value):
        return f"{len(value)} nodes, depth {max(len(p) for p in value)}"
    return int(value) if isinstance(value, float) and value.is_integer() else value
