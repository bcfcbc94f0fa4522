"""The decoding loop shared by every method: prefill, then rounds of propose -> verify -> accept -> commit.

``decode_round`` is the one round, for one sequence (``generate``, with ``SingleVerifier``) or a batch of them
(``eagle2.core.batch_engine``, with its ``BatchVerifier``). Plain decoding is the same loop with a drafter
that proposes the root alone. The engine knows nothing about tokenization or about how a drafter
builds its tree; drafters know nothing about verification. Token counting is one rule for every
method: tokens appended to the output, cut after the first EOS and at ``max_new_tokens``.

The drafter interface is ``eagle2.drafters.base.Drafter``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from eagle2.core.accept import accept_greedy, accept_stochastic
from eagle2.core.cache import forward_target, keep_tree_path, new_cache
from eagle2.core.clock import Clock
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


def _record_nodes(store: dict[str, list], tree: DraftTree, round_idx: int, path: list[int]) -> None:
    if not tree.records:
        return
    on_path = set(path)
    indices = tree.records["tree_index"]
    for key, values in tree.records.items():
        store.setdefault(key, []).extend(values)
    store.setdefault("round", []).extend([round_idx] * len(indices))
    store.setdefault("accepted", []).extend([i in on_path for i in indices])


def feature_tap(target, drafter) -> LayerTap | None:
    """A tap on the target layers whose inputs the drafter reads (EAGLE-3), if it names any."""
    layers = getattr(drafter, "feature_layers", None) if drafter.needs_hidden else None
    return LayerTap(target, layers, getattr(drafter, "device", None)) if layers else None  # on the head's device


def context_limit(target, max_context: int | None) -> int:
    """Positions the target may hold: ``max_context``, else its config's, else unbounded."""
    return max_context or getattr(target.config, "max_position_embeddings", None) or 10**9


def prefill(target, cache, prompt_ids: list[int], drafter, params: SamplingParams, generator, limit: int,
            tap: LayerTap | None) -> int:
    """The prompt's forward into ``cache``, the first token sampled from its last position and the drafter
    started on them (with the target's features where it reads them); returns the first token. A prompt
    that leaves no room for one more position is refused (``ContextOverflowError``)."""
    if len(prompt_ids) + 1 > limit:
        raise ContextOverflowError(f"prompt of {len(prompt_ids)} tokens leaves no room in a context of {limit}")
    hidden = forward_target(target, torch.tensor([prompt_ids], device=target.device), cache)  # (1, P, H)
    first = next_token(target.lm_head(hidden[0, -1]), params, generator)
    feats = hidden if tap is None else tap.read()
    drafter.start(prompt_ids, first, feats[0] if drafter.needs_hidden else None)
    return first


# ---- one round, for one sequence or a batch of them -------------------------------------------------

class RoundMarks(NamedTuple):
    """One round of one sequence as ``decode_round`` leaves it, settled into ``RoundStats`` once the clock
    is resolved: marks (indices into the clock's readings) and the drafter's forward count around propose."""

    propose_start: int
    propose_end: int
    verify_start: int
    verify_end: int
    round_end: int  # after accept and commit
    forwards_before: float  # ``Sequence.forward_count`` before propose and at the round's end
    forwards_after: float
    live: int  # sequences sharing the round (acceptance and commit time is split among them)
    tree_size: int
    accepted: int
    meta: dict  # the tree's facts and the verifier's


