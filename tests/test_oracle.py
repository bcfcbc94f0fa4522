"""The oracle drafter: at temperature 0 its tau is at least every other method's on the same turns
(a drafter that is off by one token fails that check), from stored plain rows or by decoding plain
itself, and it falls back to decoding when the output leaves the reference. Losslessness is certified
in ``test_lossless_new_methods.py``."""

from __future__ import annotations

import json
import math

import pytest

from eagle2.bench.oracle_references import reference_outputs
from eagle2.core.tree import DraftTree
from eagle2.drafters.oracle import OracleDrafter
from tests.test_greedy import PROMPTS, SPEC_METHODS, decode

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


def test_no_reference_rows_means_decoding(tiny, tmp_path):
    assert reference_outputs(str(tmp_path / "nothing"), "float32") == {}
    ref = decode(tiny[0], {"name": "plain"}, PROMPTS[1], 30).output_ids
    out = decode(tiny[0], {"name": "oracle", "depth": DEPTH, "reference": str(tmp_path / "nothing")}, PROMPTS[1], 30)
    assert out.output_ids == ref and all(r.drafter["oracle_from_reference"] == 0 for r in out.rounds)


def _row(method: str, settings: dict, qid: int, lengths: list[int], temperature: float = 0.0) -> dict:
    return {"status": "ok", "model": "m", "dataset": "d", "method": method, "temperature": temperature,
            "config_hash": f"{method}{sorted(settings.items())}{temperature}", "question_id": qid, "turn": 0,
            "dtype": "float32", "max_new_tokens": 64, "accept_lengths": lengths, "target_forwards": len(lengths),
            "new_tokens": sum(lengths) + 1, "wall_time_s": 1.0, "rounds": {},
            "method_config": {"name": method, **settings}}


def test_report_shows_oracle_efficiency_at_the_matching_depth(tmp_path):
    from analysis.metrics import load_rows, oracle_efficiency
    from analysis.tables import oracle_markdown, table1_frame

    rows = [_row("plain", {}, q, [1] * 8) for q in (1, 2)]
    rows += [_row("oracle", {"depth": 3}, q, [4, 4]) for q in (1, 2)]
    rows += [_row("oracle", {"depth": 5}, q, [6, 2]) for q in (1, 2)]
    rows += [_row("pld", {"k": 3}, q, [2, 2, 2, 2]) for q in (1, 2)]  # tau 2 against depth-3 oracle's 4
    rows += [_row("eagle", {"choices": [[0], [0, 0, 0, 0]]}, 1, [2, 2, 4])]  # depth 4: the depth-5 oracle
    rows += [_row("pld", {"k": 3}, 1, [8], temperature=1.0)]  # T > 0: no efficiency
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    frame = load_rows(tmp_path)
    efficiency = oracle_efficiency(frame)
    eff = efficiency.set_index("method")
    assert set(eff.index) == {"pld", "eagle"}
    assert eff.loc["pld", "oracle_depth"] == 3 and eff.loc["pld", "efficiency"] == pytest.approx(0.5)
    assert eff.loc["eagle", "oracle_depth"] == 5 and eff.loc["eagle", "turns"] == 1
    assert eff.loc["eagle", "efficiency"] == pytest.approx((8 / 3) / 4)
    assert "2.00 / 4.00 = 0.50" in oracle_markdown(efficiency)
    assert set(table1_frame(frame)[0].method) == {"pld", "eagle"}  # the oracle is a ceiling, not a Table 1 row
