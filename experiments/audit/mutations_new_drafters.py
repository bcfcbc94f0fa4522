"""Mutation audit of the one-forward drafters (P-EAGLE, DFlash, PARD) and HASS: does the test suite catch a
deliberately broken line?

Each mutation replaces one exact snippet of one source file (it must occur there exactly once), runs that family's
tests (``pytest -x``) in a subprocess, and restores the file byte for byte, its modification time included (the
subprocess writes no bytecode, so no stale ``.pyc`` of a mutant can outlive it). A mutation is caught when the tests
fail; the table names the first failing test. (Shifting every position of a forward by one is no mutation: RoPE
sees only differences, so the outputs stay the same; the position mutations here move some positions only. Nor is
counting a P-EAGLE element by its anchor's target instead of its own: COD keeps only anchors whose every depth counts.)

    python -m experiments.audit.mutations_new_drafters            # all, a markdown table at the end
    python -m experiments.audit.mutations_new_drafters --only pard --check   # the snippets still match
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
SELECTION = "tests/test_head_selection.py"
TESTS = {  # family -> the test files its mutations run against
    "peagle": ("tests/test_peagle.py", SELECTION),
    "dflash": ("tests/test_dflash.py", SELECTION),
    "pard": ("tests/test_pard.py", SELECTION),
    "hass": ("tests/test_hass.py",),
}
PEAGLE_HEAD, PEAGLE = "eagle2/heads/peagle_head.py", "eagle2/drafters/peagle.py"
PEAGLE_OBJ = "eagle2/training/objectives/peagle_head.py"
DFLASH_HEAD, DFLASH, DFLASH_OBJ = ("eagle2/heads/dflash_head.py", "eagle2/drafters/dflash.py",
                                   "eagle2/training/objectives/dflash_head.py")
PARD_HEAD, PARD, PARD_OBJ = ("eagle2/heads/pard_draft.py", "eagle2/drafters/pard.py",
                             "eagle2/training/objectives/pard_draft.py")
HASS_OBJ, EAGLE_OBJ, LOSSES = ("eagle2/training/objectives/hass.py", "eagle2/training/objectives/eagle.py",
                               "eagle2/training/support/losses.py")


class Mutation(NamedTuple):
    family: str
    name: str
    path: str
    old: str
    new: str


MUTATIONS = [
    # P-EAGLE: head, drafter
    Mutation("peagle", "slots read token 0, not ptd_token_id", PEAGLE_HEAD,
             "torch.full((count,), self.mask_token_id,", "torch.full((count,), 0,"),
    Mutation("peagle", "ptd_token_id bound check off by one", PEAGLE_HEAD,
             "0 <= head.mask_token_id < target", "0 <= head.mask_token_id <= target"),
    Mutation("peagle", "default tree one depth short", PEAGLE,
             "for d in range(depth) for r", "for d in range(depth - 1) for r"),
    Mutation("peagle", "slots drafted at the last pair's position", PEAGLE,
             "torch.arange(self.committed, self.committed + n + slots, device=self.device)",
             "torch.arange(self.committed, self.committed + n + slots, device=self.device)"
             ".clamp(max=self.committed + n - 1)"),
    Mutation("peagle", "top-k ranks worst first", PEAGLE,
             "tokens, log_conf = self.top(log_probs, self.top_k)",
             "tokens, log_conf = [c.flip(-1) for c in self.top(log_probs, self.top_k)]"),
    Mutation("peagle", "every depth reads depth 1's distribution", PEAGLE,
             "pick = (self.node_depth - 1).to(", "pick = (self.node_depth - 1).clamp(max=0).to("),
    Mutation("peagle", "budget ignores the room left", PEAGLE,
             "min(self.total_tokens, len(self.paths), room - 1)", "min(self.total_tokens, len(self.paths))"),
    Mutation("peagle", "deepest choice paths dropped", PEAGLE, "if len(p) <= depth]", "if len(p) < depth]"),
    # P-EAGLE: objective
    Mutation("peagle", "COD: anchor reach off by one", PEAGLE_OBJ,
             "reach = kept[kept + d - 1 < n_pos]", "reach = kept[kept + d < n_pos]"),
    Mutation("peagle", "COD: slot kept by the previous depth's target", PEAGLE_OBJ,
             "kept = reach[answer[reach + d - 1]]", "kept = reach[answer[reach + d - 2]]"),
    Mutation("peagle", "layout: a position does not see itself", PEAGLE_OBJ,
             "(anchor[None, :] <= anchor[:, None])", "(anchor[None, :] < anchor[:, None])"),
    Mutation("peagle", "layout: slots at their anchor's position", PEAGLE_OBJ,
             "position_ids=(anchor + depth - 1)[None]", "position_ids=(anchor + 0 * depth)[None]"),
    Mutation("peagle", "loss target: the slot's own position", PEAGLE_OBJ,
             "feats[row][(anchor + depth)[counted]]", "feats[row][(anchor + depth - 1)[counted]]"),
    Mutation("peagle", "loss target softmax at temperature 2", PEAGLE_OBJ,
             "draft_weight).float(), -1)", "draft_weight).float() / 2, -1)"),
    Mutation("peagle", "COD share one depth too deep", PEAGLE_OBJ, "ratio ** (d - 1), floor", "ratio ** d, floor"),
    # DFlash: head, drafter, objective
    Mutation("dflash", "residual around attention dropped", DFLASH_HEAD,
             "x = x + self.self_attn(", "x = self.self_attn("),
    Mutation("dflash", "no key norm", DFLASH_HEAD,
             "k = self.k_norm(self.k_proj(both).view(b, -1, self.kv_heads, self.head_dim))",
             "k = (self.k_proj(both).view(b, -1, self.kv_heads, self.head_dim))"),
    Mutation("dflash", "context features not normed", DFLASH_HEAD,
             "context = self.hidden_norm(self.fc(features))", "context = self.fc(features)"),
    Mutation("dflash", "taps read one layer early", DFLASH_HEAD,
             "taps = tuple(int(i) + 1 for i", "taps = tuple(int(i) for i"),
    Mutation("dflash", "block anchored on the oldest pending token", DFLASH,
             "block[0] = self.pending_tokens[-1]", "block[0] = self.pending_tokens[0]"),
    Mutation("dflash", "slot distributions shifted by one", DFLASH,
             "return self.log_probs(out[1:])", "return self.log_probs(out[:-1])"),
    Mutation("dflash", "layout: a block sees its anchor's own feature", DFLASH_OBJ,
             "[None, :] < anchor[:, None]", "[None, :] <= anchor[:, None]"),
    Mutation("dflash", "loss label one place early", DFLASH_OBJ,
             "labels.append(tokens[at.clamp(max=n_pos)])", "labels.append(tokens[(at - 1).clamp(max=n_pos)])"),
    Mutation("dflash", "slot decay favours later slots", DFLASH_OBJ,
             "torch.exp(-(k - 1) / gamma)", "torch.exp((k - 1) / gamma)"),
    # PARD: drafter, head, objective
    Mutation("pard", "mask slots left in the draft's cache", PARD,
             "crop(self.cache, keep + n)  #", "crop(self.cache, keep + n + slots)  #"),
    Mutation("pard", "slots read the last token's embedding", PARD_HEAD,
             "self.mask_embedding.to(embedded.dtype).expand(slots, -1)", "embedded[-1:].expand(slots, -1)"),
    Mutation("pard", "hard label: the input token", PARD_OBJ,
             "labels.append(tokens[at[kept] + 1])", "labels.append(tokens[at[kept]])"),
    Mutation("pard", "distillation target one position late", PARD_OBJ,
             "target_feats.append(feats[row][at[kept]])", "target_feats.append(feats[row][at[kept] + 1])"),
    Mutation("pard", "depths not weighted by their counts", PARD_OBJ,
             "total = total + ce * (int(at.sum()) / len(x))", "total = total + ce"),
    # HASS
    Mutation("hass", "phase 1 keeps the top-k weight", HASS_OBJ,
             '{**settings, "w_topk": 0.0} if phase == 1', "settings if phase == 1"),
    Mutation("hass", "phase 2 not started from phase 1's head", HASS_OBJ,
             'second.init_from = str(FAMILY.save(head, out_dir / "phase1_head"))',
             'FAMILY.save(head, out_dir / "phase1_head")'),
    Mutation("hass", "top-k weight not relative to w_cls", EAGLE_OBJ,
             '"top_k_weight": w_topk / w_cls}', '"top_k_weight": w_topk}'),
    Mutation("hass", "detach_unroll setting ignored", EAGLE_OBJ,
             '"detach_unroll": bool(cfg.get("detach_unroll", False))}', '"detach_unroll": False}'),
    Mutation("hass", "unroll detached when it should not be", LOSSES,
             "prev = pred[:, :-1].detach() if detach else pred[:, :-1]",
             "prev = pred[:, :-1] if detach else pred[:, :-1].detach()"),
]


def where(m: Mutation) -> str:
    """``file:line`` of the mutated snippet; raises when it does not occur exactly once."""
    text = (ROOT / m.path).read_text()
    if text.count(m.old) != 1:
        raise ValueError(f"{m.name}: the snippet occurs {text.count(m.old)} times in {m.path}: {m.old!r}")
    return f"{m.path}:{text[:text.index(m.old)].count(chr(10)) + 1}"


def run_tests(files: tuple[str, ...], timeout: float) -> tuple[bool | None, str]:
    """(tests failed, the first failing test or the reason); None: they ran out of time (a busy machine is no
    verdict: rerun it with --only)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-rfE", *files]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    if done.returncode == 0:
        return False, ""
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.M)
    return True, failed.group(1).split("/")[-1] if failed else f"pytest exit {done.returncode}"


