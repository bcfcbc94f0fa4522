"""The decoding loop shared by every method: prefill, then rounds of propose -> verify -> accept -> commit.

Plain decoding is the same loop with a drafter that proposes the root alone. The engine knows
nothing about tokenization or about how a drafter builds its tree; drafters know nothing about
verification. Token counting is one rule for every method: tokens appended to the output, cut
after the first EOS and at ``max_new_tokens``.

The drafter interface is ``eagle2.drafters.base.Drafter``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eagle2.core.accept import accept_greedy, accept_stochastic
from eagle2.core.cache import forward_target, keep_tree_path, new_cache
from eagle2.core.features import LayerTap
from eagle2.core.sampling import SamplingParams, next_token, probabilities
from eagle2.core.tree import DraftTree


class ContextOverflowError(ValueError):
    """The prompt leaves no room for generation in the model's context."""


@dataclass
class RoundStats:
    """The facts of one decoding round, stored per round in every row (``rounds``, column-wise)."""

    tree_size: int  # nodes verified, the root included
    accepted: int  # drafted nodes accepted (the bonus token not counted)
    draft_time_s: float  # the drafter's propose(), forwards and bookkeeping
    draft_forward_s: float  # of which its own model forwards
    verify_forward_s: float  # the target's forward over the tree, LM head included
    other_s: float  # everything else: acceptance, cache commit, records
    drafter: dict = field(default_factory=dict)  # drafter facts (DraftTree.meta: budget, expected_tokens, ...)

    def record(self) -> dict:
        facts = {k: v for k, v in self.__dict__.items() if k != "drafter"}
        return {**facts, **self.drafter}


@dataclass
class GenerationOutput:
    output_ids: list[int]
    prefill_time_s: float
    wall_time_s: float  # decode only
    accept_lengths: list[int]  # tokens appended per decode round (target forward), bonus included
    rounds: list[RoundStats] = field(default_factory=list)  # per-round timing and drafter facts
    nodes: dict[str, list] = field(default_factory=dict)  # per drafted node, column-wise

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def target_forwards(self) -> int:
        return len(self.accept_lengths)


def device_clock(device) -> float:
    """perf_counter after the device's queued work is done (a CUDA sync), for timing forwards."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _record_nodes(store: dict[str, list], tree: DraftTree, round_idx: int, path: list[int]) -> None:
    if not tree.records:
        return
    on_path = set(path)
    indices = tree.records["tree_index"]
    for key, values in tree.records.items():
        store.setdefault(key, []).extend(values)
    store.setdefault("round", []).extend([round_idx] * len(indices))
    store.setdefault("accepted", []).extend([i in on_path for i in indices])


def _feature_tap(target, drafter) -> LayerTap | None:
    """A tap on the target layers whose inputs the drafter reads (EAGLE-3), if it names any."""
    layers = getattr(drafter, "feature_layers", None) if drafter.needs_hidden else None
    return LayerTap(target, layers) if layers else None


@torch.no_grad()
def generate(target, drafter, prompt_ids: list[int], params: SamplingParams, max_new_tokens: int,
             eos_ids: set[int], generator: torch.Generator | None = None, max_context: int | None = None,
             in_place_cache: bool = True) -> GenerationOutput:
    """Decode with ``drafter``. Its features (``needs_hidden``) are the target's last hidden states,
    or the inputs of the target layers it names in ``feature_layers``, concatenated. ``in_place_cache``
    false: the target's KV cache is transformers' stock concatenating one (``make bench-engine``'s before)."""
    limit = max_context or getattr(target.config, "max_position_embeddings", None) or 10**9
    if len(prompt_ids) + 1 > limit:
        raise ContextOverflowError(f"prompt of {len(prompt_ids)} tokens leaves no room in a context of {limit}")
    tap = _feature_tap(target, drafter)
    try:
        return _decode(target, drafter, prompt_ids, params, max_new_tokens, eos_ids, generator, limit, tap,
                       new_cache(target, in_place_cache))
    finally:
        if tap is not None:
            tap.close()


def _decode(target, drafter, prompt_ids, params, max_new_tokens, eos_ids, generator, limit,
            tap: LayerTap | None, cache) -> GenerationOutput:
    device = target.device
    start = device_clock(device)
    hidden = forward_target(target, torch.tensor([prompt_ids], device=device), cache)  # (1, P, H)
    first = next_token(target.lm_head(hidden[0, -1]), params, generator)
    feats = hidden if tap is None else tap.read()
    drafter.start(prompt_ids, first, feats[0] if drafter.needs_hidden else None)
    decode_start = device_clock(device)
    out, root, prefix = [first], first, len(prompt_ids)
    accept_lengths, rounds, nodes = [], [], {}
    while len(out) < max_new_tokens and out[-1] not in eos_ids and prefix + 1 <= limit:
        t0, f0 = device_clock(device), drafter.forward_time
        tree = drafter.propose(root, room=limit - prefix)
        t1 = device_clock(device)
        mask = tree.attention_mask(prefix, target.dtype, device)
        hidden = forward_target(target, tree.tokens[None].to(device), cache, attention_mask=mask,
                                position_ids=tree.position_ids(prefix, device))
        logits = target.lm_head(hidden[0])  # (N, V)
        t2 = device_clock(device)
        if params.greedy:
            path, bonus = accept_greedy(tree, logits)
        else:
            path, bonus = accept_stochastic(tree, probabilities(logits, params), generator)
        kept = [0, *path]
        keep_tree_path(cache, prefix, kept)
        new = tree.tokens[path].tolist() + [bonus]  # one read, not one per accepted node
        feats = hidden if tap is None else tap.read()
        drafter.observe(new, feats[0, kept] if drafter.needs_hidden else None)
        out.extend(new)
        prefix, root = prefix + len(kept), bonus
        accept_lengths.append(len(new))
        _record_nodes(nodes, tree, len(rounds), path)
        t3 = device_clock(device)
        draft_forward = drafter.forward_time - f0
        rounds.append(RoundStats(len(tree), len(path), t1 - t0, draft_forward, t2 - t1,
                                 (t3 - t0) - draft_forward - (t2 - t1), dict(tree.meta)))
    end = device_clock(device)
    out = _trim(out, eos_ids, max_new_tokens)
    _trim_lengths(accept_lengths, len(out) - 1)
    return GenerationOutput(out, decode_start - start, end - decode_start, accept_lengths, rounds, nodes)


def _trim(tokens: list[int], eos_ids: set[int], max_new_tokens: int) -> list[int]:
    tokens = tokens[:max_new_tokens]
    for i, tok in enumerate(tokens):
        if tok in eos_ids:
            return tokens[: i + 1]
    return tokens


def _trim_lengths(lengths: list[int], decoded: int) -> None:
    """Clip the last rounds' lengths so that they add up to the tokens kept after the first one."""
    excess = sum(lengths) - decoded
    for i in range(len(lengths) - 1, -1, -1):  # every round kept at least one token
        cut = min(excess, lengths[i] - 1)
        lengths[i] -= cut
        excess -= cut
