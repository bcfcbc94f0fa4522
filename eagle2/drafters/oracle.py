"""The oracle: an analysis drafter that proposes what the target will actually emit at temperature 0,
a chain of ``depth`` tokens per round. Its tau is, per benchmark, the highest any drafter can reach
with trees of that depth (a tree of depth D accepts at most D drafts per round, so a chain of D is
the ceiling of every tree shape of depth D); ``analysis`` reports each method's tau as a share of it
("oracle efficiency"). Its speed is NOT a method's speed: it runs the target itself to look ahead.

Where the continuation comes from, each round:
- ``references`` (``method.reference=RESULTS``, by default the run's own results folder): the output
  of the stored plain, temperature-0 row with the same ``prompt_ids`` and dtype, while the output so
  far agrees with it;
- otherwise (no such row, or the output left it: in half precision a tree forward and a one-token
  forward can round a near-tie differently) plain greedy decoding of the target from the committed
  sequence, with its own KV cache (``SpsDrafter`` with the target as its own draft).

Drafts are deterministic (no ``q_draft``): at temperature > 0 they go through the rule for
deterministically chosen children, so even there the oracle is lossless (but no longer an oracle).
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

from eagle2.drafters.sps import SpsDrafter
from eagle2.results import read_rows
from eagle2.sampling import SamplingParams
from eagle2.tree import DraftTree

log = logging.getLogger(__name__)


def reference_outputs(results: str, dtype: str) -> dict[tuple[int, ...], list[int]]:
    """prompt_ids -> output_ids of every ok plain temperature-0 row in ``dtype`` under ``results`` (a
    rows file or a folder searched recursively); of several rows for one prompt, the longest output.
    Empty when there are none (the oracle then decodes itself). Cached per state of the files."""
    path = Path(results)
    files = [path] if path.is_file() else sorted(path.rglob("*.jsonl")) if path.is_dir() else []
    if not files:
        log.warning("oracle: no rows under method.reference=%s; it decodes its look-ahead itself", results)
    return _read_references(tuple((str(f), f.stat().st_size) for f in files), dtype)


@lru_cache(maxsize=8)
def _read_references(files: tuple[tuple[str, int], ...], dtype: str) -> dict[tuple[int, ...], list[int]]:
    out: dict[tuple[int, ...], list[int]] = {}
    for row in (r for f, _ in files for r in read_rows(f)):
        if (row.get("status") == "ok" and row.get("method") == "plain" and row.get("temperature") == 0
                and row.get("dtype") == dtype and row.get("prompt_ids")):
            key = tuple(row["prompt_ids"])
            if len(row["output_ids"]) > len(out.get(key, ())):
                out[key] = list(row["output_ids"])
    return out


class OracleDrafter:
    needs_hidden = False

    def __init__(self, target, depth: int, references: dict[tuple[int, ...], list[int]] | None = None):
        if depth < 1:
            raise ValueError("oracle needs depth >= 1")
        self.depth, self.references = depth, references or {}
        self.decoder = SpsDrafter(target, SamplingParams(), depth, None)  # plain greedy look-ahead

    @property
    def forward_time(self) -> float:
        return self.decoder.forward_time

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


def build(method_cfg, target, params, generator, weights: dict) -> OracleDrafter:
    reference = method_cfg.get("reference")
    references = None
    if reference:
        references = reference_outputs(str(reference), str(target.dtype).removeprefix("torch."))
    return OracleDrafter(target, int(method_cfg.depth), references)
