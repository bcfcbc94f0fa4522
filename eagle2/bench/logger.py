"""Experiment logging: Weights & Biases (offline by default, never asks for a key) or nothing; where
wandb is not installed (a bare GPU node) the logger falls back to ``none`` with one line.

Per turn it logs the row's scalar metrics; at the end the run summary. The results store, not the
logger, is the source of truth for every figure.
"""

from __future__ import annotations

import logging
import os

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)
SCALARS = ("new_tokens", "wall_time_s", "prefill_time_s", "target_forwards", "tokens_per_s", "e2e_tokens_per_s", "tau")


class NullLogger:
    def log_row(self, row: dict) -> None:
        pass

    def finish(self, summary: dict) -> None:
        pass


class WandbLogger(NullLogger):
    def __init__(self, cfg: DictConfig, chash: str):
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        os.makedirs(cfg.logger.dir, exist_ok=True)
        self.wandb = wandb
        self.run = wandb.init(project=cfg.logger.project, mode=cfg.logger.mode, dir=str(cfg.logger.dir),
                              name=f"{cfg.model.name}-{cfg.method.name}-{cfg.dataset.name}-{chash}",
                              config=OmegaConf.to_container(cfg, resolve=True), reinit="finish_previous")

    def log_row(self, row: dict) -> None:
        self.run.log({k: row[k] for k in SCALARS if row.get(k) is not None})

    def finish(self, summary: dict) -> None:
        self.run.summary.update({k: v for k, v in summary.items() if v is not None})
        self.run.finish()


def make_logger(cfg: DictConfig, chash: str):
    if cfg.logger.get("enabled") and cfg.logger.name == "wandb":
        try:
            import wandb  # noqa: F401  (absent on a bare GPU node)
        except ImportError as exc:
            log.warning("wandb cannot be imported (%s): logging to none (rows still go to the results store; "
                        "logger=none silences this line)", exc)
            return NullLogger()
        return WandbLogger(cfg, chash)
    return NullLogger()
