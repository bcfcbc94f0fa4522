"""The loss pieces every training objective shares, and their position-weighted evaluation.

``LossProjection``: the target's frozen LM head in the loss dtype (``loss_dtype``), optionally restricted to a
drafting vocabulary; ``soft_cross_entropy``: a head's distribution fitted to the target's (the (rows, vocab)
logits never held at once); ``unrolled_predictions``: a feature head's draft steps 1..unroll on its own
outputs, attending as drafting does ("training-time test", ``unroll_mask``); ``combine``: the steps' losses,
weighted ``step_decay ** i``. Each objective's own loss lives in its module (``objectives/``).

Agreement stats (top-1 / top-4, per step) come from ``agreement`` (the one definition the eval stage uses
too); when not training (validation, evaluation) every loss uses the exact fp32 LM head
(``LossProjection.exact``), whatever the training loss dtype, so the figures do not depend on it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from eagle2.core.cache import new_cache
from eagle2.core.tree import additive_mask
from eagle2.heads.eagle_head import causal_mask
from eagle2.training.data import Sequence, collate, evenly_spaced, make_batches
from eagle2.training.evaluation.agreement import (
    Tally,
    agreement_counts,
    as_means,
    counted_positions,
    ranked_ids,
    target_ids,
)


def loss_dtype(name: str) -> torch.dtype:
    """A loss dtype setting; ``auto`` is bf16 where the CPU multiplies bf16 natively (~2.5x faster
    there) and fp32 elsewhere (on an AVX2-only CPU a bf16 LM-head matmul is many times slower)."""
    from eagle2.core.cpu import cpu_has_native_bf16
    from eagle2.core.precision import resolve_dtype

    if name == "auto":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    return resolve_dtype(name)


class LossProjection:
    """The target's frozen LM head, applied in ``dtype`` (bf16 is ~2.5x faster on AVX512 CPUs);
    returns fp32 logits. With ``vocab_ids`` only those rows (the drafting vocabulary): a soft
    cross-entropy over them is the one over the full vocabulary restricted to the tokens a head can
    ever propose, at a fraction of the cost (the target's distribution renormalised over them)."""

    def __init__(self, lm_head: torch.nn.Module, dtype: torch.dtype = torch.float32,
                 vocab_ids: torch.Tensor | None = None):
        self.lm_head = lm_head
        weight = lm_head.weight.detach()
        bias = getattr(lm_head, "bias", None)
        self.vocab_ids = None if vocab_ids is None else vocab_ids.to(weight.device).long()  # (V,) target ids or None
        if vocab_ids is not None:
            weight, bias = weight[self.vocab_ids], None if bias is None else bias[self.vocab_ids]
        self.weight = weight.to(dtype)
        self.bias = None if bias is None else bias.detach().to(dtype)
        self._full: LossProjection | None = self if vocab_ids is None else None
        self._exact: LossProjection | None = self if dtype == torch.float32 and vocab_ids is None else None

    def exact(self) -> LossProjection:
        """The full LM head in fp32 (this one when it is that): validation and evaluation use it."""
        if self._exact is None:
            self._exact = LossProjection(self.lm_head, torch.float32)
        return self._exact

    def full(self) -> LossProjection:
        """The full LM head in this one's dtype (this one when it is that)."""
        if self._full is None:
            self._full = LossProjection(self.lm_head, self.weight.dtype)
        return self._full

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).float()


def top_k_target(q: torch.Tensor, top_k: int, weight: float) -> torch.Tensor:
    """``q + weight * q * [v in the top_k of q]``: the soft target whose cross-entropy is the full one plus
    ``weight`` times HASS's top-K distillation loss ``-sum_{v in topK(q)} q_v log p_v`` (not renormalized)."""
    if not top_k or not weight:
        return q
    top = q.topk(min(top_k, q.shape[-1]), dim=-1)
    return q.scatter_add(-1, top.indices, top.values * weight)


