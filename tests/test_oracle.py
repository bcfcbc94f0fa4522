"""The oracle drafter: at temperature 0 its tau is at least every other method's on the same turns
(a drafter that is off by one token fails that check), from stored plain rows or by decoding plain
itself, and it falls back to decoding when the output leaves the reference. Losslessness is certified
in ``test_lossless_new_methods.py``."""

from __future__ import annotations

import json
import math

import pytest

from eagle2.drafters.oracle import OracleDrafter, reference_outputs
from eagle2.tree import DraftTree
from tests.test_greedy import PROMPTS, SPEC_METHODS, decode, tiny  # noqa: F401  (tiny: the fixture)

DEPTH = 4  # every other method below drafts at most 4 deep
OTHERS = {**{k: v for k, v in SPEC_METHODS.items() if k != "eagle2_auto"},
          "pld": {"name": "pld", "k": 4}, "hybrid": {**SPEC_METHODS["eagle2"], "lookup_branch": True}}


def _tau(out) -> float:
    return sum(out.accept_lengths) / out.target_forwards


def _taus(tiny, method, **kw) -> list[float]:
    target, draft, head = tiny
    return [_tau(decode(target, method, prompt, 40, head=head, draft=draft, **kw)) for prompt in PROMPTS]


def oracle_dominates(tiny) -> bool:
    oracle = _taus(tiny, {"name": "oracle", "depth": DEPTH})
    return all(o >= t for name, method in OTHERS.items() for o, t in zip(oracle, _taus(tiny, method)))


def test_oracle_tau_is_at_least_every_methods(tiny):
    assert oracle_dominates(tiny)


def _off_by_one(self, root, room):
    """Broken oracle: proposes the continuation one token late."""
    tree = self.decoder.propose(root, min(self.depth + 1, room) + 1)
    return DraftTree.chain(root, tree.tokens[2:].tolist())


def test_dominance_check_catches_an_off_by_one_oracle(tiny, monkeypatch):
    monkeypatch.setattr(OracleDrafter, "propose", _off_by_one)
    assert not oracle_dominates(tiny)


def _write_plain_rows(path, tiny, prompts, n=40, corrupt_at=None):
    rows = []
    for prompt in prompts:
        output = decode(tiny[0], {"name": "plain"}, prompt, n).output_ids
        if corrupt_at is not None:
            output[corrupt_at] = (output[corrupt_at] + 1) % 16
        rows.append({"status": "ok", "method": "plain", "temperature": 0.0, "dtype": "float32",
                     "prompt_ids": prompt, "output_ids": output})
    rows.append({**rows[0], "method": "sps"})  # not plain: ignored
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_oracle_from_stored_plain_rows(tiny, tmp_path):
    _write_plain_rows(tmp_path / "plain-x.jsonl", tiny, PROMPTS)
    refs = reference_outputs(str(tmp_path), "float32")
    assert set(refs) == {tuple(p) for p in PROMPTS}
    for prompt in PROMPTS:
        ref = decode(tiny[0], {"name": "plain"}, prompt, 40).output_ids
        out = decode(tiny[0], {"name": "oracle", "depth": DEPTH, "reference": str(tmp_path)}, prompt, 40)
        assert out.output_ids == ref
        assert all(r.drafter["oracle_from_reference"] == 1 for r in out.rounds)
        assert all(r.draft_forward_s == 0 for r in out.rounds)  # no look-ahead forwards needed
        assert len(out.rounds) == math.ceil((len(ref) - 1) / (DEPTH + 1))  # every draft accepted


def test_oracle_decodes_itself_where_the_output_leaves_the_reference(tiny, tmp_path):
    _write_plain_rows(tmp_path / "plain-y.jsonl", tiny, PROMPTS[:1], corrupt_at=10)
    ref = decode(tiny[0], {"name": "plain"}, PROMPTS[0], 40).output_ids
    out = decode(tiny[0], {"name": "oracle", "depth": DEPTH, "reference": str(tmp_path)}, PROMPTS[0], 40)
    assert out.output_ids == ref
    sources = [r.drafter["oracle_from_reference"] for r in out.rounds]
    assert sources[0] == 1 and 0 in sources


def test_reference_needs_rows(tmp_path):
    with pytest.raises(FileNotFoundError):
        reference_outputs(str(tmp_path / "nothing"), "float32")
