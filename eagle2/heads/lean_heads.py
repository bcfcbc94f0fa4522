"""The lean forwards of the feature-level draft heads over a static KV buffer: what ``torch.compile`` traces on
the compiled path (``eagle2.heads.static_head``).

``LeanEagleHead`` reproduces ``EagleHead.forward`` (``eagle2.heads.eagle_head``): ``fc(concat(embed(t), f))``,
then Llama decoder layers (the first without an input norm), no final norm. ``LeanEagle3Head`` reproduces
``Eagle3Head.forward`` (``eagle2.heads.eagle3_head``): ``fc`` on fused target features (skipped for the head's
own h-wide outputs; EAGLE-3.1's tap norms first), then one layer whose attention reads
``concat(norm(embed(t)), hidden_norm(g))`` (EAGLE-3.1: ``hidden_norm(g)`` the residual too). Both
keep the eager order of operations on the lean layers the compiled target uses (``eagle2.core.lean_layers``:
q/k/v and gate/up fused, packed oneDNN linears and the short-query attention where the run's kernels call for
them), and write each forward's keys and values in place at ``slots`` of the per-layer buffers.

Signature of both: ``forward(ids (1, Q), features (1, Q, F), positions (1, Q), mask (1, 1, Q, S) additive,
slots (Q,), keys, values (per layer (1, KVH, C, D), C >= S))`` -> predicted features (1, Q, h).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eagle2.core.lean_layers import LeanLinear, LeanStack, fixed, rms, wants_packed


def _stack_args(head, layers) -> tuple:
    param = next(head.parameters())
    return head.config, head.rotary_emb, layers, wants_packed(head), param.dtype, param.device


class LeanEagleHead(LeanStack):
    """``EagleHead.forward`` over the static buffers (see the module's docstring)."""

    def __init__(self, head):
        super().__init__(*_stack_args(head, head.layers))
        self.embed = fixed(head.embed_tokens.weight)
        self.fc = LeanLinear.of(head.fc, self.pack)
        self.feature_widths = (head.config.hidden_size,)  # the target's last hidden states

    def forward(self, ids, features, positions, mask, slots, keys, values):
        emb = F.embedding(ids, self.embed).to(features.dtype)
        h = self.fc(torch.cat([emb, features], dim=-1))
        rope = self.rotary(positions, h.dtype)
        for index, layer in enumerate(self.layers):
            x = h if layer.ln_attn is None else rms(h, layer.ln_attn, self.eps)
            h = h + self.attention(layer, x, rope, mask, slots, keys[index], values[index])
            h = self.mlp(layer, h)
        return h


class LeanEagle3Head(LeanStack):
    """``Eagle3Head.forward`` over the static buffers (see the module's docstring)."""

    def __init__(self, head):
        mid = head.midlayer
        super().__init__(*_stack_args(head, [mid]))
        self.embed = fixed(head.embed_tokens.weight)
        self.fc = LeanLinear.of(head.fc, self.pack)
        self.hidden_norm = fixed(mid.hidden_norm.weight)
        self.norm_before_residual = mid.norm_before_residual  # EAGLE-3.1
        self.tap_norms = None if head.tap_norms is None else [fixed(n.weight) for n in head.tap_norms]
        self.width = head.config.hidden_size
        self.feature_widths = (head.fc.weight.shape[1], self.width)  # fused target features; its own outputs

    def forward(self, ids, features, positions, mask, slots, keys, values):
        emb = F.embedding(ids, self.embed).to(features.dtype)
        hidden = self.fuse(features) if features.shape[-1] != self.width else features
        layer = self.layers[0]
        normed = rms(hidden, self.hidden_norm, self.eps)
        if self.norm_before_residual:
            hidden = normed
        x = torch.cat([rms(emb, layer.ln_attn, self.eps), normed], dim=-1)
        hidden = hidden + self.attention(layer, x, self.rotary(positions, hidden.dtype), mask, slots, keys[0],
                                         values[0])
        return self.mlp(layer, hidden)


    def fuse(self, features):
        if self.tap_norms is not None:  # EAGLE-3.1: each tapped feature normed first
            parts = features.chunk(len(self.tap_norms), dim=-1)
            features = torch.cat([rms(p, w, self.eps) for p, w in zip(parts, self.tap_norms)], dim=-1)
        return self.fc(features)


def lean_head(head) -> LeanStack:
    """The lean forward of an EAGLE-1/2 or an EAGLE-3 head."""
    from eagle2.heads.eagle3_head import Eagle3Head

    return LeanEagle3Head(head) if isinstance(head, Eagle3Head) else LeanEagleHead(head)
