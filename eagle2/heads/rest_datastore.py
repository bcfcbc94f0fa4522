"""REST's datastore (He et al., 2024): a token corpus with a suffix array, searched for the longest
suffix of the context and returning what followed it; and the trie of the most frequent continuations.

The datastore is every entry's tokens concatenated with a separator (-1) between entries, and the
start positions sorted by their first ``depth`` tokens (prefix doubling, numpy): a query of up to
``depth`` tokens is found by two binary searches. As in the authors' retriever (``draftretriever``):
the query is the context's last ``max_span`` tokens, then shorter down to ``min_span``, and the first
length with any match wins; up to ``max_matches`` occurrences (suffix-array order) each give the next
``continuation`` tokens (cut at the entry's end here, where the authors' concatenation runs on into the
next entry); every prefix of a continuation is counted, and the ``choices`` most frequent prefixes form
the draft trie. Saved as one ``.npz`` (``tokens`` int32, ``suffixes`` int32, ``depth``; no pickles).
Knows nothing about models; the corpora are ``eagle2.training.support.datastore``'s. Drafter data, declared as the
drafter family ``rest_datastore`` (``eagle2.heads.family``) like the heads.

Why not the authors' ``draftretriever`` (PyPI 0.1.1, a Rust extension): it returns the trie without its
counts (no per-node confidence, no best-first siblings), the released wheel differs from the repository's
source (another ``Writer`` signature, ``long`` + 1 tokens retrieved), a one-token query aborts the Python
process (a Rust panic), and it ships for CPython 3.11 on x86-64 Linux only.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from eagle2.heads.family import Family

SEPARATOR = -1  # between entries in the datastore
PAD = -2  # past a continuation's end


def suffix_array(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Start positions sorted by their first ``depth`` tokens (a shorter suffix before its extensions,
    the separator before every token; ties in position order), by prefix doubling."""
    n = len(tokens)
    rank = tokens.astype(np.int64) + 1  # the separator ranks 0, below every token
    order = np.argsort(rank, kind="stable")
    h = 1
    while h < depth and n:
        second = np.full(n, -1, dtype=np.int64)  # past the end: below everything
        second[:-h] = rank[h:]
        order = np.lexsort((second, rank))
        r1, r2 = rank[order], second[order]
        new_group = np.r_[True, (r1[1:] != r1[:-1]) | (r2[1:] != r2[:-1])]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(new_group) - 1
        h *= 2
    return order.astype(np.int32)


class Datastore:
    def __init__(self, tokens: np.ndarray, suffixes: np.ndarray, depth: int):
        self.tokens, self.suffixes, self.depth = tokens, suffixes, int(depth)

    @classmethod
    def from_entries(cls, entries, depth: int = 16) -> "Datastore":
        """A datastore of token sequences (``entries``: iterables of token ids)."""
        parts = []
        for entry in entries:
            parts += [np.asarray(entry, dtype=np.int32), np.array([SEPARATOR], dtype=np.int32)]
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return cls(tokens, suffix_array(tokens, depth), depth)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")  # two first uses at once: each its own
        with open(tmp, "wb") as f:
            np.savez(f, tokens=self.tokens, suffixes=self.suffixes, depth=np.int64(self.depth))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Datastore":
        with np.load(str(path), allow_pickle=False) as z:
            return cls(z["tokens"], z["suffixes"], int(z["depth"]))

    def __len__(self) -> int:
        return len(self.tokens)

    def occurrences(self, query: list[int]) -> np.ndarray:
        """Start positions of ``query`` (at most ``depth`` tokens), in suffix-array order."""
        if not 0 < len(query) <= self.depth:
            raise ValueError(f"a datastore query has 1..{self.depth} tokens, not {len(query)}")
        tokens, order, n = self.tokens, self.suffixes, len(query)

        def bound(strict: bool) -> int:  # first suffix whose first n tokens are >= (> if strict) the query
            lo, hi = 0, len(order)
            while lo < hi:
                mid = (lo + hi) // 2
                start = int(order[mid])
                key = tokens[start: start + n].tolist()
                if key < query or (strict and key == query):
                    lo = mid + 1
                else:
                    hi = mid
            return lo

        return order[bound(False): bound(True)]

    def continuations(self, context: list[int], max_span: int, min_span: int, max_matches: int,
                      length: int) -> tuple[np.ndarray, int]:
        """(M, ``length``) what followed the longest matching suffix of ``context`` (at most ``max_matches``
        occurrences; cut at the entry's end, the rest PAD), and the matched length (0: none, M = 0)."""
        for span in range(min(max_span, self.depth, len(context)), min_span - 1, -1):
            starts = self.occurrences([int(t) for t in context[-span:]])[:max_matches].astype(np.int64)
            where = starts[:, None] + span + np.arange(length)  # (M, length)
            follow = self.tokens[np.minimum(where, len(self.tokens) - 1)].astype(np.int64)
            cut = np.maximum.accumulate((follow == SEPARATOR) | (where >= len(self.tokens)), axis=1)
            follow[cut] = PAD
            follow = follow[follow[:, 0] != PAD]
            if len(follow):
                return follow, span
        return np.zeros((0, length), dtype=np.int64), 0


