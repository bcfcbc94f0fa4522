"""The HASS objective (Zhang et al., ICLR 2025; ``train_head.py stage=hass``, settings ``train.hass``).

HASS trains the EAGLE-1 head (``eagle2.heads.eagle_head``, the published format: it decodes with EAGLE-2's
tree, ``method=hass``) with the EAGLE loss kept, feature regression included (``objectives.eagle.head_loss``),
and two additions. Harmonized context alignment: ``unroll`` steps (the authors: 3) in which step ``s`` reads,
at the chain's earlier positions, the head's own step ``s-1`` features instead of the target's, as decoding
does (``losses.unrolled_predictions``; ``detach_unroll``: each step's input without its gradient, as the
authors' code). Harmonized objective distillation: a second phase (``topk_phase``) continues the first with
``w_topk`` times the top-K loss ``-sum_{v in topK(p)} p_v log q_v`` added (the authors: K = 10, weight 1, a
third of the learning rate, a quarter of the epochs). Both phases start from ``init_from`` (the shipped EAGLE
head) and phase 2 from phase 1's head (written to ``<out_dir>/phase1_head``); the export is phase 2's.

In a joint run (``train.joint.heads: [..., hass]``) the HASS head trains phase 1 (``phase_settings(cfg, 1)``) under
the joint loop's settings; the top-k phase, a continuation at its own rate and length, is ``stage=hass``'s alone.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from omegaconf import OmegaConf

from eagle2.heads.hass_head import FAMILY
from eagle2.training.evaluation.heldout import validation
from eagle2.training.objectives import Member, Objective, exported
from eagle2.training.objectives.eagle import eagle_setup, evaluate_head, export_head, head_chain_of, train_head


def phase_settings(cfg, phase: int):
    """``train.hass`` for phase 1 (no top-k loss) or phase 2 (``topk_phase``'s settings on top)."""
    settings = OmegaConf.to_container(cfg, resolve=True)
    overrides = settings.pop("topk_phase", None) or {}
    return OmegaConf.create({**settings, "w_topk": 0.0} if phase == 1 else {**settings, **overrides})


def hass_setup(target, corpus_dir: str | Path, cfg):
    """(HASS head, its phase-1 loss, its fingerprint settings): what a joint run trains (``objectives.Member``)."""
    return eagle_setup(target, corpus_dir, phase_settings(cfg, 1))


export_hass = partial(export_head, family=FAMILY, export_key="hass_head")  # to train.export.hass_head


def train_hass(target, corpus_dir: str | Path, cfg, out_dir: str | Path, **kwargs):
    """Both phases (each resuming); returns (head, summary): phase 2's, or phase 1's when phase 2 has no steps
    or phase 1 stopped early (its summary then ``partial``)."""
    out_dir = Path(out_dir)
    head, summary = train_head(target, corpus_dir, phase_settings(cfg, 1), out_dir, **kwargs)
    second = phase_settings(cfg, 2)
    if summary["partial"] or not second.get("max_steps"):
        return head, summary
    second.init_from = str(FAMILY.save(head, out_dir / "phase1_head"))
    head, topk_summary = train_head(target, corpus_dir, second, out_dir / "topk", **kwargs)
    return head, {**topk_summary, "phase1": {k: v for k, v in summary.items() if k != "corpus_shards"}}


def hass_stage(target, tokenizer, cfg, root: Path) -> Path | None:
    """Train the HASS head (both phases, resuming) and export it to ``train.export.hass_head``."""
    c = cfg.train.hass
    head, summary = train_hass(target, root / cfg.train.corpus.out_dir, c, root / c.out_dir, stop_after=c.stop_after,
                               **validation(target, tokenizer, cfg, root, "hass", head_chain_of))
    return export_hass(head, summary, cfg, root, "hass") if exported(summary) else None


OBJECTIVE = Objective("hass", "HASS head", hass_stage, export_key="hass_head", family=FAMILY, evaluate=evaluate_head,
                      member=Member(hass_setup, export_hass, head_chain_of), weights=("init_from",))
