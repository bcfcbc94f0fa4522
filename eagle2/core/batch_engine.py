"""Batched decoding for every method: B requests in the rows of one target forward per round.

Each request keeps its own drafter (its own tree, budget and random generator) exactly as in the batch-1
engine (``eagle2.core.engine``); a round drafts every live row's tree, pads the trees to the round's largest
with masked dummy nodes, verifies them in one target forward with a (B, 1, Q, K) additive mask (row b
sees its own prefix ``0..lengths[b]`` and its own tree ancestors, written at the common width) and
position ids ``lengths[b] + depth``, then accepts and commits per row (``eagle2.core.batch_cache``): a
different accepted length per row, per-row EOS and ``max_new_tokens``. A request is prefilled alone (its
own forward, its own first token) and its KV copied into its row.

Requests come from a queue the caller may append to while decoding (a later MT-bench turn waits for its
first turn's answer). ``refill=True`` (continuous batching) gives a freed row to the next queued request at
once; ``refill=False`` (static) lets the batch drain and then admits the next wave. Each finished request is
handed to ``on_finish`` with its ``GenerationOutput`` (``wall_time_s``: the span it was in flight) and its
batch facts (``batch_wall_time_s``: the wave's decode time when static, the row's span when continuous;
``admitted_at`` / ``retired_at``: seconds from the run's start to its prefill's start / to leaving its row,
and ``run_started``, the run's Unix time, from which the batch's wall span and throughput follow).

A round is batch 1's own (``eagle2.core.engine.decode_round``: propose -> verify -> accept -> commit) over
the live rows, with ``BatchVerifier`` in place of the single cache: the target's LM head runs once per round
over every live row's real tree nodes (one matmul, not B), and a round's accepted entries move into place
with one gather per layer for all rows (``BatchCache.commit_rows``). A row's ``other_s`` is its drafter's
bookkeeping plus its share of the round's acceptance and commit, as at batch 1.

Drafting (``batch_drafting=True``, the default): rows whose drafters offer ``propose_batch`` with equal
``batch_key()`` (EAGLE, EAGLE-2, EAGLE-3: ``eagle2.drafters.head_group``) draft together, one draft-head forward
and one drafting LM-head call per depth for all of them, each row's tree the one it drafts alone; the others,
and every row with ``batch_drafting=False``, draft one after another.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import torch

from eagle2.core.batch_cache import BatchCache
from eagle2.core.cache import forward_target, new_cache
from eagle2.core.clock import Clock, device_clock
from eagle2.core.engine import (
    ContextOverflowError,
    GenerationOutput,
    Sequence,
    context_limit,
    decode_round,
    feature_tap,
    prefill,
)
from eagle2.core.sampling import SamplingParams
from eagle2.core.tree import DraftTree, additive_mask


@dataclass
class BatchRequest:
    prompt_ids: list[int]
    drafter: Any  # eagle2.drafters.base.Drafter, this request's own
    max_new_tokens: int
    generator: torch.Generator | None = None
    key: Any = None  # the caller's handle, returned untouched


@dataclass
class BatchResult:
    request: BatchRequest
    output: GenerationOutput | None  # None when the request failed
    batch_id: int
    batch_slot: int
    batch_wall_time_s: float | None
    error: BaseException | None = None
    admitted_at: float | None = None  # seconds since the run started: its prefill began
    retired_at: float | None = None  # ... it left its row
    run_started: float | None = None  # Unix time the run started


@dataclass
class _Row:
    request: BatchRequest
    seq: Sequence  # its decoding state, as batch 1 keeps it
    prefill_s: float
    start: float  # decode start (after its prefill)
    admitted: float  # prefill start
    end: float | None = None


def verify_inputs(trees: dict[int, DraftTree], lengths: list[int], width: int, rows: int):
    """Tokens (B, Q), position ids (B, Q) and the allowed matrix (B, Q, width + Q) of one batched verify.

    Row b's real nodes sit at columns ``width..width + n_b`` and see the row's own prefix and their tree
    ancestors; its dummy nodes (and every node of a row with no tree) see only themselves."""
    q = max(len(t) for t in trees.values())
    tokens = torch.zeros(rows, q, dtype=torch.long)
    positions = torch.zeros(rows, q, dtype=torch.long)
    allowed = torch.zeros(rows, q, width + q, dtype=torch.bool)
    idx = torch.arange(q)
    allowed[:, idx, width + idx] = True  # every node sees itself (dummies: only that)
    for b in range(rows):
        positions[b] = lengths[b]
        tree = trees.get(b)
        if tree is None:
            continue
        n = len(tree)
        tokens[b, :n] = tree.tokens
        tokens[b, n:] = tree.tokens[0]
        positions[b, :n] = tree.depths + lengths[b]
        allowed[b, :n, : lengths[b]] = True
        allowed[b, :n, width: width + n] = tree.ancestor_matrix()
    return tokens, positions, allowed


class BatchVerifier:
    """The batch's side of a round (``eagle2.core.engine.decode_round``): the target and the batch's KV cache;
    every row's tree padded to the round's largest and verified in one forward, one LM head over the real nodes,
    and the accepted entries moved into place with one gather per layer for all rows."""

    def __init__(self, target, cache: BatchCache, limit: int, tap):
        self.target, self.cache, self.limit, self.tap = target, cache, limit, tap

    def room(self, row: int) -> int:
        return self.limit - self.cache.lengths[row]

    def verify(self, trees: dict[int, DraftTree]):
        target, device = self.target, self.target.device
        tokens, positions, allowed = verify_inputs(trees, self.cache.lengths, self.cache.width, self.cache.rows)
        mask = additive_mask(allowed, target.dtype, device)[0, 0].unsqueeze(1)  # (B, 1, Q, K)
        hidden = forward_target(target, tokens.to(device), self.cache.cache, attention_mask=mask,
                                position_ids=positions.to(device))  # (B, Q, H)
        rows = list(trees)
        sizes = [len(trees[r]) for r in rows]
        rows_idx = torch.repeat_interleave(torch.tensor(rows), torch.tensor(sizes)).to(device)
        cols_idx = torch.cat([torch.arange(n) for n in sizes]).to(device)
        logits = target.lm_head(hidden[rows_idx, cols_idx]).split(sizes)  # one LM head for all rows
        features = hidden if self.tap is None else self.tap.read()
        return dict(zip(rows, logits)), features, {"batch_nodes": tokens.shape[1]}

    def commit(self, kept: dict[int, list[int]]) -> None:
        self.cache.commit_rows(kept)


class BatchEngine:
    """Decodes a queue of ``BatchRequest`` in ``batch_size`` rows (``run``)."""

    def __init__(self, target, params: SamplingParams, eos_ids: set[int], batch_size: int,
                 max_context: int | None = None, refill: bool = True, batch_drafting: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        self.target, self.params, self.eos, self.rows = target, params, set(eos_ids), int(batch_size)
        self.limit = context_limit(target, max_context)
        self.refill, self.batch_drafting = refill, batch_drafting
        self.device = target.device
        self.tap = None
        self._tap_layers = None

    # -- admission ---------------------------------------------------------------------------------
    def _ensure_tap(self, drafter) -> None:
        layers = getattr(drafter, "feature_layers", None) if drafter.needs_hidden else None
        layers = tuple(layers) if layers else None
        if self._tap_layers is None and self.tap is None:
            self._tap_layers = layers
            self.tap = feature_tap(self.target, drafter)
        elif layers != self._tap_layers:
            raise ValueError("every request of a batch must read the same target features (one method per batch)")

    def _admit(self, req: BatchRequest, slot: int, cache: BatchCache) -> _Row:
        """Prefill ``req`` alone, copy its KV into ``slot``; its drafter starts."""
        self._ensure_tap(req.drafter)
        t0 = device_clock(self.device)
        single = new_cache(self.target)
        first = prefill(self.target, single, req.prompt_ids, req.drafter, self.params, req.generator, self.limit,
                        self.tap)
        cache.load_row(slot, single)
        t1 = device_clock(self.device)
        return _Row(req, Sequence(req.drafter, req.generator, [first]), t1 - t0, t1, t0)

    def _finished(self, row: _Row, length: int) -> bool:
        return row.seq.finished(row.request.max_new_tokens, self.eos, length, self.limit)

    def _output(self, row: _Row) -> GenerationOutput:
        return row.seq.output(self.eos, row.request.max_new_tokens, row.prefill_s, row.end - row.start)

    # -- one round ---------------------------------------------------------------------------------
    @torch.no_grad()
    def _round(self, live: dict[int, _Row], cache: BatchCache) -> None:
        """The shared round over every live row; its timing read at once (one wait on CUDA per round)."""
        clock, seqs = Clock(self.device), {slot: row.seq for slot, row in live.items()}
        decode_round(seqs, BatchVerifier(self.target, cache, self.limit, self.tap), self.params, clock,
                     self.batch_drafting)
        seconds = clock.resolve()
        for seq in seqs.values():
            seq.settle(seconds)

    # -- the queue ---------------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, queue: deque, on_finish: Callable[[BatchResult], None]) -> None:
        """Decode every request of ``queue`` (``on_finish`` may append more) and report each as it ends."""
        try:
            self._run(queue, on_finish)
        finally:
            if self.tap is not None:
                self.tap.close()
                self.tap, self._tap_layers = None, None

    def _run(self, queue: deque, on_finish) -> None:
        cache = BatchCache(self.target, self.rows)
        self._t0, self._epoch = device_clock(self.device), time.time()
        live: dict[int, _Row] = {}
        wave: list[tuple[int, _Row]] = []  # static batching: the wave's finished rows, reported at its end
        batch_id, wave_start = -1, None
        while queue or live:
            if queue and (self.refill or not live):
                if not live:  # an empty batch takes a new id
                    batch_id += 1
                    wave_start = None
                for slot in range(self.rows):
                    while slot not in live and queue:
                        req = queue.popleft()
                        try:
                            live[slot] = self._admit(req, slot, cache)
                        except (ContextOverflowError, RuntimeError) as exc:
                            cache.free(slot)
                            on_finish(BatchResult(req, None, batch_id, slot, None, exc, run_started=self._epoch))
                for slot in [s for s, r in live.items() if self._finished(r, cache.lengths[s])]:
                    self._retire(live.pop(slot), slot, cache, batch_id, wave, on_finish)
                if wave_start is None and live:
                    wave_start = min(r.start for r in live.values())
            if live:
                self._round(live, cache)
                for slot in [s for s, r in live.items() if self._finished(r, cache.lengths[s])]:
                    self._retire(live.pop(slot), slot, cache, batch_id, wave, on_finish)
            if not live and wave:  # static: the wave has drained
                end = max(r.end for _, r in wave)
                span = end - (wave_start if wave_start is not None else end)
                for slot, row in wave:
                    on_finish(self._result(row, slot, batch_id, span))
                wave.clear()

    def _retire(self, row: _Row, slot: int, cache: BatchCache, batch_id: int, wave: list, on_finish) -> None:
        row.end = device_clock(self.device)
        cache.free(slot)
        if self.refill:
            on_finish(self._result(row, slot, batch_id, row.end - row.start))
        else:
            wave.append((slot, row))

    def _result(self, row: _Row, slot: int, batch_id: int, span: float) -> BatchResult:
        return BatchResult(row.request, self._output(row), batch_id, slot, span, admitted_at=row.admitted - self._t0,
                           retired_at=row.end - self._t0, run_started=self._epoch)
