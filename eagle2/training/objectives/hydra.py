"""The Hydra objective (``train_head.py stage=hydra``): Hydra heads (``eagle2.heads.hydra_heads``) trained by
the Medusa objective (``eagle2.training.objectives.medusa``): same corpus, loss, steps and evaluation; only the
heads differ.

Head k at position t reads ``f[t]`` and the true tokens t+1 .. t+k+1 (teacher forcing: on the true
path drafting reads exactly these) and is fitted, as Medusa's head k, to the target's own distribution
at t+k+1. The settings are ``train.medusa``'s with ``train.hydra``'s on top (its own ``out_dir``,
``export`` and ``rank``), so the two kinds train on equal data for equal steps unless told otherwise.
``train_head.py stage=hydra`` trains, exports and evaluates them (``medusa_stage`` with ``HYDRA``).
"""

from __future__ import annotations

import torch

from eagle2.heads.hydra_heads import FAMILY, HydraHeads
from eagle2.training.objectives import Objective
from eagle2.training.objectives.medusa import HeadsKind, medusa_stage


def new_hydra_heads(target, cfg) -> tuple[HydraHeads, dict]:
    """Fresh fp32 heads (first blocks at zero: the identity on f) reading the target's embedding and,
    unless ``own_lm_head``, its frozen LM head; and the settings that go into the run's fingerprint."""
    lm = target.get_output_embeddings()
    rank = cfg.get("rank") or None
    rank = list(rank) if rank is not None and not isinstance(rank, int) else rank  # a list: one per head
    heads = HydraHeads(cfg.num_heads, cfg.num_layers, target.config.hidden_size,
                       lm.weight.shape[0] if cfg.own_lm_head else None, rank)
    if cfg.own_lm_head:
        with torch.no_grad():
            for k in range(cfg.num_heads):
                heads.lm_head(k).weight.copy_(lm.weight)
    else:
        heads.attach_lm_head(lm)
    heads.attach_embedding(target.get_input_embeddings())
    return heads.to(target.device, torch.float32), {"kind": "hydra", "rank": rank}


def hydra_settings(train):
    """``train.medusa`` with ``train.hydra`` on top (both resolved: a plain config, keys of either allowed)."""
    from omegaconf import OmegaConf

    def plain(section):
        return OmegaConf.create(OmegaConf.to_container(section, resolve=True) if section is not None else {})

    return OmegaConf.merge(plain(train.medusa), plain(train.get("hydra")))


HYDRA = HeadsKind("hydra", hydra_settings, "hydra_choices", new_hydra_heads, FAMILY)
OBJECTIVE = Objective("hydra", "Hydra heads", lambda target, tokenizer, cfg, root: medusa_stage(
    target, tokenizer, cfg, root, HYDRA), corpus_key="medusa.corpus_dir", data_parallel=False)