def mutate_and_test(m: Mutation, timeout: float) -> tuple[bool | None, str]:
    """Apply ``m``, run its family's tests, restore the file exactly (content and times)."""
    path = ROOT / m.path
    original, stat = path.read_bytes(), path.stat()
    try:
        path.write_text(original.decode().replace(m.old, m.new, 1))
        return run_tests(TESTS[m.family], timeout)
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run the mutations whose family or name contains this")
    parser.add_argument("--check", action="store_true", help="only check that every snippet occurs once")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutation's test run")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only in m.family or args.only in m.name]
    places = [where(m) for m in chosen]
    if args.check:
        print(f"{len(chosen)} mutations, every snippet found once")
        return 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill still restores the file (finally)
    rows, caught = [], 0
    for i, (m, place) in enumerate(zip(chosen, places), start=1):
        start = time.monotonic()
        failed, by = mutate_and_test(m, args.timeout)
        verdict = {True: "caught", False: "MISSED", None: "NO VERDICT"}[failed]
        caught += failed is True
        rows.append(f"| {m.family} | {m.name} | `{place}` | {by if failed else verdict} |")
        print(f"[{i}/{len(chosen)}] {verdict} {m.name} ({place}) "
              f"{by} {time.monotonic() - start:.0f} s", flush=True)
    print("\n| family | mutation | file:line | caught by |\n|---|---|---|---|\n" + "\n".join(rows))
    print(f"\ncaught {caught} of {len(chosen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
