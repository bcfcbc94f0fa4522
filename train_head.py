"""Train an EAGLE head and an SpS draft model for a target by self-distillation, then evaluate them.

    python train_head.py                          # the full SmolLM2 recipe (conf/train/smollm2.yaml)
    python train_head.py train=tiny stage=all     # a one-minute smoke run
    python train_head.py stage=head               # one stage: corpus | head | draft | eval | all

Every stage resumes: the corpus shard by shard, training from ``<out_dir>/checkpoint.pt``. Artifacts go
to ``train.export.head`` / ``train.export.draft`` (for SmolLM2 ``model.head`` / ``model.sps_draft``).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

STAGES = ("corpus", "head", "draft", "eval")


@hydra.main(config_path="conf", config_name="train_head", version_base=None)
def main(cfg: DictConfig) -> None:
    import torch

    from eagle2.models import load_target
    from eagle2.training.evaluate import eval_stage
    from eagle2.training.train import corpus_stage, draft_stage, head_stage

    stages = STAGES if cfg.stage == "all" else (cfg.stage,)
    if any(s not in STAGES for s in stages):
        raise ValueError(f"unknown stage {cfg.stage!r}; choose one of {', '.join(STAGES)} or all")
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    root = Path(__file__).resolve().parent  # relative paths in the config are relative to the project
    target, tokenizer = load_target(cfg.model)
    if "corpus" in stages:
        print(f"[train_head] corpus: {corpus_stage(target, tokenizer, cfg.train.corpus, root)}", flush=True)
    if "head" in stages:
        print(f"[train_head] head exported to {head_stage(target, cfg, root)}", flush=True)
    if "draft" in stages:
        print(f"[train_head] SpS draft exported to {draft_stage(target, cfg, root)}", flush=True)
    if "eval" in stages:
        eval_stage(target, tokenizer, cfg, root)


if __name__ == "__main__":
    main()
