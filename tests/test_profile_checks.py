"""Cost profiles that cannot poison later runs: the shape check, the T(1) probe against a cached profile
(a planted flat one, as a busy machine wrote), a measurement that stays bad used but never cached, the
profile each row was priced with, and the command that shows and clears them."""

from __future__ import annotations

import json

import pytest

import eagle2.bench.cost_profile as cp
from eagle2.bench import profile_cache
from eagle2.bench.profile_checks import MEASURE_ATTEMPTS, profile_problems, stale_reason
from eagle2.drafters.budget import CostProfile
from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
from tests.conftest import tiny_head, tiny_llama

MS = 1e-3
QUIET = CostProfile([(35 + 33 * q / 24) * MS for q in range(25)], [10 * MS, 20 * MS, 30 * MS], 256,
                    {"noise": 0.05})  # T(1) 35 ms, T(25) 68 ms: the same config on a quiet machine
FLAT = CostProfile([394 * MS] * 25, [96 * MS, 4.6 * MS, 60 * MS], 256, {})  # the two written under load
FLAT_ONLY = CostProfile([394 * MS] * 25, [10 * MS, 20 * MS, 30 * MS], 256, {})


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(vocab=16, layers=2, seed=0, scale=10.0)
    return target, tiny_head(target, seed=2)


def get(target, head, tmp_path, **kw):
    def make_drafter(d):
        return Eagle2Drafter(head, target.lm_head, target.device, depth=d, top_k=2, total_tokens=1)

    return cp.get_profile(target, head, {}, make_drafter, depth=3, top_k=2, profile_dir=tmp_path, max_q=6, reps=2,
                          context=8, **kw)


def plant(tmp_path, target, head, profile: CostProfile):
    key = cp.profile_key(target, head, {}, 3, 2, 8, 6)
    path = tmp_path / f"{key}.json"
    path.write_text(json.dumps({"verify_s": profile.verify_s[:6], "draft_s": profile.draft_s, "context": 8,
                                "meta": profile.meta, "rows": 1}))
    return path


def test_the_shape_check_refuses_the_profiles_a_busy_machine_wrote():
    assert profile_problems(QUIET) == []
    assert profile_problems(FLAT) == ["drafting costs 96.0 ms at depth 1 but 4.6 ms at depth 2"]
    spiked = CostProfile([35 * MS] * 3, [MS, 2 * MS], 256, {"verify_raw_s": [0.4, 0.4, 0.4, 0.04, 0.04, 0.04, 0.04]})
    assert profile_problems(spiked) == ["T(q) falls from 400.0 ms at q=1 to 40.0 ms at q=4, beyond its noise"]
    noisy = CostProfile([0.04] * 3, [MS, 0.8 * MS], 256, {"noise": 0.2})  # within 3 x its measured noise
    assert profile_problems(noisy) == []


def test_a_flat_profile_passes_the_shape_check_but_not_the_probe():
    """A curve pooled flat by a burst of load is non-decreasing: the T(1) probe is what tells it apart."""
    assert profile_problems(FLAT_ONLY) == []
    assert stale_reason(FLAT_ONLY, (35 * MS, 0.03)) == "T(1) measures 35.00 ms now against 394.00 ms stored " \
                                                       "(beyond 50%)"
    assert stale_reason(QUIET, (40 * MS, 0.03)) is None  # 14 % away: within the tolerance


@pytest.mark.parametrize("planted", [FLAT, FLAT_ONLY])
@pytest.mark.usefixtures("steady_timings")
def test_a_planted_flat_profile_is_measured_again_and_replaced(planted, tiny, tmp_path, monkeypatch, capsys):
    target, head = tiny
    monkeypatch.setattr(cp, "_loaded", {})
    path = plant(tmp_path, target, head, planted)
    profile = get(target, head, tmp_path)
    assert "is measured again" in capsys.readouterr().out
    stored = json.loads(path.read_text())
    assert stored["verify_s"] == profile.verify_s and profile.verify_s[0] < 0.394 / 10  # the steady T(1)
    assert {"noise", "probe_t1_s", "verify_raw_s"} <= set(stored["meta"]) and profile_problems(profile) == []


@pytest.mark.usefixtures("steady_timings")
def test_a_measurement_that_stays_bad_is_used_once_and_never_cached(tiny, tmp_path, monkeypatch):
    target, head = tiny
    monkeypatch.setattr(cp, "_loaded", {})
    calls = []

    def busy_draft(*a, **k):  # depth 2 cheaper than depth 1 by far, every time
        calls.append(1)
        return [0.096, 0.0046, 0.060]

    monkeypatch.setattr(cp, "measure_draft", busy_draft)
    profile = get(target, head, tmp_path)
    assert len(calls) == MEASURE_ATTEMPTS and profile.meta["cached"] is False
    assert not list(tmp_path.glob("*.json"))  # a later run measures again


@pytest.mark.usefixtures("steady_timings")
def test_rows_record_the_profile_they_were_priced_with(tmp_path, smollm2):
    from eagle2.bench.runner import run
    from eagle2.heads.eagle_head import save_head
    from eagle2.results.store import read_rows
    from tests.conftest import tiny_head as head_of
    from tests.test_runner import config

    head_dir = save_head(head_of(smollm2[0]), tmp_path / "head")
    common = ["dataset=nq", "dataset.limit=1", "max_new_tokens=4", f"model.head={head_dir}", "model.dtype=float32",
              f"paths.results={tmp_path / 'r'}"]
    run(config("method=eagle2", "method.total_tokens=auto", "method.max_total_tokens=4",
               f"method.profile_dir={tmp_path / 'profiles'}", *common))
    run(config("method=eagle2", "method.total_tokens=4", *common))
    rows = {r["method_config"]["total_tokens"]: r for r in read_rows_of(tmp_path / "r", read_rows)}
    stamp = rows["auto"]["cost_profile"]
    (cached,) = (tmp_path / "profiles").glob("*.json")
    assert stamp["key"] == cached.stem and stamp["t1_s"] == json.loads(cached.read_text())["verify_s"][0]
    assert stamp["noise"] >= 0 and rows[4]["cost_profile"] is None


def read_rows_of(folder, read_rows):
    return [r for path in folder.rglob("*.jsonl") for r in read_rows(path)]


def test_the_command_shows_and_clears_them(tmp_path, capsys):
    for name, profile in (("quiet", QUIET), ("busy", FLAT)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"verify_s": profile.verify_s, "draft_s": profile.draft_s,
                                                           "context": 256, "meta": profile.meta, "rows": 1}))
    (tmp_path / "torn.json").write_text('{"verify_s": [')
    profile_cache.main(["--dir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"3 cost profile(s) in {tmp_path}"
    busy, quiet, torn = lines[1:]
    assert "T(1) 394.0 ms, T(25) 394.0 ms" in busy and "REFUSED: drafting costs 96.0 ms at depth 1" in busy
    assert "T(1) 35.0 ms, T(25) 68.0 ms, draft by depth 10.0/20.0/30.0 ms, noise 5%" in quiet and "REFUSED" not in quiet
    assert torn.startswith("torn: unreadable")
    profile_cache.main(["--dir", str(tmp_path), "--clear"])
    assert not list(tmp_path.glob("*.json"))
