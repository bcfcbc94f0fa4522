"""Lookahead decoding (Fu et al., 2024): no draft model; a Jacobi window of guesses rides in every target
forward beside the verification branch, and the n-grams its trajectory produces fill a pool of candidates.

The window has ``n - 1`` levels (the oldest first): level 0 holds ``w - 1`` guesses, levels 1 .. n - 2 hold
``w`` each. In the verify forward (the authors' attention mask, as a tree): level 0 is a chain under the
root; the level-1 token of column i hangs under level 0's token i - 1 (under the root for i = 0), and the
level-l token under column i's level l - 1. Every window node is a non-candidate (``DraftTree.candidate``),
so the acceptance rule never sees it. From the target's argmax at the last level's nodes
(``observe_target``) come, per column i, one n-gram: level 0's token i - 1 (the root for i = 0) as the key,
then column i's tokens of levels 1 .. n - 2 and the new argmax; each key keeps its ``g`` most recent
n-grams (least recently used dropped). The window then moves one step whatever was accepted: level 0 takes
level 1 without its first token, each level the next one's tokens, the last level the new argmaxes.

Warm-up, as the authors': level 0 starts as ``w + n - 3`` tokens drawn from the prompt (seeded), and the
first n - 2 rounds fill the levels (each adds the argmaxes at the newest level, every level dropping its
first token). The verification branch: the pool's n-grams for the root (most recent first) as one trie of
candidates. ``pool_from_prompt`` (the authors' option, off by default) also puts every n-gram of the
prompt and of the output into the pool; the branch then runs from the first round.

Candidates are chosen deterministically (no ``q_draft``): lossless at any temperature under the shared
rule for deterministically chosen children; the window always follows the target's argmax (the authors'
choice). Near the end of the context, a round without room for the whole window verifies no window.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from eagle2.core.tree import DraftTree
from eagle2.drafters import setting_checks as checks
from eagle2.drafters.lookup import chains_to_tree


@dataclass(frozen=True)
class LookaheadSettings:
    window: int = 7  # W: columns of the Jacobi window
    ngram: int = 5  # N: n-gram size; the window keeps N - 1 levels
    guess_set: int = 7  # G: n-grams kept per key (least recently used dropped)
    pool_from_prompt: bool = False
    seed: int = 0  # the draw of the initial window from the prompt (fixed: decoding is reproducible)

    def __post_init__(self):
        if self.window < 2 or self.ngram < 3 or self.guess_set < 1:
            raise ValueError("lookahead needs window >= 2, ngram >= 3 and guess_set >= 1")


class NgramPool:
    """Key token -> its most recently used n-grams (tuples of n - 1 tokens), at most ``size`` each."""

    def __init__(self, size: int):
        self.size, self.grams = size, {}

    def add(self, key: int, gram: tuple[int, ...]) -> None:
        grams = self.grams.setdefault(key, [])
        if gram in grams:
            grams.remove(gram)
        elif len(grams) == self.size:
            grams.pop(0)
        grams.append(gram)

    def candidates(self, key: int) -> list[list[int]]:
        """The n-grams that follow ``key``, most recent first."""
        return [list(g) for g in reversed(self.grams.get(key, []))]


class LookaheadDrafter:
    needs_hidden = False
    forward_time = 0.0  # no model forwards: the window rides in the target's

    def __init__(self, settings: LookaheadSettings):
        self.settings = settings

    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        s = self.settings
        draw = random.Random(s.seed)
        self.levels = [[draw.choice(prompt_ids) for _ in range(s.window + s.ngram - 3)]]
        self.pool = NgramPool(s.guess_set)
        self.sequence = list(prompt_ids) + [first_token]
        if s.pool_from_prompt:
            for end in range(s.ngram, len(self.sequence) + 1):
                self._add_tail(end)
        self.window_nodes = None  # per level, the tree indices of this round's window (None: no window)

    def _add_tail(self, end: int) -> None:
        """The n-gram of ``sequence`` ending before ``end`` into the pool."""
        gram = self.sequence[end - self.settings.ngram: end]
        self.pool.add(gram[0], tuple(gram[1:]))

    def _filled(self) -> bool:
        return len(self.levels) == self.settings.ngram - 1

    def propose(self, root: int, room: int) -> DraftTree:
        chains = self.pool.candidates(root) if (self._filled() or self.settings.pool_from_prompt) else []
        trie = chains_to_tree(root, chains, max(room - 1, 0))
        tokens, parents = trie.tokens.tolist(), trie.parents.tolist()
        n_candidates = len(tokens)
        window = sum(len(level) for level in self.levels)
        self.window_nodes = None
        if n_candidates + window <= room:
            self.window_nodes = self._place_window(tokens, parents)
        candidate = torch.arange(len(tokens)) < n_candidates
        return DraftTree(torch.tensor(tokens), torch.tensor(parents), confidence=torch.ones(len(tokens)),
                         candidate=candidate, meta={"lookahead_candidates": n_candidates - 1,
                                                    "lookahead_window": len(tokens) - n_candidates})

    def _place_window(self, tokens: list[int], parents: list[int]) -> list[list[int]]:
        """Append the window's nodes to ``tokens``/``parents``; returns each level's node indices."""
        placed = []
        for depth, level in enumerate(self.levels):
            nodes = []
            for i, token in enumerate(level):
                if depth == 0:
                    parent = nodes[-1] if nodes else 0
                elif depth == 1:
                    parent = placed[0][i - 1] if i else 0
                else:
                    parent = placed[depth - 1][i]
                nodes.append(len(tokens))
                tokens.append(token)
                parents.append(parent)
            placed.append(nodes)
        return placed

    def observe_target(self, tree: DraftTree, target_logits: torch.Tensor) -> None:
        if self.window_nodes is None:
            return
        newest = target_logits[self.window_nodes[-1]].argmax(-1).tolist()  # the next Jacobi iterate
        levels = self.levels
        if not self._filled():  # warm-up: one more level
            self.levels = [level[1:] for level in levels] + [newest if len(levels) == 1 else newest[1:]]
            return
        root = int(tree.tokens[0])
        for i, token in enumerate(newest):
            key = levels[0][i - 1] if i else root
            self.pool.add(key, tuple(level[i] for level in levels[1:]) + (token,))
        self.levels = [levels[1][1:], *levels[2:], newest]

    def observe(self, new_tokens, hidden) -> None:
        start = len(self.sequence)
        self.sequence.extend(new_tokens)
        if self.settings.pool_from_prompt:
            for end in range(max(start + 1, self.settings.ngram), len(self.sequence) + 1):
                self._add_tail(end)


CHECKS = {"window": checks.integer(2), "ngram": checks.integer(3), "guess_set": checks.integer(1),
          "pool_from_prompt": checks.boolean()}  # run before any model loads (eagle2.bench.validation)


def build(method_cfg, target, params, generator, weights: dict) -> LookaheadDrafter:
    return LookaheadDrafter(LookaheadSettings(window=int(method_cfg.get("window", 7)),
                                              ngram=int(method_cfg.get("ngram", 5)),
                                              guess_set=int(method_cfg.get("guess_set", 7)),
                                              pool_from_prompt=bool(method_cfg.get("pool_from_prompt", False))))