def top_prefixes(continuations: np.ndarray, choices: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """The ``choices`` most frequent prefixes of the rows of ``continuations`` (PAD-padded) with their
    counts, most frequent first (ties: shorter, then smaller tokens, first), so that every prefix comes
    after its own prefixes and siblings come best-first."""
    candidates = []
    for d in range(1, continuations.shape[1] + 1):
        rows = continuations[continuations[:, d - 1] != PAD, :d]
        if not len(rows):
            break
        unique, counts = np.unique(rows, axis=0, return_counts=True)  # lexicographic order
        best = np.argsort(-counts, kind="stable")[:choices]  # only these can be among the top overall
        candidates += [(-int(counts[i]), d, tuple(unique[i].tolist())) for i in best]
    candidates.sort()
    chosen = candidates[:choices]
    return [path for _, _, path in chosen], [-neg for neg, _, _ in chosen]


BUILD_COMMAND = "python -m experiments.ops.build_datastore"


MEMBERS = ("tokens.npy", "suffixes.npy", "depth.npy")


def check_datastore(location: str | Path, key: str = "model.rest_datastore") -> None:
    """One line when ``location`` holds no datastore file (naming the command that builds it), or a file that is
    not a whole one (not a zip archive, cut short, without its arrays), read from its zip directory alone."""
    import zipfile

    from eagle2.heads.checkpoint import WeightLocationError

    def rebuild(flag: str = "") -> str:
        return f"build it with `{BUILD_COMMAND} --corpus chat --out {location}{flag}` (or --corpus code)"

    if not Path(location).is_file():
        raise WeightLocationError(f"{key}={location}: no REST datastore there; {rebuild()}")
    try:
        with zipfile.ZipFile(location) as archive:
            missing = [name for name in MEMBERS if name not in archive.namelist()]
    except (zipfile.BadZipFile, OSError) as exc:
        raise WeightLocationError(f"{key}={location} is not a whole REST datastore (.npz: {exc}); it is damaged or "
                                  f"was cut short: {rebuild(' --rebuild')}") from None
    if missing:
        raise WeightLocationError(f"{key}={location} is not a REST datastore (no {', '.join(missing)} in it); "
                                  f"{rebuild(' --rebuild')}")


def load_datastore(location: str | Path, target=None) -> Datastore:
    """The datastore at ``location`` (``model.rest_datastore``), checked first (``check_datastore``)."""
    check_datastore(location)
    return Datastore.load(location)


def save_datastore(store: Datastore, path: str | Path, dtype=None) -> Path:
    return store.save(path)


FAMILY = Family("rest_datastore", load_datastore, save_datastore, check_datastore,
                fixture="tests.zoo_fixtures:write_rest_datastore",
                doc="REST datastore (.npz; python -m experiments.ops.build_datastore builds one) for method=rest")
