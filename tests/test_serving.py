"""The open-loop serving benchmark (``eagle2.bench.serving``): seeded arrivals, and the latency bookkeeping of the
scheduler on a fake clock with fake rows whose costs are known."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eagle2.bench import serving
from eagle2.results import serving_stats


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)


class FakeRows:
    """Prefill costs ``prefill`` s, a round ``round_s`` s and gives every live row one token; a request is a
    number of tokens to emit."""

    def __init__(self, clock, prefill=1.0, round_s=0.5):
        self.clock, self.prefill, self.round_s, self.live, self.rounds = clock, prefill, round_s, {}, 0

    def admit(self, slot, tokens):
        if tokens <= 0:
            raise ValueError("does not fit")
        self.clock.t += self.prefill
        self.live[slot] = [tokens, 1]

    def round(self):
        self.clock.t += self.round_s
        self.rounds += 1
        for row in self.live.values():
            row[1] += 1

    def finished(self, slot):
        return self.live[slot][1] >= self.live[slot][0]

    def retire(self, slot):
        _, made = self.live.pop(slot)
        return SimpleNamespace(output_ids=[0] * made)


def run(requests, arrivals, batch_size, **costs):
    clock = FakeClock()
    rows, done = FakeRows(clock, **costs), {}
    serving.serve(rows, requests, arrivals, batch_size, clock,
                  lambda req, timing, out: done.setdefault(len(done), (req, timing, out)))
    return [done[i] for i in range(len(done))], rows


def test_arrivals_are_seeded_and_scale_with_the_rate():
    a = serving.poisson_arrivals(50, 2.0, seed=3)
    assert a == serving.poisson_arrivals(50, 2.0, seed=3) != serving.poisson_arrivals(50, 2.0, seed=4)
    assert a == sorted(a) and a[0] > 0
    assert serving.poisson_arrivals(50, 4.0, seed=3) == pytest.approx([t / 2 for t in a])
    many = serving.poisson_arrivals(20000, 5.0, seed=0)
    assert many[-1] / len(many) == pytest.approx(1 / 5.0, rel=0.03)  # mean gap 1 / rate
    with pytest.raises(ValueError, match="rate"):
        serving.poisson_arrivals(3, 0.0, seed=0)


def test_one_request_alone_has_the_times_its_costs_give():
    (req, timing, out), = run([4], [2.0], batch_size=2)[0]
    # arrives at 2, prefill 1 s -> first token at 3; 3 rounds of 0.5 s -> finished at 4.5
    assert (timing.arrival, timing.admitted, timing.first_token, timing.finished) == (2.0, 2.0, 3.0, 4.5)
    assert timing.ttft == 1.0 and timing.tpot == pytest.approx(0.5) and timing.e2e == 2.5 and timing.tokens == 4


def test_a_request_waits_for_a_free_row_and_its_queueing_counts():
    done, _ = run([3, 3], [0.0, 0.0], batch_size=1)
    (_, first, _), (_, second, _) = done
    assert first.finished == 2.0  # prefill 1 + 2 rounds
    assert second.admitted == 2.0 and second.ttft == 3.0 and second.e2e == 4.0


def test_rows_share_rounds_and_an_idle_server_waits_for_the_next_arrival():
    done, rows = run([3, 3, 2], [0.0, 0.2, 10.0], batch_size=2)
    times = {req: t for req, t, _ in done}
    late = [t for req, t, _ in done if t.arrival == 10.0][0]
    assert late.admitted == 10.0 and late.first_token == 11.0 and late.finished == 11.5
    assert rows.rounds == 3  # two rounds shared by the first two rows, one for the late one
    assert len(times) == 2 and len(done) == 3


def test_a_request_that_cannot_start_is_reported_and_holds_no_row():
    done, _ = run([0, 2], [0.0, 0.0], batch_size=1)
    assert done[0][2] is None and done[1][1].finished == 1.5


def test_summary_percentiles_and_goodput():
    timings = [serving_stats.Timing(0.0, 0.0, ttft, ttft + 1.0, tokens) for ttft, tokens in
               [(0.5, 3), (1.0, 3), (4.0, 3), (0.2, 1)]]
    out = serving_stats.summarize(timings, {"ttft_s": 2.0, "tpot_s": 0.6})
    assert out["requests"] == 4 and out["span_s"] == 5.0
    assert out["throughput_tokens_per_s"] == pytest.approx(10 / 5.0)
    assert out["ttft_p50_s"] == pytest.approx(0.75) and out["ttft_p99_s"] <= 4.0
    # tpot 0.5 for the three-token answers (none for the one-token one); ttft 4.0 misses: 3 of 4 meet the objective
    assert out["tpot_p90_s"] == pytest.approx(0.5)
    assert out["goodput_requests_per_s"] == pytest.approx(3 / 5.0)
    assert serving_stats.percentile([], 50) is None and serving_stats.percentile([7.0], 99) == 7.0


def test_the_page_sets_each_method_against_plain_at_the_same_rate(tmp_path):
    import pandas as pd

    from analysis import serving as report

    def line(method, fraction, p50, tps, goodput):
        return {"method": method, "rate_fraction": fraction, "e2e_p50_s": p50, "throughput_tokens_per_s": tps,
                "goodput_requests_per_s": goodput}
    table = pd.DataFrame([line("plain", 0.5, 4.0, 100.0, 0.2), line("plain", 1.0, 8.0, 120.0, 0.1),
                          line("eagle2 [policy=pays]", 0.5, 3.0, 100.0, 0.25),
                          line("eagle2 [policy=pays]", 1.0, 9.0, 126.0, 0.0), line("eagle2", 0.75, 1.0, 1.0, 1.0)])
    ratios = report.against_plain(table).set_index("rate_fraction")
    assert list(ratios.index) == [0.5, 1.0]  # a rate plain did not run has nothing to compare with
    assert ratios.loc[0.5, "e2e_p50 / plain"] == pytest.approx(0.75)
    assert ratios.loc[1.0, "throughput / plain"] == pytest.approx(1.05)
    assert ratios.loc[0.5, "goodput / plain"] == pytest.approx(1.25) and ratios.loc[1.0, "goodput / plain"] == 0.0


def test_a_regenerated_page_of_a_clean_checkout_is_stamped_clean(tmp_path, monkeypatch):
    """The stamp's commit is read before the page's figure is rewritten: a new figure of a tracked page is the
    page being regenerated, not a checkout that differs from its commit."""
    import subprocess

    import pandas as pd

    from analysis import serving as report

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    page = tmp_path / "serving" / "kind.md"
    page.parent.mkdir()
    page.write_text("old\n")
    page.with_suffix(".png").write_bytes(b"old figure")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "page")
    monkeypatch.setattr(report, "plot", lambda table, out: out.write_bytes(b"new figure"))
    monkeypatch.setattr(report, "report_text", lambda table, ttft, tpot: "table")
    report.write_page(pd.DataFrame(), pd.DataFrame({"cpu_kind": ["avx2"]}), page, 10.0, 0.5)
    stamp = next(line for line in page.read_text().splitlines() if line.startswith("- **Commit**"))
    assert "-dirty" not in stamp and stamp != "- **Commit**: `unknown`", stamp
