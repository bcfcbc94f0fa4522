"""The results store: one JSON row per question turn, appended and flushed as soon as it exists.

Layout under ``paths.results``: ``<dataset>/<model>/<method>-<hash>.jsonl``, where the hash covers
everything that changes the numbers (the target, the method's settings and drafter weights, dataset,
sampling, seed, token limit) and nothing that does not (limit, paths, logger, device, other methods'
knobs). Rerunning a config appends to the same file and
skips the (question_id, turn) pairs already finished; a different config never touches it. Per-node
draft records go beside it, one parquet file per turn in ``<method>-<hash>.nodes/``, written
atomically, so a killed run loses at most the turn it was in.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from omegaconf import OmegaConf

HASHED_KEYS = ("model", "method", "temperature", "top_p", "top_k", "seed", "max_new_tokens")
# what the target's outputs depend on; a drafter's own settings reach the hash through the resolved
# method config, and its weights through METHOD_ARTIFACTS (so a plain run's hash ignores drafter knobs)
TARGET_KEYS = ("name", "source", "hub_id", "dtype", "attn_implementation", "template", "system_prompt",
               "stop_tokens", "max_context")
METHOD_ARTIFACTS = {"sps": ("sps_draft",), "eagle": ("head",), "eagle2": ("head",)}


def config_hash(cfg) -> str:
    """Short hash of the settings that determine the outputs."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    picked = {k: resolved.get(k) for k in HASHED_KEYS}
    model = picked["model"]
    picked["model"] = {k: model.get(k) for k in TARGET_KEYS + METHOD_ARTIFACTS.get(cfg.method.name, ())}
    picked["dataset"] = {"name": cfg.dataset.name, "path": cfg.dataset.path}
    method = picked["method"] = dict(picked["method"])
    for where_not_what in ("profile_dir", "reprofile"):  # where the cost profile lives, not what is run
        method.pop(where_not_what, None)
    if str(method.get("total_tokens")) != "auto":
        method.pop("max_total_tokens", None)  # only auto budgets read it (and older hashes stay valid)
    blob = json.dumps(picked, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


class ResultStore:
    def __init__(self, root: str | os.PathLike, dataset: str, model: str, method: str, chash: str):
        self.folder = Path(root) / dataset / model
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rows_path = self.folder / f"{method}-{chash}.jsonl"
        self.nodes_dir = self.folder / f"{method}-{chash}.nodes"
        self.done: dict[tuple[int, int], dict] = {}
        if self.rows_path.exists():
            for line in self.rows_path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill: that turn is simply redone
                    continue
                if row.get("status") == "ok":
                    self.done[(row["question_id"], row["turn"])] = row

    def finished(self, question_id, turn: int) -> dict | None:
        return self.done.get((question_id, turn))

    def append(self, row: dict, nodes: dict | None = None) -> None:
        if nodes:
            self._write_nodes(row, nodes)
        with open(self.rows_path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if row.get("status") == "ok":
            self.done[(row["question_id"], row["turn"])] = row

    def _write_nodes(self, row: dict, nodes: dict) -> None:
        import pandas as pd

        self.nodes_dir.mkdir(exist_ok=True)
        frame = pd.DataFrame(nodes)
        for key in ("question_id", "turn", "dataset", "model", "method", "temperature", "config_hash"):
            frame[key] = row[key]
        path = self.nodes_dir / f"q{row['question_id']}_t{row['turn']}.parquet"
        tmp = path.with_suffix(".partial")
        frame.to_parquet(tmp, index=False)
        tmp.replace(path)
