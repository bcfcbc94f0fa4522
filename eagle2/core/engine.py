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
from eagle2.core.clock import Clock, Spans
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
    """perf_counter after the device's queued work is done (a CUDA sync), for benchmarks that mean to wait;
    decoding rounds are timed by ``eagle2.core.clock`` (no syncs)."""
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
    return LayerTap(target, layers, getattr(drafter, "device", None)) if layers else None  # on the head's device


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
    clock = Clock(device)  # marks, read once after the last round: no timing syncs inside rounds
    start = clock.mark()
    hidden = forward_target(target, torch.tensor([prompt_ids], device=device), cache)  # (1, P, H)
    first = next_token(target.lm_head(hidden[0, -1]), params, generator)
    feats = hidden if tap is None else tap.read()
    drafter.start(prompt_ids, first, feats[0] if drafter.needs_hidden else None)
    spans = getattr(drafter, "spans", None)  # a drafter's own forwards (None: no model, ``forward_time``)
    decode_start = clock.mark()
    out, root, prefix = [first], first, len(prompt_ids)
    accept_lengths, trees, marks, nodes = [], [], [], {}
    while len(out) < max_new_tokens and out[-1] not in eos_ids and prefix + 1 <= limit:
        t0, f0 = clock.mark(), _forward_count(drafter, spans)
        tree = drafter.propose(root, room=limit - prefix)
        t1 = clock.mark()
        mask = tree.attention_mask(prefix, target.dtype, device)
        hidden = forward_target(target, tree.tokens[None].to(device), cache, attention_mask=mask,
                                position_ids=tree.position_ids(prefix, device))
        logits = target.lm_head(hidden[0])  # (N, V)
        t2 = clock.mark()
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
        _record_nodes(nodes, tree, len(trees), path)
        trees.append((len(tree), len(path), dict(tree.meta)))
        marks.append((t0, t1, t2, clock.mark(), f0, _forward_count(drafter, spans)))
    end = clock.mark()
    seconds = clock.resolve()  # the one wait of the generation (CUDA)
    rounds = [_round_stats(seconds, spans, m, t) for m, t in zip(marks, trees)]
    out = _trim(out, eos_ids, max_new_tokens)
    _trim_lengths(accept_lengths, len(out) - 1)
    return GenerationOutput(out, seconds[decode_start] - seconds[start], seconds[end] - seconds[decode_start],
                            accept_lengths, rounds, nodes)


def _forward_count(drafter, spans: Spans | None) -> float:
    """Where the drafter's forward timing stands: its span count, or its ``forward_time`` seconds."""
    return len(spans) if spans is not None else drafter.forward_time


def _round_stats(seconds: list[float], spans: Spans | None, marks: tuple, tree: tuple) -> RoundStats:
    t0, t1, t2, t3, f0, f1 = marks
    # the drafter's spans end before the engine's last mark, already waited for: no second wait
    draft_forward = spans.seconds(f0, f1, wait=False) if spans is not None else f1 - f0
    verify = seconds[t2] - seconds[t1]
    size, accepted, meta = tree
    return RoundStats(size, accepted, seconds[t1] - seconds[t0], draft_forward, verify,
                      (seconds[t3] - seconds[t0]) - draft_forward - verify, meta)


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