class _SoftCrossEntropy(torch.autograd.Function):
    """Mean over rows of ``-sum_v r_v log softmax(x W^T)_v`` with ``q = softmax(z)``, ``z`` the target's logits of
    the rows (``target(a, b)``: rows a..b-1), and ``r = q`` (or with
    ``top_k``: ``top_k_target``), computed in row chunks: the (rows, vocab) logits never exist at once and the
    gradient with respect to ``x``, ``(sum(r) softmax(x W^T) - r) W``, is formed during the forward. Agreement
    stats go into ``stats``."""

    @staticmethod
    def forward(ctx, x, target, weight, bias, chunk, topk, stats, top_k=0, top_k_weight=0.0):
        n = x.shape[0]
        grad = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        total = entropy = 0.0
        ranked, wanted = [], []
        for a in range(0, n, chunk):
            logp = torch.log_softmax(F.linear(x[a:a + chunk].to(weight.dtype), weight, bias).float(), -1)
            zq = target(a, min(a + chunk, n))  # the target's logits of these rows
            q = torch.softmax(zq, -1)
            r = top_k_target(q, top_k, top_k_weight)
            total -= float(torch.linalg.vecdot(r, logp).sum())
            if topk:
                ranked.append(ranked_ids(logp, topk))
                wanted.append(target_ids(zq))
                entropy -= float(torch.linalg.vecdot(q, torch.log_softmax(zq, -1)).sum())
            if grad is not None:
                g = logp.exp_().mul_(r.sum(-1, keepdim=True)).sub_(r) if r is not q else logp.exp_().sub_(q)
                grad[a:a + chunk] = (g.to(weight.dtype) @ weight).to(x.dtype)
        if topk:
            counts = agreement_counts(torch.cat(ranked), torch.cat(wanted), ks=(1, topk) if topk > 1 else (1,))
            stats.update(as_means(counts), entropy=entropy / max(n, 1))
        ctx.save_for_backward(grad)
        ctx.n = n
        return x.new_tensor(total / max(n, 1))

    @staticmethod
    def backward(ctx, grad_out):
        (grad,) = ctx.saved_tensors
        return grad * (grad_out / ctx.n), None, None, None, None, None, None, None, None


class LogitsSoftCrossEntropy(torch.autograd.Function):
    """Mean over rows of ``-sum_v q_v log softmax(z)_v`` for given logits ``z`` (N, V) and targets ``q``:
    the gradient ``softmax(z) - q`` is formed in the forward and kept in ``z``'s dtype (bf16 under
    autocast), so no fp32 (N, V) log-probabilities are stored for a backward through log_softmax."""

    @staticmethod
    def forward(ctx, z, q):
        logp = torch.log_softmax(z.float(), -1)
        n = max(z.shape[0], 1)
        loss = -torch.linalg.vecdot(q, logp).sum() / n
        ctx.save_for_backward(logp.exp_().sub_(q).to(z.dtype) if ctx.needs_input_grad[0] else None)
        ctx.n = n
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        (grad,) = ctx.saved_tensors
        return grad * (grad_out / ctx.n).to(grad.dtype), None


