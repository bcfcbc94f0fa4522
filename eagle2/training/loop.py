"""The training loop shared by EAGLE heads and SpS draft models, with exact checkpoint/resume.

AdamW, warmup + cosine LR, batches under a token budget (``data.make_batches``: a fixed order per
epoch drawn from the seed), gradient clipping, and one checkpoint file (``checkpoint.pt``: weights,
optimizer, scheduler, position in the data, RNG) replaced atomically every ``checkpoint_every`` steps
and at every epoch end. A rerun with the same ``out_dir`` resumes from it and reproduces an
uninterrupted run; ``metrics.jsonl`` is cut back to the checkpoint's step so no step is logged twice, and a
validation step whose checkpoint was written but whose validation was killed is validated first.

Several processes (``torchrun``, ``eagle2.training.support.distributed``): each step takes the next ``world_size``
batches of the epoch's plan, rank r the r-th (``step_groups``), so the global batch of a step is their
union and one process trains on the same batches in the same order; gradients are all-reduced
(position-weighted, exactly the union batch's gradient) before clipping, so every rank applies the same
update. Rank 0 alone writes the checkpoint (with every rank's RNG) and ``metrics.jsonl``; a checkpoint
resumes only with the world size it was written with. One process is the world size 1 and unchanged.

A fresh clone has no ``checkpoint.pt`` (it is GBs of optimizer state for large heads, and never committed).
With ``cfg.resume_dir`` set, every checkpoint also writes a small committed-size state there
(``trainable.safetensors``: the trained weights in bf16; ``resume.json``: fingerprint, position, tokens,
curve, the weights' digest; ``metrics.jsonl.gz``: the metrics rows): a run that finds no checkpoint but that
state continues from it at the same step, epoch and batch (a warm resume: the weights are bf16-rounded and
AdamW's moments start again). A state promoted into the heads the run starts from commits ``resume.json`` and
the rows alone (``warm_state``).

The best checkpoint (``cfg.best_by``: last | top1 | tau | loss; ``eagle2.training.best``): a finished run ends
with the best validation's weights in the module (what the export writes; the summary's ``best`` says which).

Precision (``cfg.autocast``: auto | bf16 | off): the training forward (and so its backward) runs under
bf16 autocast where the CPU multiplies bf16 natively (``auto``), fp32 master weights and optimizer
state; validation always runs in fp32. Train rows record ``tok_s``, ``cpu_kind``, ``autocast``, ``threads``,
``world_size`` and ``tokens_per_step`` (the real tokens of the step over all ranks).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from eagle2.core.cpu import cpu_kind
from eagle2.training.best import BestCheckpoint, curve_flat
from eagle2.training.data import Sequence, ShardedSequences, collate, epoch_batches, sequence_lengths
from eagle2.training.support import distributed
from eagle2.training.support.losses import evaluate_loss
from eagle2.training.support.models import trainable_state
from eagle2.training.support.precision import autocast_dtype
from eagle2.training.support.stop_request import StopRequest
from eagle2.training.support.warm_state import load_warm_weights, read_warm_state, warm_rows, write_warm_state


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_steps(warmup: float, total: int) -> int:
    """``warmup`` is a fraction of ``total`` when < 1, else a step count; at least one step."""
    return max(1, int(warmup * total) if warmup < 1 else int(warmup))




def save_checkpoint(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def step_groups(batches: list[list[int]], world_size: int) -> list[list[list[int]]]:
    """The steps of an epoch: ``world_size`` consecutive batches each (rank r trains on the r-th; the last
    step may have fewer, and a rank without a batch then contributes nothing)."""
    return [batches[i:i + world_size] for i in range(0, len(batches), world_size)]


class WorldSizeMismatch(ValueError):
    """A checkpoint written by another number of processes: resuming would change the batches of every step."""


class NullLog:
    """The metrics log of ranks other than 0: writes nothing."""

    validated: frozenset = frozenset()

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


class MetricsLog:
    """``metrics.jsonl``, holding exactly the steps up to ``upto_step``: lines of later steps (a run that
    was killed between checkpoints) are dropped, since those steps are redone."""

    def __init__(self, path: Path, upto_step: int):
        kept = [json.loads(line) for line in (path.read_text().splitlines() if path.exists() else []) if line.strip()]
        kept = [row for row in kept if row["step"] <= upto_step]
        path.write_text("".join(json.dumps(row) + "\n" for row in kept))
        self.validated = {row["step"] for row in kept if row.get("split") == "val"}
        self.file = path.open("a")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class Trainer:
    """One training run of ``module``: its optimizer, schedule, batch plan, RNG and position (step,
    epoch, batch), which is what the checkpoint stores."""

    def __init__(self, module: torch.nn.Module, loss_fn: Callable, train_seqs: list[Sequence],
                 val_seqs: list[Sequence], cfg, out_dir: str | Path, *, desc: str, fingerprint_extra: dict,
                 val_extra: Callable[[torch.nn.Module], dict] | None = None,
                 featurize: Callable[[dict], dict] | None = None):
        self.module, self.loss_fn, self.cfg, self.desc = module, loss_fn, cfg, desc
        self.featurize = featurize  # fills a batch's features (``online.OnlineFeatures``); None: they are stored
        self.train_seqs, self.val_seqs = train_seqs, val_seqs
        self.val_extra = val_extra  # more held-out measures of the module at each validation (chain tau)
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt = self.out / "checkpoint.pt"
        self.device = next(module.parameters()).device
        self.autocast = autocast_dtype(cfg.get("autocast", "auto"), self.device)
        self.speed_info = {"cpu_kind": cpu_kind() if self.device.type == "cpu" else self.device.type,
                           "autocast": "off" if self.autocast is None else "bf16", "threads": torch.get_num_threads()}
        self.params = [p for p in module.parameters() if p.requires_grad]
        # fused: one kernel per step for all parameters (CPU and CUDA), fewer passes than foreach
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
                                     fused=self.device.type in ("cpu", "cuda"))
        self.world, self.rank = distributed.world_size(), distributed.rank()
        lengths = sequence_lengths(train_seqs)
        self.plan = [step_groups(epoch_batches(train_seqs, lengths, cfg, e), self.world) for e in range(cfg.epochs)]
        # each rank its own noise (rank 0 the one-process stream)
        self.gen = torch.Generator(device=self.device).manual_seed(cfg.seed + 7919 * self.rank)
        self.fingerprint = {"sequences": len(train_seqs), "token_budget": cfg.token_budget, "seed": cfg.seed,
                            "lr": cfg.lr, **fingerprint_extra}
        self.use_plan(self.plan)
        if self.world > 1:  # (only then: one-process checkpoints written before it still resume)
            self.fingerprint["world_size"] = self.world
        if isinstance(train_seqs, ShardedSequences):  # streamed shards: another batch order
            self.fingerprint["resident_shards"] = train_seqs.resident
        self.step = self.epoch = self.batch_idx = 0
        self.tokens_trained = 0  # real (unpadded) tokens of every step so far, across resumes
        self.corpus_tokens = sum(lengths)  # one pass over the corpus
        self.best = BestCheckpoint(cfg.get("best_by"), self.out)  # ``best.pt`` (``best_by``)
        self.curve: list[float] = []  # held-out top-1 (or the best_by measure) at each validation: the flat stop
        self.validated_at = -1
        self.saved_at = 0
        self.log: MetricsLog | None = None
        self.stop = StopRequest()  # kill -TERM: stop at the next step boundary, checkpoint written

    def use_plan(self, plan: list[list[list[list[int]]]]) -> None:
        """Train on ``plan`` (per epoch, its steps; per step, one batch of sequence indices per rank): the
        step count, the LR schedule and the fingerprint follow it."""
        self.plan = plan
        self.total = sum(len(p) for p in plan)
        if self.cfg.max_steps:
            self.total = min(self.total, int(self.cfg.max_steps))
        self.opt.param_groups[0].setdefault("initial_lr", self.cfg.lr)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, partial(lr_factor, warmup=warmup_steps(self.cfg.warmup, self.total), total=self.total,
                              min_ratio=self.cfg.min_lr_ratio))
        self.fingerprint = {"total_steps": self.total, **self.fingerprint}

    # ------------------------------------------------------------------------------ checkpoint
    def resume(self) -> None:
        """Continue from ``checkpoint.pt`` if there is one (written by the same run), else from the
        committed ``cfg.resume_dir`` state if there is one."""
        if not self.ckpt.exists():
            self.resume_warm()
            return
        state = torch.load(self.ckpt, map_location=self.device, weights_only=True)
        written = int(state["fingerprint"].get("world_size", 1))
        if written != self.world:
            raise WorldSizeMismatch(
                f"{self.ckpt} was written by {written} process(es) and this run has {self.world}: resume with "
                f"torchrun --nproc_per_node {written} (python train_head.py for 1), or use another out_dir")
        if state["fingerprint"] != self.fingerprint:
            raise ValueError(f"{self.ckpt} was written by a different run ({state['fingerprint']} vs "
                             f"{self.fingerprint}); use another out_dir or delete it")
        self.module.load_state_dict(state["model"], strict=False)
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        noise_rng, torch_rng = state["rank_rng"][self.rank] if "rank_rng" in state else (
            state["noise_rng"], state["torch_rng"])
        self.gen.set_state(noise_rng.cpu())
        torch.set_rng_state(torch_rng.cpu())
        self.step, self.epoch, self.batch_idx = state["step"], state["epoch"], state["batch"]
        self.tokens_trained, self.curve = int(state.get("tokens_trained", 0)), list(state.get("curve", []))
        self.best.best = state.get("best")
        self.saved_at = self.step
        if distributed.is_main():
            tqdm.write(f"[{self.desc}] resumed from {self.ckpt} at step {self.step}/{self.total}")

    def resume_warm(self) -> None:
        """Continue from ``cfg.resume_dir`` (module docstring), when it holds this run's state."""
        folder = self.cfg.get("resume_dir")
        state = read_warm_state(folder)
        if state is None:
            return
        state_path = Path(folder) / "resume.json"
        if state["fingerprint"] != json.loads(json.dumps(self.fingerprint)):
            raise ValueError(f"{state_path} was written by a different run ({state['fingerprint']} vs "
                             f"{self.fingerprint}); set resume_dir to another folder or delete it")
        load_warm_weights(folder, self.module, state)
        self.step, self.epoch, self.batch_idx = state["step"], state["epoch"], state["batch"]
        self.tokens_trained, self.curve = state["tokens_trained"], list(state["curve"])
        self.sched.last_epoch = self.step - 1  # the LR schedule continues where it was
        self.sched.step()
        self.gen.manual_seed(int(self.cfg.seed) + 7919 * self.step + 104729 * self.rank)  # (rank 0: as one process)
        self.saved_at = self.step
        if not distributed.is_main():
            return
        (self.out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in warm_rows(folder, state)))
        tqdm.write(f"[{self.desc}] warm-resumed from {folder} at step {self.step}/{self.total} "
                   "(fresh optimizer moments)")

    def save_warm(self) -> None:
        """Write the committed-size state to ``cfg.resume_dir`` (when set), atomically per file."""
        folder = self.cfg.get("resume_dir")
        if not folder:
            return
        metrics = self.out / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        rows = [json.loads(line) for line in lines if line.strip()]
        write_warm_state(folder, self.module, {
            "fingerprint": self.fingerprint, "step": self.step, "epoch": self.epoch, "batch": self.batch_idx,
            "tokens_trained": self.tokens_trained, "curve": self.curve}, rows)

    def save(self) -> None:
        """Write ``checkpoint.pt`` (rank 0; every rank's RNG gathered into it when there are several)."""
        rngs = distributed.all_gather_objects((self.gen.get_state(), torch.get_rng_state())) if self.world > 1 else None
        self.saved_at = self.step
        if not distributed.is_main():
            return
        self.save_warm()
        save_checkpoint(self.ckpt, {
            **({"rank_rng": rngs} if rngs else {}),
            "model": trainable_state(self.module), "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(), "step": self.step, "epoch": self.epoch, "batch": self.batch_idx,
            "noise_rng": self.gen.get_state(), "torch_rng": torch.get_rng_state(), "fingerprint": self.fingerprint,
            "tokens_trained": self.tokens_trained, "curve": self.curve,
            **({"best": self.best.best} if self.best.best else {})})

    # ---------------------------------------------------------------------------------- steps
    def validate(self) -> dict:
        stats = evaluate_loss(self.module, self.loss_fn, self.val_seqs, token_budget=self.cfg.token_budget,
                              max_batch=self.cfg.max_batch, max_sequences=self.cfg.val_max_sequences,
                              device=self.device, featurize=self.featurize)
        if stats and self.val_extra is not None:
            was_training = self.module.training
            stats |= self.val_extra(self.module.eval())
            self.module.train(was_training)
        self.last_val = stats
        if stats:
            passes = self.tokens_trained / max(self.corpus_tokens, 1)
            progress = {"tokens_trained": self.tokens_trained, "passes": passes}
            self.log.write({"step": self.step, "epoch": self.epoch, "split": "val", **progress, **stats})
            if "top1" in stats:
                self.curve.append(self.best.value(stats, self.module, self.step))
            if distributed.is_main():
                tqdm.write(f"[{self.desc}] step {self.step} val " + " ".join(f"{k}={v:.4g}" for k, v in stats.items()))
        return stats

    def train_step(self, group: list[list[int]], with_stats: bool) -> tuple[dict, float, int]:
        """One optimizer step on this rank's batch of ``group`` (one batch of sequence indices per rank);
        returns (loss stats, grad norm, real tokens), stats and tokens over all ranks."""
        self.opt.zero_grad(set_to_none=True)
        stats, positions, tokens = {"n": 0}, 0, 0
        if self.rank < len(group):
            batch = collate([self.train_seqs[i] for i in group[self.rank]], self.device)
            if self.featurize is not None:  # online features: the target's forward makes them
                batch = self.featurize(batch)
            with torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16,
                                enabled=self.autocast is not None):
                loss, stats = self.loss_fn(self.module, batch, generator=self.gen, train=True, with_stats=with_stats)
            loss.backward()
            tokens = int(batch["valid"].sum())
            positions = int(stats.get("n", tokens))
        _, tokens = distributed.all_reduce_gradients(self.params, positions, tokens)
        if with_stats:
            stats = distributed.merge_stats(stats)
        clip = getattr(self.module, "clip_gradients", None)  # per head for ``objectives.joint.JointHeads``
        grad_norm = clip(self.cfg.grad_clip) if clip else float(torch.nn.utils.clip_grad_norm_(self.params,
                                                                                                 self.cfg.grad_clip))
        self.opt.step()
        self.sched.step()
        self.step += 1
        self.batch_idx += 1
        return stats, float(grad_norm), tokens

    def run(self, *, stop_after: int | None = None, on_step: Callable[[int, dict], None] | None = None) -> dict:
        """Train to the end (or ``stop_after`` steps); returns the summary (the same on every rank)."""
        cfg = self.cfg
        main = distributed.is_main()
        self.log = MetricsLog(self.out / "metrics.jsonl", self.step) if main else NullLog()
        bar = tqdm(total=self.total, initial=self.step, desc=self.desc, dynamic_ncols=True, disable=not main)
        self.module.train()
        tokens_seen, t0 = 0, time.time()
        stopped = flat = False
        last_stats: dict = {}
        # a run killed between a step's checkpoint and that step's validation takes the validation now
        missed = bool(cfg.val_every) and self.step > 0 and self.step % cfg.val_every == 0
        missed = missed and self.step not in self.log.validated
        if self.world > 1:
            missed = distributed.all_gather_objects(missed)[0]  # rank 0's log decides for every rank
        if missed:
            flat = stopped = self.validate_flat()
        while self.step < self.total and not stopped:
            batches = self.plan[self.epoch]
            while self.batch_idx < len(batches) and self.step < self.total:
                log_step = (self.step + 1) % cfg.log_every == 0 or self.step + 1 == self.total
                stats, grad_norm, tokens = self.train_step(batches[self.batch_idx], with_stats=log_step)
                tokens_seen += tokens
                self.tokens_trained += tokens
                rate = tokens_seen / max(time.time() - t0, 1e-9)
                bar.update(1)
                if main:
                    bar.set_postfix(loss=f"{stats.get('loss', 0.0):.4f}", tok_s=f"{rate:.0f}")
                if log_step:
                    last_stats = {**stats, "grad_norm": grad_norm, "lr": self.sched.get_last_lr()[0], "tok_s": rate,
                                  **self.speed_info, "world_size": self.world, "tokens_per_step": tokens}
                    self.log.write({"step": self.step, "epoch": self.epoch, "split": "train", **last_stats})
                if on_step is not None:
                    on_step(self.step, stats)
                if self.step % cfg.checkpoint_every == 0:
                    self.save()
                if cfg.val_every and self.step % cfg.val_every == 0 and self.validate_flat():
                    flat = stopped = True
                    break
                if (stop_after is not None and self.step >= stop_after) or self.stop.agreed(self.world):
                    stopped = True
                    break
            if self.batch_idx >= len(batches):  # epoch end
                self.epoch, self.batch_idx = self.epoch + 1, 0
                self.save()
                # with a validation schedule the curve is that schedule's (an epoch end a step after a
                # scheduled validation would add a near-duplicate point, counted by the flat-curve stop)
                if self.step < self.total and not cfg.val_every and self.validate_flat():
                    flat = stopped = True
        if self.saved_at != self.step:
            self.save()
        bar.close()
        final = self.last_val if self.validated_at == self.step else {} if stopped else self.validate()
        self.log.close()
        best = None if stopped and not flat else self.best.restore(self.module, self.device)
        # partial: ended by ``stop_after`` (to be resumed), not finished; a flat-curve stop is a finished run
        return {"step": self.step, "total_steps": self.total, "stopped": stopped, "flat": flat,
                "partial": stopped and not flat,
                "tokens_trained": self.tokens_trained, "passes": self.tokens_trained / max(self.corpus_tokens, 1),
                "curve": list(self.curve), "train": last_stats, "val": final, **({"best": best} if best else {})}

    def validate_flat(self) -> bool:
        """Validate (once per step: an epoch end on a ``val_every`` step validates once), then whether the
        held-out curve has flattened: over its last ``cfg.stop_when_flat`` validations (0 = never) its best
        gained < ``cfg.flat_gain`` top-1 (or the ``best_by`` measure; ``curve_flat``), which ends training."""
        if self.validated_at != self.step:
            self.validate()
            self.validated_at = self.step
            if self.saved_at == self.step:  # this step's checkpoint holds its point of the curve
                self.save()
        evals = int(self.cfg.get("stop_when_flat") or 0)
        return curve_flat(self.curve, evals, float(self.cfg.get("flat_gain", 0.005)))


def fit(module: torch.nn.Module, loss_fn: Callable, train_seqs: list[Sequence], val_seqs: list[Sequence],
        cfg, out_dir: str | Path, *, stop_after: int | None = None,
        on_step: Callable[[int, dict], None] | None = None, desc: str = "train",
        fingerprint_extra: dict | None = None, val_extra: Callable[[torch.nn.Module], dict] | None = None,
        featurize: Callable[[dict], dict] | None = None) -> dict:
    """Train ``module`` in place, resuming from ``out_dir/checkpoint.pt``; returns a summary.
    ``fingerprint_extra``: settings beyond the common ones that a checkpoint must have been written with;
    ``val_extra(module)``: measures added to each validation row (e.g. the greedy-chain tau);
    ``featurize(batch)``: adds the features of a batch of token sequences (online features)."""
    trainer = Trainer(module, loss_fn, train_seqs, val_seqs, cfg, out_dir, desc=desc,
                      fingerprint_extra=fingerprint_extra or {}, val_extra=val_extra, featurize=featurize)
    trainer.resume()
    with trainer.stop.listening():  # kill -TERM: the checkpoint of the step in progress, then a partial run
        return trainer.run(stop_after=stop_after, on_step=on_step)
