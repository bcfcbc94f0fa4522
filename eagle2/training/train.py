"""Training EAGLE heads and SpS draft models on a self-distillation corpus (``corpus.py`` shards).

EAGLE head (as in the EAGLE paper): for every sequence the head reads the pairs ``(t[i+1], f[i])``,
with ``f[i]`` jittered by uniform noise ``U(-noise, noise)``, under causal attention; its output
``p[i]`` is regressed onto ``f[i+1]`` with SmoothL1 and, weighted by ``w_cls``, its distribution
``log_softmax(lm_head(p[i]))`` is fitted to the target's ``softmax(lm_head(f[i+1]))`` (soft
cross-entropy). Losses count only where ``f[i+1]`` is an answer position (``i+1 >= response_start``);
the prompt is context. The embedding and LM head are the target's, frozen.

SpS draft model: a soft cross-entropy (KL up to a constant) of the draft's next-token distribution
against the target's ``softmax(lm_head(f[j]))`` at the answer positions (optionally the prompt too).

Both use AdamW, warmup + cosine LR, batches under a token budget (right-padded, length-bucketed, a
fixed order per epoch drawn from the seed), gradient clipping, and one checkpoint file
(``checkpoint.pt``: weights, optimizer, scheduler, position in the data, RNG) replaced atomically
every ``checkpoint_every`` steps and at every epoch end. A rerun with the same ``out_dir`` resumes
from it and reproduces an uninterrupted run. A few shards (every ``1/val_fraction``-th) are held out.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from tqdm import tqdm

from eagle2.cache import new_cache
from eagle2.head import EagleHead, causal_mask, head_config_from_target
from eagle2.training.corpus import read_shards

SHARED_KEYS = ("model.embed_tokens.weight", "lm_head.weight")


class Sequence(NamedTuple):
    tokens: torch.Tensor  # (n,) int
    features: torch.Tensor  # (n, H) post-norm hidden states, usually fp16
    start: int  # index of the first answer token


# ----------------------------------------------------------------------------------------- data

def shard_index(path: Path) -> int:
    match = re.search(r"(\d+)", path.stem)
    return int(match.group(1)) if match else 0


def split_shards(folder: str | Path, val_fraction: float) -> tuple[list[Path], list[Path]]:
    """(train, val) shard paths: every ``round(1/val_fraction)``-th shard index is held out.

    Shard indices follow prompt length, so this spreads the held-out prompts over all lengths. With
    too few shards for that rule the last shard is held out (if there are at least two).
    """
    paths = sorted(Path(folder).glob("shard_*.safetensors"), key=shard_index)
    if not paths:
        raise FileNotFoundError(f"no corpus shards (shard_*.safetensors) in {folder}")
    if val_fraction <= 0 or len(paths) < 2:
        return paths, []
    k = max(2, round(1 / val_fraction))
    val = [p for p in paths if shard_index(p) % k == k - 1]
    if not val:
        val = [paths[-1]]
    return [p for p in paths if p not in val], val


def shard_sequences(shard: dict[str, torch.Tensor]) -> list[Sequence]:
    offsets = shard["offsets"].tolist()
    starts = shard["response_start"].tolist()
    return [Sequence(shard["tokens"][a:b].long(), shard["features"][a:b], int(s))
            for a, b, s in zip(offsets[:-1], offsets[1:], starts) if b - a >= 2]


def load_sequences(paths) -> list[Sequence]:
    from safetensors.torch import load_file

    seqs: list[Sequence] = []
    for path in paths:
        seqs.extend(shard_sequences(load_file(str(path))))
    return seqs


def all_sequences(folder: str | Path) -> list[Sequence]:
    return [s for shard in read_shards(folder) for s in shard_sequences(shard)]


def make_batches(lengths: list[int], token_budget: int, max_batch: int, seed: int, epoch: int,
                 window: int = 512) -> list[list[int]]:
    """Shuffled batches of sequence indices with ``len(batch) * longest <= token_budget``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    batches: list[list[int]] = []
    for w in range(0, len(order), window):  # sort inside windows: little padding, still random
        current: list[int] = []
        longest = 0
        for i in sorted(order[w:w + window], key=lambda i: lengths[i]):
            grown = max(longest, lengths[i])
            if current and (grown * (len(current) + 1) > token_budget or len(current) >= max_batch):
                batches.append(current)
                current, grown = [], lengths[i]
            current.append(i)
            longest = grown
        if current:
            batches.append(current)
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]


