"""What EAGLE and EAGLE-2 share: running the feature-level head over committed context and over a
growing draft tree, with its own KV cache.

Head position j holds the pair (token t[j+1], target feature f[j]). After a commit the head catches
up on the new pairs; the output at its last position predicts the root's feature, whose LM-head
distribution gives the root's children. A tree node at depth d is fed as (its token, the feature
predicted at its parent) at position committed + d - 1, attending to the committed context and its
own fed ancestors. Tree entries are dropped from the head cache at the next catch-up.
"""

from __future__ import annotations

import logging
import weakref

import torch

from eagle2.core.cache import crop, new_cache
from eagle2.core.clock import Spans
from eagle2.core.kernels import PackedLinear
from eagle2.core.tree import additive_mask
from eagle2.heads.eagle_head import causal_mask
from eagle2.heads.static_head import forward_head

log = logging.getLogger(__name__)
_LM_HEAD_COPIES: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def drafting_lm_head(lm_head: torch.nn.Linear, dtype: torch.dtype | None = None,
                     vocab: torch.Tensor | None = None) -> torch.nn.Linear:
    """The LM head used for drafting: the target's own, or a cached copy restricted to the token ids
    ``vocab`` (a reduced draft vocabulary) and/or cast to ``dtype`` (bf16 is cheaper on CPU).
    Verification always uses the target's own head, so this changes draft quality, never the output:
    a token outside ``vocab`` is simply never proposed. A bf16 copy is oneDNN-packed when the target's
    own head is (``eagle2.core.kernels``)."""
    if (dtype is None or dtype == lm_head.weight.dtype) and vocab is None:
        return lm_head
    dtype = dtype or lm_head.weight.dtype
    # the device is part of the key: a copy made while the head sat elsewhere is never handed out again
    key = (dtype, None if vocab is None else tuple(vocab.tolist()), str(lm_head.weight.device))
    copies = _LM_HEAD_COPIES.setdefault(lm_head, {})
    if key not in copies:
        rows = slice(None) if vocab is None else vocab.to(lm_head.weight.device)
        weight = lm_head.weight[rows]
        copy = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=lm_head.bias is not None,
                               device=weight.device, dtype=dtype)
        with torch.no_grad():
            copy.weight.copy_(weight)
            if lm_head.bias is not None:
                copy.bias.copy_(lm_head.bias[rows])
        copy.requires_grad_(False)
        copies[key] = PackedLinear(copy) if isinstance(lm_head, PackedLinear) and dtype == torch.bfloat16 else copy
    return copies[key]


def draft_vocabulary(head, size):
    """The ``size`` most frequent token ids of the head's shipped draft vocabulary (None = full vocab)."""
    if not size:
        return None
    if getattr(head, "draft_vocab", None) is None:
        log.warning("method.draft_vocab_size=%s but this EAGLE head ships no draft_vocab.safetensors: "
                    "drafting over the full vocabulary", size)
        return None
    return head.draft_vocab[: int(size)]


def drafting_settings(method_cfg, head) -> dict:
    """The drafting LM head's dtype and vocabulary, from an EAGLE method config."""
    from eagle2.core.precision import resolve_dtype

    dtype = method_cfg.get("draft_lm_head_dtype")
    return {"lm_head_dtype": resolve_dtype(dtype) if dtype else None,
            "vocab": draft_vocabulary(head, method_cfg.get("draft_vocab_size"))}


