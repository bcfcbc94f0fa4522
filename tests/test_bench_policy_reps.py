"""``experiments.bench.bench_policy``'s repetitions: each in its own folder, every other one in the opposite cell
order, every turn decoded to its full length, and the cell choice refusing words that name no cell."""

from __future__ import annotations

import argparse

import pytest

from experiments.bench import bench_policy


def test_repetitions_alternate_the_cell_order_each_in_its_own_folder(monkeypatch):
    calls = []
    monkeypatch.setattr(bench_policy.subprocess, "run", lambda cmd, check: calls.append(cmd))
    args = argparse.Namespace(cells="plain,pays", reps=2, dataset="gsm8k", limit=4, tokens=16, batch="4",
                              results="out", stop_at_eos=False)
    bench_policy.run_cells(args, [])
    ran = [(next(a for a in c if a.startswith("paths.results=")),
            [a for a in c if a.startswith(("method", "engine"))]) for c in calls]
    names = bench_policy.chosen_cells("plain,pays")
    order = [bench_policy.CELLS[n] for n in names]
    assert [r for r, _ in ran] == ["paths.results=out/rep1"] * 4 + ["paths.results=out/rep2"] * 4
    assert [c for _, c in ran] == order + order[::-1]
    assert len(names) == 4 and all("always" not in n for n in names)
    assert all("ignore_eos=true" in c for c in calls)  # equal lengths unless --stop-at-eos


def test_cells_naming_nothing_is_one_line():
    with pytest.raises(SystemExit, match="names none of"):
        bench_policy.chosen_cells("fast")
