"""The compiled path of Medusa and Hydra heads (``eagle2.heads.medusa_heads``, ``eagle2.heads.hydra_heads``):
their blocks through ``torch.compile``.

These heads keep no KV cache: a round runs Medusa's K heads once on one hidden state and Hydra's head d once
per depth on the P nodes expanded there. ``attach_stack(heads)`` gives the heads ``CompiledBlocks``
(``heads.compiled_blocks``) and ``blocks(heads)`` is what a drafter calls, compiled or not:

- ``features(hidden, n)`` (Medusa): every head's blocks on one hidden state, ONE static graph (all K heads
  are computed and the first ``n`` kept: a head's features do not depend on the others');
- ``head_features(k, hidden, path)`` (Hydra): head k on P rows, one graph for P = 1 and one dynamic in P per
  head (2K graphs, each compiled by ``warm_up``).

The LM heads, log-softmax and top-k stay eager, as for the EAGLE heads (the drafting LM-head copies, oneDNN-
packed in bf16: ``eagle2.drafters.eagle_common.drafting_lm_head``). Artifacts go to inductor's disk cache
(``eagle2.core.compiled.use_disk_cache``).
"""

from __future__ import annotations

import torch

from eagle2.core.clock import device_clock
from eagle2.core.compiled import use_disk_cache


class CompiledBlocks:
    """The heads' blocks through ``torch.compile`` (see the module's docstring)."""

    def __init__(self, heads, compile: bool = True):
        self.heads = heads
        self.compiled, self.compile_s = compile, 0.0
        all_features = getattr(heads, "features", None)  # Medusa's: every head on the same hidden state
        if compile:
            use_disk_cache()
            graphs = 2 * len(heads) + 1  # Hydra: P = 1 and P > 1 per head; Medusa: one
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, graphs)
            self._all_features = (None if all_features is None
                                  else torch.compile(all_features, dynamic=False, isolate_recompiles=True))
            self._head_features = torch.compile(heads.head_features, dynamic=None, isolate_recompiles=True)
        else:
            self._all_features, self._head_features = all_features, heads.head_features

    @torch.no_grad()
    def features(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """(n, ..., H): the blocks' output of the first ``heads`` heads (all by default) on ``hidden``."""
        return self._all_features(hidden)[: heads or len(self.heads)]

    @torch.no_grad()
    def head_features(self, k: int, hidden: torch.Tensor, path: torch.Tensor | None = None) -> torch.Tensor:
        """(P, H): head ``k`` on hidden states (P, H) and, for heads that read it, the path (P, k+1)."""
        if self.compiled and hidden.shape[0] > 1:
            for tensor in (hidden, path):
                if tensor is not None:
                    torch._dynamo.mark_dynamic(tensor, 0)
        return self._head_features(k, hidden, path)

    def warm_up(self) -> float:
        """Compile every graph a decoding uses outside any timed section; returns the seconds it took."""
        param = next(self.heads.parameters())
        start = device_clock(param.device)
        if self._all_features is not None:
            self.features(torch.randn(self.heads.hidden, dtype=param.dtype, device=param.device))
        elif self.heads.reads_path:
            for k in range(len(self.heads)):
                for rows in (1, 3):
                    hidden = torch.randn(rows, self.heads.hidden, dtype=param.dtype, device=param.device)
                    self.head_features(k, hidden, torch.zeros(rows, k + 1, dtype=torch.long, device=param.device))
        self.compile_s = device_clock(param.device) - start
        return self.compile_s


def blocks(heads):
    """What a drafter runs the heads' blocks through: their compiled path when attached, else the heads."""
    compiled = getattr(heads, "compiled_blocks", None)
    return heads if compiled is None else compiled


def attach_stack(heads, compile: bool = True) -> CompiledBlocks:
    """Give Medusa or Hydra ``heads`` the compiled path (``heads.compiled_blocks``); returns it."""
    compiled = CompiledBlocks(heads, compile)
    heads.compiled_blocks = compiled
    return compiled