class HeadRunner:
    """Runs a feature-level head: an EAGLE-1/2 head (``eagle2.heads.eagle_head``: drafts through the target's LM
    head, reads the target's last hidden states) or an EAGLE-3 head (``eagle2.heads.eagle3_head``: drafts
    through its own norm + LM head over its draft vocabulary, reads the inputs of the target layers it
    names in ``feature_layers``, which the engine captures for it)."""

    needs_hidden = True

    def __init__(self, head, lm_head, device, lm_head_dtype: torch.dtype | None = None,
                 vocab: torch.Tensor | None = None):
        self.head, self.device = head, device
        self.dtype = next(head.parameters()).dtype
        self.feature_layers = getattr(head, "feature_layers", None)  # None: the target's last hidden states
        if hasattr(head, "drafting_lm_head"):  # a head with its own LM head and draft vocabulary
            if vocab is not None:
                log.warning("this head drafts over its own vocabulary: method.draft_vocab_size is ignored")
            self.lm_head, vocab = head.drafting_lm_head(), head.draft_token_ids()
            self.lm_head_dtype = self.dtype
        else:
            self.lm_head = drafting_lm_head(lm_head, lm_head_dtype, vocab)
            self.lm_head_dtype = self.lm_head.weight.dtype
        self.lm_head_device = next(self.lm_head.parameters()).device  # the last GPU's, when the target spans several
        self.vocab = None if vocab is None else vocab.to(device)  # token id of each drafting logit
        self.spans = Spans(device)  # its own forwards, read after the generation
        self.cache, self.committed = None, 0  # the head's KV cache and the positions it holds (``start``)
        self.pending_tokens, self.pending_feats = [], []  # (token, feature) pairs not yet fed
        self.fed = 0  # tree nodes fed to the head since the catch-up
        self.fed_ancestors = torch.zeros(0, 0, dtype=torch.bool, device=device)  # [i, j]: j is i or its ancestor
        self.root_feature = None  # the head's output at the root of the tree being drafted

    # -- committed context -------------------------------------------------------------------
    def start(self, prompt_ids, first_token, prompt_hidden) -> None:
        self.cache = new_cache(self.head)
        self.spans.clear()
        self.committed = 0
        self.pending_tokens = list(prompt_ids[1:]) + [first_token]
        self.pending_feats = [prompt_hidden]

    def observe(self, new_tokens, hidden) -> None:
        self.pending_tokens.extend(new_tokens)
        self.pending_feats.append(hidden)

    def _head(self, tokens, feats, positions, mask) -> torch.Tensor:
        with self.spans.span():
            return forward_head(self.head, tokens[None], feats[None], positions[None], mask, self.cache)[0]

    def batch_key(self) -> tuple:
        """Drafters with equal keys draft their rows together (``eagle2.drafters.head_group``): the same head,
        drafting LM head on one device (the LM head stands for the vocabulary: a reduced one is a copy cached per
        vocabulary, an EAGLE-3 head's is its own); subclasses add their tree's settings."""
        own = hasattr(self.head, "drafting_lm_head")  # its LM head is made of the head's own modules
        return type(self), id(self.head), None if own else id(self.lm_head), self.lm_head_dtype, str(self.device)

    def catch_up(self) -> torch.Tensor:
        """Feed pending pairs; return log-probabilities (V,) of the root's children."""
        return self.log_probs(self.catch_up_feature()[None])[0]

    def catch_up_feature(self) -> torch.Tensor:
        """Feed pending pairs; return the feature predicted at the root (H,), also kept as ``root_feature``."""
        n = len(self.pending_tokens)
        out = self._feed_pending(n)
        self.caught_up(0, out[-1])
        return self.root_feature

    def feed_backlog(self, leave: int) -> None:
        """Feed all pending pairs but the last ``leave`` (a batched catch-up, ``eagle2.drafters.head_group``,
        feeds those for several rows at once)."""
        self._feed_pending(len(self.pending_tokens) - leave)

    def caught_up(self, fed: int, root_feature: torch.Tensor) -> None:
        """The catch-up is done: ``fed`` pending pairs were written into this head's cache by the caller (none
        left pending), ``root_feature`` is the head's output at the last; the tree starts empty."""
        self.committed += fed
        self.pending_tokens, self.pending_feats = [], []
        self.fed = 0  # tree nodes fed to the head since the catch-up
        self.fed_ancestors = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [i, j]: j is i or its ancestor
        self.root_feature = root_feature

    def _feed_pending(self, count: int) -> torch.Tensor:
        """Feed the first ``count`` pending pairs behind the committed entries (tree entries dropped); they are
        committed, no longer pending. Returns the head's outputs at them (count, H)."""
        crop(self.cache, self.committed)
        # features come from the target's last layers (the last GPU when it spans several): onto the head's
        feats = torch.cat([f.to(self.device, self.dtype) for f in self.pending_feats])
        tokens = torch.tensor(self.pending_tokens[:count], device=self.device)
        positions = torch.arange(self.committed, self.committed + count, device=self.device)
        mask = causal_mask(count, self.committed, self.dtype, self.device)
        out = self._head(tokens, feats[:count], positions, mask)
        self.committed += count
        self.pending_tokens, self.pending_feats = self.pending_tokens[count:], [feats[count:]]
        return out

    # -- the draft tree ----------------------------------------------------------------------
    def top(self, log_probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most likely children along the last axis: (token ids, log-confidences), best first."""
        top = torch.topk(log_probs, k, dim=-1)
        tokens = top.indices if self.vocab is None else self.vocab[top.indices]
        return tokens, top.values

    def log_probs(self, features: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the drafting vocabulary (the full one unless reduced), on the head's device
        (``features`` go to the drafting LM head's device and dtype: the target's, on its last GPU)."""
        with self.spans.span():
            return self.log_probs_unspanned(features)

    def log_probs_unspanned(self, features: torch.Tensor) -> torch.Tensor:
        """``log_probs`` without a span of its own (a caller timing several rows at once opens theirs)."""
        logits = self.lm_head(features.to(self.lm_head_device, self.lm_head_dtype)).float()
        return torch.log_softmax(logits.to(self.device), dim=-1)

    def expand(self, tokens: torch.Tensor | list[int], parent_fed: torch.Tensor | list[int], depth: int,
               parent_features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed tree nodes of one depth: their ``tokens`` (n,), ``parent_fed[i]`` the fed index of node i's
        parent (-1 for the root), ``parent_features`` (n, H) the features predicted at the parents. Tensors
        on the device stay there: the ancestor mask is built on the device from the fed nodes' ancestor
        matrix, so a depth costs no host sync (a list is copied once). Returns (log-probs of their children
        (n, V), their predicted features (n, H))."""
        if not torch.is_tensor(tokens):
            tokens = torch.tensor(tokens, device=self.device)
        if not torch.is_tensor(parent_fed):
            parent_fed = torch.tensor(parent_fed, dtype=torch.long, device=self.device)
        n, first = tokens.shape[0], self.fed
        inherited = (self.fed_ancestors[parent_fed.clamp(min=0)] & (parent_fed >= 0)[:, None] if first else
                     torch.zeros(n, 0, dtype=torch.bool, device=self.device))  # (n, first): the parent's row
        new = torch.cat([inherited, torch.eye(n, dtype=torch.bool, device=self.device)], dim=1)  # (n, first + n)
        widened = torch.cat([self.fed_ancestors, torch.zeros(first, n, dtype=torch.bool, device=self.device)], dim=1)
        self.fed_ancestors, self.fed = torch.cat([widened, new]), first + n
        allowed = torch.cat([torch.ones(n, self.committed, dtype=torch.bool, device=self.device), new], dim=1)
        positions = torch.full((n,), self.committed + depth - 1, device=self.device)
        out = self._head(tokens.to(self.device), parent_features, positions,
                         additive_mask(allowed, self.dtype, self.device))
        return self.log_probs(out), out


def to_host(*columns: torch.Tensor) -> list[torch.Tensor]:
    """Per-node columns of a drafted tree (token ids, float scores; equal length) moved to the host in
    ONE transfer, as float64 (exact for float32 scores and for token ids below 2**53), back in their dtypes."""
    host = torch.stack([c.to(torch.float64) for c in columns]).cpu()
    return [row.to(c.dtype) for row, c in zip(host, columns)]


def path_log_values(parents: torch.Tensor, log_conf: torch.Tensor) -> torch.Tensor:
    """log V of every drafted node: the sum of log-confidences from the root (parents come first)."""
    value = log_conf.clone()
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            value[i] += value[p]
    return value


def tree_from_drafted(root: int, tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor,
                      rank: torch.Tensor, log_conf: torch.Tensor, log_value: torch.Tensor, keep: torch.Tensor,
                      **meta):
    """Flatten kept drafted nodes into a DraftTree, with per-node records of every drafted node.

    Every column is on the host (drafters move them in one transfer: ``to_host``). Drafted nodes are
    indexed so that parents precede children and siblings are contiguous and best-first; ``parents``
    holds drafted indices (-1 for the root); ``keep`` (ascending) must be closed under taking parents.
    """
    from eagle2.core.tree import DraftTree

    parent_list, keep_list = parents.tolist(), keep.tolist()  # bookkeeping on Python lists, no tensor reads
    tree_index = [-1] * len(parent_list)
    for j, i in enumerate(keep_list):
        tree_index[i] = j + 1
    kept_parents = [0 if parent_list[i] < 0 else tree_index[parent_list[i]] for i in keep_list]
    if any(p < 0 for p in kept_parents):
        raise ValueError("kept draft nodes are not connected to the root")
    conf = log_conf.exp()
    tree = DraftTree(torch.cat([torch.tensor([root]), tokens[keep]]), torch.tensor([-1, *kept_parents]),
                     confidence=torch.cat([torch.ones(1), conf[keep]]), meta=meta)
    parent_tree_index = [0 if p < 0 else tree_index[p] for p in parent_list]  # 0: the root
    tree.records = {"depth": depth.tolist(), "rank": rank.tolist(), "confidence": conf.tolist(),
                    "value": log_value.exp().tolist(), "tree_index": tree_index,
                    "parent_tree_index": parent_tree_index}
    return tree