def collate(seqs: list[Sequence], device) -> dict[str, torch.Tensor]:
    """Right-padded batch: tokens (B, L), features (B, L, H) fp32, valid (B, L), start (B,)."""
    width = max(len(s.tokens) for s in seqs)
    hidden = seqs[0].features.shape[-1]
    tokens = torch.zeros((len(seqs), width), dtype=torch.long)
    feats = torch.zeros((len(seqs), width, hidden), dtype=torch.float32)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, s in enumerate(seqs):
        n = len(s.tokens)
        tokens[row, :n] = s.tokens
        feats[row, :n] = s.features.float()
        valid[row, :n] = True
    start = torch.tensor([s.start for s in seqs], dtype=torch.long)
    return {"tokens": tokens.to(device), "features": feats.to(device), "valid": valid.to(device),
            "start": start.to(device)}


# --------------------------------------------------------------------------------------- losses

class LossProjection:
    """The target's frozen LM head, applied in ``dtype`` (bf16 is ~2.5x faster on AVX512 CPUs);
    returns fp32 logits."""

    def __init__(self, lm_head: torch.nn.Module, dtype: torch.dtype = torch.float32):
        self.weight = lm_head.weight.detach().to(dtype)
        self.bias = None if getattr(lm_head, "bias", None) is None else lm_head.bias.detach().to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).float()


class _SoftCrossEntropy(torch.autograd.Function):
    """Mean over rows of ``-sum_v q_v log softmax(x W^T)_v`` with ``q = softmax(y W^T)``, computed in
    row chunks: the (rows, vocab) logits never exist at once and the gradient with respect to ``x``,
    ``(softmax(x W^T) - q) W``, is formed during the forward. Agreement stats go into ``stats``."""

    @staticmethod
    def forward(ctx, x, y, weight, bias, chunk, topk, stats):
        n = x.shape[0]
        grad = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        total = entropy = 0.0
        top1 = topk_hits = 0
        for a in range(0, n, chunk):
            logp = torch.log_softmax(F.linear(x[a:a + chunk].to(weight.dtype), weight, bias).float(), -1)
            zq = F.linear(y[a:a + chunk].to(weight.dtype), weight, bias).float()
            q = torch.softmax(zq, -1)
            total -= float(torch.linalg.vecdot(q, logp).sum())
            if topk:
                want = zq.argmax(-1)
                top1 += int((logp.argmax(-1) == want).sum())
                entropy -= float(torch.linalg.vecdot(q, torch.log_softmax(zq, -1)).sum())
                if topk > 1:
                    topk_hits += int((logp.topk(topk, dim=-1).indices == want[:, None]).any(-1).sum())
            if grad is not None:
                g = logp.exp_().sub_(q)
                grad[a:a + chunk] = (g.to(weight.dtype) @ weight).to(x.dtype)
        if topk:
            stats.update(top1=top1 / max(n, 1), entropy=entropy / max(n, 1))
        if topk > 1:
            stats[f"top{topk}"] = topk_hits / max(n, 1)
        ctx.save_for_backward(grad)
        ctx.n = n
        return x.new_tensor(total / max(n, 1))

    @staticmethod
    def backward(ctx, grad_out):
        (grad,) = ctx.saved_tensors
        return grad * (grad_out / ctx.n), None, None, None, None, None, None


def soft_cross_entropy(x: torch.Tensor, y: torch.Tensor, proj: LossProjection, *, topk: int = 4,
                       chunk: int = 1024) -> tuple[torch.Tensor, dict]:
    """Soft cross-entropy of ``lm_head(x)`` against ``softmax(lm_head(y))`` (``y`` gets no gradient).
    With ``topk >= 1`` also top-1 / top-``topk`` agreement with ``argmax lm_head(y)`` and the entropy
    of the target distribution (``topk=0``: the loss only, a little faster)."""
    stats: dict = {}
    loss = _SoftCrossEntropy.apply(x, y.detach(), proj.weight, proj.bias, chunk, topk, stats)
    return loss, stats