@dataclass
class Sequence:
    """One request's decoding state across rounds: its drafter and generator, the tokens so far (the first
    from prefill), and per round its accepted length, node records and timing marks (read as ``RoundStats``
    by ``settle`` once the clock that made them is resolved)."""

    drafter: Any  # eagle2.drafters.base.Drafter
    generator: torch.Generator | None
    out: list[int]
    accept_lengths: list[int] = field(default_factory=list)
    rounds: list[RoundStats] = field(default_factory=list)
    nodes: dict[str, list] = field(default_factory=dict)
    pending: list[RoundMarks] = field(default_factory=list)  # rounds not yet settled

    def __post_init__(self):
        self.spans = getattr(self.drafter, "spans", None)  # its own forwards (None: no model, ``forward_time``)

    def forward_count(self) -> float:
        """Where the drafter's forward timing stands: its span count, or its ``forward_time`` seconds."""
        return len(self.spans) if self.spans is not None else self.drafter.forward_time

    def finished(self, max_new_tokens: int, eos_ids: set[int], length: int, limit: int) -> bool:
        """Done: enough tokens, an EOS, or no room for one more position in the context."""
        return len(self.out) >= max_new_tokens or self.out[-1] in eos_ids or length + 1 > limit

    def settle(self, seconds: list[float]) -> None:
        """Turn the pending rounds' marks into ``RoundStats`` (``seconds``: their clock, resolved)."""
        for m in self.pending:
            # the drafter's spans end before the engine's last mark, already waited for: no second wait
            f0, f1 = m.forwards_before, m.forwards_after
            draft_forward = self.spans.seconds(f0, f1, wait=False) if self.spans is not None else f1 - f0
            draft = seconds[m.propose_end] - seconds[m.propose_start]
            verify = seconds[m.verify_end] - seconds[m.verify_start]
            other = (draft - draft_forward) + (seconds[m.round_end] - seconds[m.verify_end]) / m.live  # shared
            self.rounds.append(RoundStats(m.tree_size, m.accepted, draft, draft_forward, verify, other, m.meta))
        self.pending.clear()

    def output(self, eos_ids: set[int], max_new_tokens: int, prefill_s: float, wall_s: float) -> GenerationOutput:
        """The finished generation: tokens cut at the first EOS and at ``max_new_tokens``."""
        out = _trim(self.out, eos_ids, max_new_tokens)
        _trim_lengths(self.accept_lengths, len(out) - 1)
        return GenerationOutput(out, prefill_s, wall_s, self.accept_lengths, self.rounds, self.nodes)


def drafting_groups(seqs: dict[int, Sequence], batched: bool) -> list[list[int]]:
    """The rows that draft together: with ``batched``, those whose drafters offer ``propose_batch`` and have equal
    ``batch_key()`` (the same head and tree settings); every other row alone."""
    groups: dict = {}
    for row, seq in seqs.items():
        key = getattr(seq.drafter, "batch_key", None) if batched else None
        can = key is not None and hasattr(type(seq.drafter), "propose_batch")
        groups.setdefault(key() if can else ("alone", row), []).append(row)
    return list(groups.values())


def propose_rows(seqs: dict[int, Sequence], verifier, clock: Clock, batched: bool = False):
    """Step 1 of a round: every row's tree, and per row its marks (propose start, end, forward count before).
    A group of rows (``drafting_groups``) drafts in one ``propose_batch`` (one draft forward per depth for all of
    them); each of its rows is marked with the group's span, as each row of a batch with the shared verify."""
    trees, marks = {}, {}
    for rows in drafting_groups(seqs, batched):
        t0, before = clock.mark(), {row: seqs[row].forward_count() for row in rows}
        drafters, roots = [seqs[r].drafter for r in rows], [seqs[r].out[-1] for r in rows]
        if len(rows) == 1:
            made = [drafters[0].propose(roots[0], room=verifier.room(rows[0]))]
        else:
            made = type(drafters[0]).propose_batch(drafters, roots, [verifier.room(r) for r in rows])
        t1 = clock.mark()
        for row, tree in zip(rows, made):
            trees[row], marks[row] = tree, (t0, t1, before[row])
    return trees, marks


def decode_round(seqs: dict[int, Sequence], verifier, params: SamplingParams, clock: Clock,
                 batch_drafting: bool = False) -> None:
    """One round for every sequence of ``seqs`` (row -> sequence): propose -> verify -> accept -> commit.

    ``verifier`` owns the target and its KV cache: ``room(row)`` (positions left), ``verify(trees)`` (ONE
    target forward over every row's tree: logits (N, V) per row, the drafters' features (B, Q, F) and facts
    for the round records) and ``commit(kept)`` (every row's cache keeps only its accepted path). Batch 1
    is ``SingleVerifier``; batched decoding ``eagle2.core.batch_engine.BatchVerifier``. ``batch_drafting``:
    rows whose drafters can draft together do (``propose_rows``); else each row drafts alone."""
    trees, marks = propose_rows(seqs, verifier, clock, batch_drafting)  # 1. propose: each row's own tree
    first_row = next(iter(seqs))
    v0 = clock.mark() if len(seqs) > 1 else marks[first_row][1]  # batch 1: verify starts where proposing ended
    logits, features, facts = verifier.verify(trees)  # 2. verify: one target forward for every row
    v1 = clock.mark()
    accepted = {}
    for row, seq in seqs.items():  # 3. accept: the longest accepted path plus one bonus token, per row
        if params.greedy:
            accepted[row] = accept_greedy(trees[row], logits[row])
        else:
            accepted[row] = accept_stochastic(trees[row], probabilities(logits[row], params), seq.generator)
    kept = {row: [0, *path] for row, (path, _) in accepted.items()}
    verifier.commit(kept)  # 4. commit: caches keep the accepted paths; each drafter hears what was accepted
    for row, seq in seqs.items():
        (path, bonus), tree, drafter = accepted[row], trees[row], seq.drafter
        if hasattr(drafter, "observe_target"):  # the target's logits at every node it proposed, non-candidates too
            drafter.observe_target(tree, logits[row])
        new = tree.tokens[path].tolist() + [bonus]  # one read, not one per accepted node
        drafter.observe(new, kept_features(features, row, kept[row]) if drafter.needs_hidden else None)
        seq.out.extend(new)
        seq.accept_lengths.append(len(new))
        _record_nodes(seq.nodes, tree, len(seq.rounds) + len(seq.pending), path)
    t3 = clock.mark()
    for row, seq in seqs.items():
        t0, t1, f0 = marks[row]
        seq.pending.append(RoundMarks(t0, t1, v0, v1, t3, f0, seq.forward_count(), len(seqs), len(trees[row]),
                                      len(accepted[row][0]), {**trees[row].meta, **facts}))


