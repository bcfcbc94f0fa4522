"""The drafter interface the engine (``eagle2.core.engine.generate``) drives, declared once.

A drafter turns the committed context into a ``DraftTree`` each round and never sees verification.
Each drafter module also has ``build(method_cfg, target, params, generator, weights) -> Drafter``,
which its method's YAML names (``eagle2.bench.methods``).
"""

from __future__ import annotations

from typing import Protocol

import torch

from eagle2.core.tree import DraftTree


class Drafter(Protocol):
    needs_hidden: bool  # whether it consumes target features (EAGLE does)
    # optional ``feature_layers``: target layers whose inputs, concatenated, are its features (EAGLE-3);
    # absent or None: the target's last hidden states after the final norm
    # its own model forwards for the time breakdown: ``spans`` (``eagle2.core.clock.Spans``, no syncs) when it
    # runs a model, else ``forward_time: float`` seconds (0.0 for drafters without forwards)
    # optional ``observe_target(tree, target_logits)``: after each verify, the tree it proposed and the
    # target's logits (N, V) at every node, non-candidate nodes (``DraftTree.candidate``) included, on the
    # target's device: how Lookahead reads its Jacobi window and Token Recycling its top-k candidates
    # optional, together: ``batch_key() -> hashable`` and a classmethod ``propose_batch(drafters, roots, rooms)
    # -> list[DraftTree]``: the batch engine hands the rows whose drafters have equal keys to one call, which
    # drafts them all at once (each row's tree the one ``propose`` would give; ``eagle2.drafters.head_group``)

    def start(self, prompt_ids: list[int], first_token: int, prompt_hidden: torch.Tensor | None) -> None:
        """After prefill: the prompt, the first generated token, and (if ``needs_hidden``) the prompt's
        features (P, H)."""

    def propose(self, root: int, room: int) -> DraftTree:
        """A tree rooted at the last committed token, with at most ``room`` nodes, the root included."""

    def observe(self, new_tokens: list[int], hidden: torch.Tensor | None) -> None:
        """Newly committed tokens (the last one is the next root) and, when ``needs_hidden``, the target's
        features of the tokens that precede each of them."""