def unroll_mask(length: int, step: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive mask of unrolled draft step ``step`` (>= 2) over a cache holding steps ``1..step``.

    Step ``s`` has one query per position ``j = s-1 .. length-1``: the chain that started from the true
    prefix ``0..j-s+1`` and has drafted ``s-1`` features since. As when drafting, that query sees the
    step-1 keys (true features) at positions ``<= j-step+1`` and, of every later step ``s``, only its
    own chain's key, at position ``j-step+s``.
    """
    j = torch.arange(step - 1, length, device=device)
    parts = [torch.arange(length, device=device)[None] <= (j - step + 1)[:, None]]
    for s in range(2, step + 1):
        parts.append(torch.arange(s - 1, length, device=device)[None] == (j - step + s)[:, None])
    allowed = torch.cat(parts, dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def head_loss(head: EagleHead, batch: dict, *, proj: LossProjection, noise: float, w_reg: float,
              w_cls: float, unroll: int = 1, unroll_cls_fraction: float = 1.0,
              generator: torch.Generator | None = None, train: bool = True, with_stats: bool = True):
    """EAGLE loss over a batch; returns (loss, stats). Noise only when ``train``; agreement stats
    (top-1, and top-4 when not training) only ``with_stats``.

    ``unroll > 1`` adds the loss of draft steps 2..unroll ("training-time test"): step ``s`` reads
    ``(t[j+1], its own predicted feature for f[j])`` at every position, attends as drafting does
    (``unroll_mask``), and is fitted to ``f[j+1]`` like step 1. Tokens are the true ones (a chain
    is only worth anything while its tokens are right). The steps' losses are averaged; ``top1``
    stays step 1's, ``top1_s{s}`` is step ``s``'s. The cross-entropy (the 49k-vocabulary LM head, most
    of the cost) of steps >= 2 may use a random ``unroll_cls_fraction`` of their positions when
    training: an unbiased estimate at a fraction of the cost."""
    tokens, feats, valid, start = batch["tokens"], batch["features"], batch["valid"], batch["start"]
    b, length = tokens.shape
    n_pos = length - 1  # head position j reads (t[j+1], f[j]) and predicts f[j+1]
    f_in = feats[:, :-1]
    if train and noise > 0:
        jitter = torch.rand(f_in.shape, generator=generator, device=f_in.device, dtype=f_in.dtype)
        f_in = f_in + (jitter * 2 - 1) * noise
    pos = torch.arange(n_pos, device=tokens.device)
    answer = valid[:, 1:] & (pos[None] + 1 >= start[:, None])
    cache = new_cache(head) if unroll > 1 else None
    pred = head(tokens[:, 1:], f_in, position_ids=pos.expand(b, -1),
                attention_mask=causal_mask(n_pos, 0, f_in.dtype, tokens.device), cache=cache)
    total, stats, steps = None, {}, 0
    for step in range(1, unroll + 1):
        if step > 1:
            if n_pos - step + 1 <= 0:
                break
            p_pos = pos[step - 1:]
            pred = head(tokens[:, step:], pred[:, :-1], position_ids=p_pos.expand(b, -1),
                        attention_mask=unroll_mask(n_pos, step, f_in.dtype, tokens.device), cache=cache)
        sel = answer[:, step - 1:]
        n = int(sel.sum())
        if n == 0:
            continue
        p, y = pred[sel], feats[:, step:][sel]
        reg = F.smooth_l1_loss(p, y)
        p_cls, y_cls = p, y
        if step > 1 and train and unroll_cls_fraction < 1:
            pick = torch.randperm(n, generator=generator, device=p.device)[: max(1, round(n * unroll_cls_fraction))]
            p_cls, y_cls = p[pick], y[pick]
        cls, step_stats = soft_cross_entropy(p_cls, y_cls, proj, topk=(1 if train else 4) if with_stats else 0)
        loss = w_reg * reg + w_cls * cls
        total = loss if total is None else total + loss
        steps += 1
        if step == 1:
            step_stats.pop("entropy", None)
            stats.update(step_stats, reg=reg.item(), cls=cls.item(), n=n)
        elif "top1" in step_stats:
            stats[f"top1_s{step}"] = step_stats["top1"]
    if total is None:
        return pred.sum() * 0.0, {"loss": 0.0, "reg": 0.0, "cls": 0.0, "top1": 0.0, "n": 0}
    total = total / steps
    stats["loss"] = total.item()
    stats.setdefault("n", 0)
    return total, stats


def draft_loss(draft, batch: dict, *, proj: LossProjection, loss_on_prompt: bool = False,
               draft_proj: LossProjection | None = None, generator: torch.Generator | None = None,
               train: bool = True, with_stats: bool = True):
    """Soft cross-entropy of the draft against the target's next-token distribution. ``proj`` is the
    target's LM head; ``draft_proj`` the draft's when it has its own (default: shared, ``proj``)."""
    tokens, feats, valid, start = batch["tokens"], batch["features"], batch["valid"], batch["start"]
    b, length = tokens.shape
    pos = torch.arange(length, device=tokens.device)
    hidden = draft.base_model(input_ids=tokens, attention_mask=valid.long(), position_ids=pos.expand(b, -1),
                              use_cache=False).last_hidden_state
    sel = valid if loss_on_prompt else valid & (pos[None] + 1 >= start[:, None])
    n = int(sel.sum())
    if n == 0:
        return hidden.sum() * 0.0, {"loss": 0.0, "kl": 0.0, "top1": 0.0, "n": 0}
    if draft_proj is None:
        ce, stats = soft_cross_entropy(hidden[sel], feats[sel], proj,
                                       topk=(1 if train else 4) if with_stats else 0)
    else:  # a draft with its own LM head (a hub checkpoint): evaluation only
        q_logits = proj(feats[sel])
        logp = torch.log_softmax(draft_proj(hidden[sel]), dim=-1)
        q = torch.softmax(q_logits, -1)
        want = q_logits.argmax(-1)
        ce = -(q * logp).sum(-1).mean()
        stats = {"top1": (logp.argmax(-1) == want).float().mean().item(),
                 "top4": (logp.topk(4, -1).indices == want[:, None]).any(-1).float().mean().item(),
                 "entropy": -(q * torch.log_softmax(q_logits, -1)).sum(-1).mean().item()}
    if "entropy" in stats:
        stats["kl"] = ce.item() - stats.pop("entropy")
    stats.update(loss=ce.item(), n=n)
    return ce, stats


# ---------------------------------------------------------------------------------------- models

def new_head(target, init_from_target: bool = False, num_layers: int = 1) -> EagleHead:
    """A fresh fp32 head for ``target``: default (random) init, or its layer from the target's last
    decoder layer and ``fc = [0 | I]`` so the feature passes straight through at the start. On
    SmolLM2 the latter trained worse (30 steps: held-out top-1 0.016 vs 0.23 for random init; 0.066
    with the copied layer's o_proj/down_proj zeroed), so random init is the default."""
    head = EagleHead(head_config_from_target(target.config, num_layers), bias=True)
    if init_from_target:
        last = target.base_model.layers[-1]
        layer = head.layers[0]
        layer.self_attn.load_state_dict(last.self_attn.state_dict())
        layer.mlp.load_state_dict(last.mlp.state_dict())
        layer.post_attention_layernorm.load_state_dict(last.post_attention_layernorm.state_dict())
        h = head.config.hidden_size
        with torch.no_grad():
            head.fc.weight.zero_()
            head.fc.weight[:, h:].copy_(torch.eye(h))
            if head.fc.bias is not None:
                head.fc.bias.zero_()
    head.attach_embedding(target.get_input_embeddings())
    return head.to(target.device, torch.float32)


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in module.state_dict().items() if k not in SHARED_KEYS and "rotary" not in k}


def export_dtype(module: torch.nn.Module, max_mb: float) -> torch.dtype:
    """fp32 if the stored weights fit in ``max_mb`` MB, else fp16."""
    numel = sum(v.numel() for v in trainable_state(module).values())
    return torch.float32 if numel * 4 <= max_mb * 1e6 else torch.float16


# -------------------------------------------------------------------------------------- the loop

def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _save_checkpoint(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


@torch.no_grad()
def evaluate_loss(module, loss_fn: Callable, seqs: list[Sequence], *, token_budget: int, max_batch: int,
                  max_sequences: int | None = None, device=None) -> dict[str, float]:
    """Position-weighted means of the loss stats over ``seqs`` (no noise)."""
    seqs = seqs[:max_sequences] if max_sequences else seqs
    if not seqs:
        return {}
    was_training = module.training
    module.eval()
    totals: dict[str, float] = {}
    count = 0
    for idx in make_batches([len(s.tokens) for s in seqs], token_budget, max_batch, seed=0, epoch=0):
        _, stats = loss_fn(module, collate([seqs[i] for i in idx], device), train=False)
        n = stats.pop("n")
        count += n
        for k, v in stats.items():
            totals[k] = totals.get(k, 0.0) + v * n
    module.train(was_training)
    return {k: v / max(count, 1) for k, v in totals.items()} | {"positions": count}


def fit(module: torch.nn.Module, loss_fn: Callable, train_seqs: list[Sequence], val_seqs: list[Sequence],
        cfg, out_dir: str | Path, *, stop_after: int | None = None,
        on_step: Callable[[int, dict], None] | None = None, desc: str = "train") -> dict:
    """Train ``module`` in place, resuming from ``out_dir/checkpoint.pt``; returns a summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = next(module.parameters()).device
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.get("betas", (0.9, 0.95))),
                            weight_decay=cfg.get("weight_decay", 0.0))
    lengths = [len(s.tokens) for s in train_seqs]
    plan = [make_batches(lengths, cfg.token_budget, cfg.max_batch, cfg.seed, e) for e in range(cfg.epochs)]
    total = sum(len(p) for p in plan)
    if cfg.get("max_steps"):
        total = min(total, int(cfg.max_steps))
    warmup = cfg.get("warmup", 0.05)
    warmup = max(1, int(warmup * total) if warmup < 1 else int(warmup))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, partial(lr_factor, warmup=warmup, total=total, min_ratio=cfg.get("min_lr_ratio", 0.1)))
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    fingerprint = {"total_steps": total, "sequences": len(train_seqs), "token_budget": cfg.token_budget,
                   "seed": cfg.seed, "lr": cfg.lr}
    if int(cfg.get("unroll", 1)) != 1:  # (absent otherwise: older checkpoints still resume)
        fingerprint.update(unroll=int(cfg.unroll), unroll_cls_fraction=float(cfg.get("unroll_cls_fraction", 1.0)))
    step, epoch, batch_idx = 0, 0, 0
    ckpt = out / "checkpoint.pt"
    if ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=True)
        if state["fingerprint"] != fingerprint:
            raise ValueError(f"{ckpt} was written by a different run ({state['fingerprint']} vs "
                             f"{fingerprint}); use another out_dir or delete it")
        module.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        gen.set_state(state["noise_rng"].cpu())
        torch.set_rng_state(state["torch_rng"].cpu())
        step, epoch, batch_idx = state["step"], state["epoch"], state["batch"]
        tqdm.write(f"[{desc}] resumed from {ckpt} at step {step}/{total}")

    def save():
        _save_checkpoint(ckpt, {"model": trainable_state(module), "optimizer": opt.state_dict(),
                                "scheduler": sched.state_dict(), "step": step, "epoch": epoch,
                                "batch": batch_idx, "noise_rng": gen.get_state(),
                                "torch_rng": torch.get_rng_state(), "fingerprint": fingerprint})

    # metrics.jsonl holds exactly the steps up to the checkpoint: lines of steps after it (a run that
    # was killed between checkpoints) are dropped, since those steps are redone.
    metrics = out / "metrics.jsonl"
    kept = [line for line in (metrics.read_text().splitlines() if metrics.exists() else [])
            if line.strip() and json.loads(line)["step"] <= step]
    metrics.write_text("".join(line + "\n" for line in kept))
    log_file = metrics.open("a")

    def log(record: dict):
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()

    def validate():
        stats = evaluate_loss(module, loss_fn, val_seqs, token_budget=cfg.token_budget,
                              max_batch=cfg.max_batch, max_sequences=cfg.get("val_max_sequences"),
                              device=device)
        if stats:
            log({"step": step, "epoch": epoch, "split": "val", **stats})
            tqdm.write(f"[{desc}] step {step} val " + " ".join(f"{k}={v:.4g}" for k, v in stats.items()))
        return stats

    bar = tqdm(total=total, initial=step, desc=desc, dynamic_ncols=True)
    module.train()
    saved_at, tokens_seen, t0 = step, 0, time.time()
    stopped = False
    last_stats: dict = {}
    while step < total and not stopped:
        batches = plan[epoch]
        while batch_idx < len(batches) and step < total:
            batch = collate([train_seqs[i] for i in batches[batch_idx]], device)
            log_step = (step + 1) % cfg.get("log_every", 10) == 0 or step + 1 == total
            loss, stats = loss_fn(module, batch, generator=gen, train=True, with_stats=log_step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.get("grad_clip", 1.0))
            opt.step()
            sched.step()
            step += 1
            batch_idx += 1
            tokens_seen += int(batch["valid"].sum())
            rate = tokens_seen / max(time.time() - t0, 1e-9)
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.4f}", tok_s=f"{rate:.0f}")
            if log_step:
                last_stats = {**stats, "grad_norm": float(grad_norm), "lr": sched.get_last_lr()[0], "tok_s": rate}
                log({"step": step, "epoch": epoch, "split": "train", **last_stats})
            if on_step is not None:
                on_step(step, stats)
            if step % cfg.checkpoint_every == 0:
                save()
                saved_at = step
            if cfg.get("val_every") and step % cfg.val_every == 0:
                validate()
            if stop_after is not None and step >= stop_after:
                stopped = True
                break
        if batch_idx >= len(batches):
            epoch, batch_idx = epoch + 1, 0
            save()
            saved_at = step
            if step < total:
                validate()
    if saved_at != step:
        save()
    bar.close()
    final = {} if stopped else validate()
    log_file.close()
    return {"step": step, "total_steps": total, "stopped": stopped, "train": last_stats, "val": final}


# ----------------------------------------------------------------------------------- entry points

def _dtype(name: str) -> torch.dtype:
    from eagle2.models import resolve_dtype

    return resolve_dtype(name)


def _split(corpus_dir, cfg) -> tuple[list[Sequence], list[Sequence]]:
    train_paths, val_paths = split_shards(corpus_dir, cfg.get("val_fraction", 0.03))
    train_seqs = load_sequences(train_paths)
    if cfg.get("max_train_sequences") and int(cfg.max_train_sequences) < len(train_seqs):
        # evenly spaced: shards follow prompt length, so a prefix would keep only the short prompts
        keep = torch.linspace(0, len(train_seqs) - 1, int(cfg.max_train_sequences)).round().long().unique()
        train_seqs = [train_seqs[i] for i in keep.tolist()]
    return train_seqs, load_sequences(val_paths)


def train_head(target, corpus_dir: str | Path, cfg, out_dir: str | Path, **kwargs) -> tuple[EagleHead, dict]:
    """Train an EAGLE head on ``corpus_dir``; checkpoints and metrics go to ``out_dir``."""
    torch.manual_seed(cfg.seed)
    target.requires_grad_(False)
    train_seqs, val_seqs = _split(corpus_dir, cfg)
    head = new_head(target, cfg.get("init_from_target", False), cfg.get("num_layers", 1))
    if cfg.get("init_from"):  # continue from a trained head (published format); its draft vocabulary too
        from eagle2.head import load_head

        start = load_head(cfg.init_from, target)
        head.load_state_dict(start.state_dict(), strict=False)
        head.draft_vocab = start.draft_vocab
    proj = LossProjection(target.get_output_embeddings(), _dtype(cfg.get("loss_dtype", "float32")))
    loss_fn = partial(head_loss, proj=proj, noise=cfg.noise, w_reg=cfg.get("w_reg", 1.0),
                      w_cls=cfg.get("w_cls", 0.1), unroll=int(cfg.get("unroll", 1)),
                      unroll_cls_fraction=float(cfg.get("unroll_cls_fraction", 1.0)))
    summary = fit(head, loss_fn, train_seqs, val_seqs, cfg, out_dir, desc="head", **kwargs)
    return head.eval(), summary


def train_draft(target, corpus_dir: str | Path, cfg, out_dir: str | Path, **kwargs):
    """Train an SpS draft model (``eagle2.draft_model``) on ``corpus_dir``."""
    from eagle2.draft_model import build_draft_model

    torch.manual_seed(cfg.seed)
    target.requires_grad_(False)
    train_seqs, val_seqs = _split(corpus_dir, cfg)
    draft = build_draft_model(target, cfg.num_layers, cfg.get("init_from_target", True))
    proj = LossProjection(target.get_output_embeddings(), _dtype(cfg.get("loss_dtype", "float32")))
    loss_fn = partial(draft_loss, proj=proj, loss_on_prompt=cfg.get("loss_on_prompt", False))
    summary = fit(draft, loss_fn, train_seqs, val_seqs, cfg, out_dir, desc="draft", **kwargs)
    return draft.eval(), summary


# ---------------------------------------------------------------------------------- recipe stages

def corpus_stage(target, tokenizer, corpus_cfg, root: Path) -> Path:
    """Build (or finish) the self-distillation corpus of ``conf/train/*.yaml``."""
    from eagle2.training.corpus import build_corpus, training_records

    records = training_records(root / corpus_cfg.prompts)
    if corpus_cfg.get("limit"):
        records = records[: int(corpus_cfg.limit)]
    prompts = [p for p, _ in records]
    responses = corpus_cfg.get("responses", "self")
    if responses not in ("self", "dataset"):
        raise ValueError(f"train.corpus.responses must be 'self' or 'dataset', not {responses!r}")
    return build_corpus(target, tokenizer, prompts, root / corpus_cfg.out_dir, template=corpus_cfg.template,
                        system_prompt=corpus_cfg.system_prompt, batch_size=corpus_cfg.batch_size,
                        max_new_tokens=corpus_cfg.max_new_tokens, max_prompt_tokens=corpus_cfg.max_prompt_tokens,
                        temperature=corpus_cfg.temperature, samples_per_prompt=corpus_cfg.samples_per_prompt,
                        seed=corpus_cfg.seed, max_batches=corpus_cfg.get("max_batches"),
                        worker=corpus_cfg.get("worker", 0), workers=corpus_cfg.get("workers", 1),
                        answers=[a for _, a in records] if responses == "dataset" else None)


def _write_training_card(folder: Path, kind: str, cfg, summary: dict, dtype: torch.dtype) -> None:
    from omegaconf import OmegaConf

    info = {"kind": kind, "target": cfg.model.name, "corpus": OmegaConf.to_container(cfg.train.corpus),
            "recipe": OmegaConf.to_container(cfg.train[kind]), "stored_dtype": str(dtype).replace("torch.", ""),
            "summary": summary}
    (folder / "training.json").write_text(json.dumps(info, indent=2, default=str))


def _check_size(folder: Path, max_mb: float) -> None:
    size = (folder / "model.safetensors").stat().st_size / 1e6
    if size > max_mb:
        raise RuntimeError(f"{folder}/model.safetensors is {size:.1f} MB, over the {max_mb} MB limit")


def head_stage(target, cfg, root: Path) -> Path | None:
    """Train the EAGLE head and export it (published format, no embedding) to ``train.export.head``."""
    from eagle2.head import save_head

    head, summary = train_head(target, root / cfg.train.corpus.out_dir, cfg.train.head,
                               root / cfg.train.head.out_dir, stop_after=cfg.train.head.get("stop_after"))
    if summary["stopped"]:
        return None
    from eagle2.training.corpus import tokens_by_frequency

    if head.draft_vocab is None:  # a head continued from another keeps that head's vocabulary
        head.draft_vocab = tokens_by_frequency(root / cfg.train.corpus.out_dir)
    dtype = export_dtype(head, cfg.train.export.head_max_mb)
    folder = save_head(head, root / cfg.train.export.head, dtype=dtype)
    _check_size(folder, cfg.train.export.head_max_mb)
    _write_training_card(folder, "head", cfg, summary, dtype)
    return folder


def draft_stage(target, cfg, root: Path) -> Path | None:
    """Train the SpS draft model and export it (no embedding / LM head) to ``train.export.draft``."""
    from eagle2.draft_model import save_draft_model

    draft, summary = train_draft(target, root / cfg.train.corpus.out_dir, cfg.train.draft,
                                 root / cfg.train.draft.out_dir, stop_after=cfg.train.draft.get("stop_after"))
    if summary["stopped"]:
        return None
    dtype = export_dtype(draft, cfg.train.export.draft_max_mb)
    folder = save_draft_model(draft, root / cfg.train.export.draft, dtype=dtype)
    _check_size(folder, cfg.train.export.draft_max_mb)
    _write_training_card(folder, "draft", cfg, summary, dtype)
    return folder
