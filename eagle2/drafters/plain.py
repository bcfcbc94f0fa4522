"""Plain decoding as a drafter that proposes nothing: every round verifies the root alone."""

from __future__ import annotations

from eagle2.core.tree import DraftTree


class PlainDrafter:
    needs_hidden = False
    forward_time = 0.0

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        pass

    def propose(self, root: int, room: int) -> DraftTree:
        return DraftTree.root_only(root)

    def observe(self, new_tokens, hidden) -> None:
        pass


def build(method_cfg, target, params, generator, weights: dict) -> PlainDrafter:
    return PlainDrafter()
