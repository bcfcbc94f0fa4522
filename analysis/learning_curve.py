"""Learning curves of head training: held-out top-1 (and chain tau where recorded) against steps and
against tokens trained, from the trainers' ``metrics.jsonl`` validation rows; for the head cards.

    python -m analysis.learning_curve RUN_DIR_OR_METRICS [...] --out curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def validation_rows(source: str | Path) -> list[dict]:
    """The ``split: val`` rows of a run's ``metrics.jsonl`` (a run folder or the file itself)."""
    path = Path(source)
    path = path / "metrics.jsonl" if path.is_dir() else path
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == "val"]


def plot_curves(runs: dict[str, list[dict]], out: str | Path, key: str = "top1") -> Path:
    """One line per run: ``key`` against the step (left) and the tokens trained (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for name, rows in runs.items():
        rows = [r for r in rows if key in r]
        axes[0].plot([r["step"] for r in rows], [r[key] for r in rows], marker="o", label=name)
        if all("tokens_trained" in r for r in rows):
            axes[1].plot([r["tokens_trained"] / 1e6 for r in rows], [r[key] for r in rows], marker="o", label=name)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("tokens trained (M)")
    axes[0].set_ylabel(f"held-out {key}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (with metrics.jsonl) or metrics.jsonl files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--key", default="top1")
    args = ap.parse_args()
    runs = {str(r): validation_rows(r) for r in args.runs}
    out = plot_curves(runs, args.out, args.key)
    print(f"[learning_curve] {sum(len(v) for v in runs.values())} validations -> {out}")


if __name__ == "__main__":
    main()
