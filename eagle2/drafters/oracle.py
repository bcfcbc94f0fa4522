"""The oracle: an analysis drafter that proposes what the target will actually emit at temperature 0,
a chain of ``depth`` tokens per round. Its tau is, per benchmark, the highest any drafter can reach
with trees of that depth (a tree of depth D accepts at most D drafts per round, so a chain of D is
the ceiling of every tree shape of depth D); ``analysis`` reports each method's tau as a share of it
("oracle efficiency"). Its speed is NOT a method's speed: it runs the target itself to look ahead.

Where the continuation comes from, each round:
- ``references`` (``method.reference=RESULTS``, by default the run's own results folder, read by
  ``eagle2.bench.oracle_references``, which builds this drafter): the output
  of the stored plain, temperature-0 row with the same ``prompt_ids`` and dtype, while the output so
  far agrees with it;
- otherwise (no such row, or the output left it: in half precision a tree forward and a one-token
  forward can round a near-tie differently) plain greedy decoding of the target from the committed
  sequence, with its own KV cache (``SpsDrafter`` with the target as its own draft).

Drafts are deterministic (no ``q_draft``): at temperature > 0 they go through the rule for
deterministically chosen children, so even there the oracle is lossless (but no longer an oracle).
"""

from __future__ import annotations

from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import DraftTree
from eagle2.drafters.sps import SpsDrafter


class OracleDrafter:
    needs_hidden = False

    def __init__(self, target, depth: int, references: dict[tuple[int, ...], list[int]] | None = None):
        if depth < 1:
            raise ValueError("oracle needs depth >= 1")
        self.depth, self.references = depth, references or {}
        self.decoder = SpsDrafter(target, SamplingParams(), depth, None)  # plain greedy look-ahead

    @property
    def spans(self):
        return self.decoder.spans

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.reference = self.references.get(tuple(prompt_ids))
        self.output = [first_token]
        self.decoder.start(prompt_ids, first_token, None)

    def observe(self, new_tokens, hidden) -> None:
        self.output.extend(new_tokens)
        self.decoder.observe(new_tokens, hidden)

    def propose(self, root: int, room: int) -> DraftTree:
        n, m, ref = min(self.depth, room - 1), len(self.output), self.reference
        if ref is not None and ref[:m] == self.output:
            return DraftTree.chain(root, ref[m: m + n], meta={"oracle_from_reference": 1})
        tree = self.decoder.propose(root, n + 1)
        tree.meta["oracle_from_reference"] = 0
        return tree