def soft_cross_entropy(x: torch.Tensor, y: torch.Tensor | Callable[[int, int], torch.Tensor], proj: LossProjection, *,
                       topk: int = 4, chunk: int = 1024, top_k: int = 0,
                       top_k_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Soft cross-entropy of ``lm_head(x)`` against ``softmax(lm_head(y))`` (``y`` gets no gradient; or ``y(a, b)``:
    the target's logits of rows a..b-1 over ``proj``'s vocabulary, e.g. read from ``target_logits.TargetLogits``).
    With ``topk >= 1`` also top-1 / top-``topk`` agreement with ``argmax lm_head(y)`` and the entropy
    of the target distribution (``topk=0``: the loss only, a little faster). ``top_k``, ``top_k_weight``: plus
    that weight times the top-K distillation loss (``top_k_target``), in the same pass over the LM head."""
    stats: dict = {}
    fixed = None if callable(y) else y.detach()
    target = y if fixed is None else lambda a, b: proj(fixed[a:b])
    loss = _SoftCrossEntropy.apply(x, target, proj.weight, proj.bias, chunk, topk, stats, top_k, top_k_weight)
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
    return additive_mask(torch.cat(parts, dim=1), dtype, device)


def unrolled_predictions(head, tokens: torch.Tensor, f_in: torch.Tensor, answer: torch.Tensor, unroll: int,
                         detach: bool = False):
    """The head's predictions at draft steps 1..``unroll`` over a batch: yields (step, pred, sel) with
    ``pred`` (B, n_pos - step + 1, h) and ``sel`` the answer positions among them.

    Step 1 reads ``(t[j+1], f_in[j])`` under causal attention. Step ``s`` ("training-time test") reads
    ``(t[j+s], its own step s-1 prediction)`` at every position and attends as drafting does
    (``unroll_mask``); its prediction at index i stands for position ``j = i + s - 1`` and is fitted to
    the target at ``j + 1``. Tokens are the true ones (a chain is only worth anything while its tokens
    are right). This is HASS's harmonized context alignment too: at step ``s`` the chain's earlier positions
    are its own features, as decoding sees them; ``detach`` (HASS) feeds each step its predecessor's
    prediction without its gradient."""
    b, n_pos = tokens.shape[0], tokens.shape[1] - 1
    pos = torch.arange(n_pos, device=tokens.device)
    cache = new_cache(head) if unroll > 1 else None
    pred = head(tokens[:, 1:], f_in, position_ids=pos.expand(b, -1),
                attention_mask=causal_mask(n_pos, 0, f_in.dtype, tokens.device), cache=cache)
    for step in range(1, unroll + 1):
        if step > 1:
            if n_pos - step + 1 <= 0:
                return
            prev = pred[:, :-1].detach() if detach else pred[:, :-1]
            pred = head(tokens[:, step:], prev, position_ids=pos[step - 1:].expand(b, -1),
                        attention_mask=unroll_mask(n_pos, step, f_in.dtype, tokens.device), cache=cache)
        yield step, pred, answer[:, step - 1:]


def answer_positions(batch: dict) -> torch.Tensor:
    """(B, L-1): head position j counts when ``f[j+1]`` is an answer position (``agreement``'s rule)."""
    return counted_positions(batch["valid"], batch["start"], batch.get("answer"))


def subsample(n: int, fraction: float, generator, device) -> torch.Tensor | None:
    """A random ``fraction`` of ``n`` positions (None: all of them)."""
    if fraction >= 1:
        return None
    return torch.randperm(n, generator=generator, device=device)[: max(1, round(n * fraction))]


def combine(step_losses: list[torch.Tensor], stats: dict, like: torch.Tensor, step_decay: float = 1.0):
    """The steps' losses averaged with weights ``step_decay ** i`` (i = 0 for step 1; 1.0: a plain mean)."""
    if not step_losses:
        return like.sum() * 0.0, {"loss": 0.0, "top1": 0.0, "n": 0}
    if step_decay == 1.0:
        total = sum(step_losses) / len(step_losses)
    else:
        weights = [step_decay ** i for i in range(len(step_losses))]
        total = sum(w * loss for w, loss in zip(weights, step_losses)) / sum(weights)
    stats["loss"] = total.item()
    stats.setdefault("n", 0)
    return total, stats


@torch.no_grad()
def evaluate_loss(module, loss_fn: Callable, seqs: list[Sequence], *, token_budget: int, max_batch: int,
                  max_sequences: int | None = None, device=None,
                  featurize: Callable[[dict], dict] | None = None) -> dict[str, float]:
    """Position-weighted means of the loss stats over ``seqs`` (no noise; ``agreement.Tally``);
    ``max_sequences`` keeps that many, evenly spaced (``data.evenly_spaced``), as the eval stage does."""
    seqs = evenly_spaced(seqs, max_sequences)
    if not seqs:
        return {}
    was_training = module.training
    module.eval()
    tally = Tally()
    for idx in make_batches([len(s.tokens) for s in seqs], token_budget, max_batch, seed=0, epoch=0):
        batch = collate([seqs[i] for i in idx], device)
        _, stats = loss_fn(module, batch if featurize is None else featurize(batch), train=False)
        tally.add(stats)
    module.train(was_training)
    return tally.means()