def kept_features(features: torch.Tensor, row: int, kept: list[int]) -> torch.Tensor:
    """The target's features (len(kept), F) at a row's kept nodes (ascending, the root first) of the round's
    ``features`` (B, Q, F). Where they are its first columns (a plain round's root, a chain accepted from its start),
    a view: a list index copies, at ~4x a view's cost per row and round; a view keeps the round's features alive
    while a drafter holds it (until its next catch-up)."""
    n = len(kept)
    return features[row, :n] if kept[-1] == n - 1 else features[row, kept]


class SingleVerifier:
    """Batch 1: the target and its own KV cache, ``prefix`` positions committed."""

    def __init__(self, target, cache, prefix: int, limit: int, tap: LayerTap | None):
        self.target, self.cache, self.prefix, self.limit, self.tap = target, cache, prefix, limit, tap

    def room(self, row: int) -> int:
        return self.limit - self.prefix

    def verify(self, trees: dict[int, DraftTree]):
        tree, device = trees[0], self.target.device
        tokens, mask, positions = tree.verify_inputs(self.prefix, self.target.dtype, device)  # one copy
        hidden = forward_target(self.target, tokens, self.cache, attention_mask=mask, position_ids=positions)
        logits = self.target.lm_head(hidden[0])  # (N, V)
        return {0: logits}, hidden if self.tap is None else self.tap.read(), {}

    def commit(self, kept: dict[int, list[int]]) -> None:
        keep_tree_path(self.cache, self.prefix, kept[0])
        self.prefix += len(kept[0])


@torch.no_grad()
def generate(target, drafter, prompt_ids: list[int], params: SamplingParams, max_new_tokens: int,
             eos_ids: set[int], generator: torch.Generator | None = None, max_context: int | None = None,
             in_place_cache: bool = True) -> GenerationOutput:
    """Decode with ``drafter``. Its features (``needs_hidden``) are the target's last hidden states,
    or the inputs of the target layers it names in ``feature_layers``, concatenated. ``in_place_cache``
    false: the target's KV cache is transformers' stock concatenating one (``make bench-engine``'s before)."""
    limit = context_limit(target, max_context)
    tap = feature_tap(target, drafter)
    try:
        return _decode(target, drafter, prompt_ids, params, max_new_tokens, eos_ids, generator, limit, tap,
                       new_cache(target, in_place_cache))
    finally:
        if tap is not None:
            tap.close()


def _decode(target, drafter, prompt_ids, params, max_new_tokens, eos_ids, generator, limit,
            tap: LayerTap | None, cache) -> GenerationOutput:
    clock = Clock(target.device)  # marks, read once after the last round: no timing syncs inside rounds
    start = clock.mark()
    first = prefill(target, cache, prompt_ids, drafter, params, generator, limit, tap)
    decode_start = clock.mark()
    seq, verifier = Sequence(drafter, generator, [first]), SingleVerifier(target, cache, len(prompt_ids), limit, tap)
    while not seq.finished(max_new_tokens, eos_ids, verifier.prefix, limit):
        decode_round({0: seq}, verifier, params, clock)
    end = clock.mark()
    seconds = clock.resolve()  # the one wait of the generation (CUDA)
    seq.settle(seconds)
    return seq.output(eos_ids, max_new_tokens, seconds[decode_start] - seconds[start],
                      seconds[end] - seconds[decode_start])


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
