"""The results store under faults: a torn or unreadable last line, a full disk, two writers, stale
locks, and a config hash that covers every setting that changes the outputs. No model is loaded."""

from __future__ import annotations

import builtins
import errno
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig, OmegaConf

import eagle2.bench  # noqa: F401  (registers the config resolvers the composed configs use)
from eagle2.results import store as results
from eagle2.results.store import ResultStore, StoreBusyError, StoreWriteError, config_hash

ROOT = Path(__file__).resolve().parents[1]
# top-level settings known NOT to change a row's outputs; every other key of conf/config.yaml (and of
# the experiments) must change the hash, or tests below fail
NOT_OUTPUT_KEYS = {"logger", "paths", "threads", "warmup_tokens", "warmup_questions", "scale",
                   "batch_refill", "batch_drafting", "too_long_prompts",  # batch_*: hashed only with batch_size > 1
                   "engine"}  # (tests/test_batch.py); too_long_prompts: hashed only as truncate_left (as
# truncate_long_prompts=true); engine.compile: hashed only when the run compiles (tests/test_compiled.py)


def open_store(root: Path, chash: str = "abc") -> ResultStore:
    return ResultStore(root, "ds", "m", "plain", chash)


def row(qid: int, turn: int = 0, status: str = "ok") -> dict:
    return {"question_id": qid, "turn": turn, "status": status, "output_text": f"answer {qid} " * 5}


def stored(store: ResultStore) -> list[dict]:
    return [json.loads(line) for line in store.rows_path.read_text().splitlines()]


def filled(root: Path, n: int = 3) -> Path:
    with open_store(root) as store:
        for qid in range(n):
            store.append(row(qid))
    return store.rows_path


# --- torn and unreadable last lines -------------------------------------------------------------

@pytest.mark.parametrize("tail", [b'{"question_id": 9, "tu', b"\x00\x00\x00\n", b'{"question_id": 9}'],
                         ids=["cut-mid-line", "garbage-line", "whole-json-without-newline"])
def test_bad_last_line_is_moved_aside_before_appending(tmp_path, caplog, tail):
    path = filled(tmp_path)
    good = path.read_bytes()
    path.write_bytes(good + tail)
    with caplog.at_level(logging.WARNING), open_store(tmp_path) as store:
        assert sorted(store.done) == [(0, 0), (1, 0), (2, 0)]
        store.append(row(9))
    corrupt = path.with_suffix(".corrupt")
    assert str(corrupt) in caplog.text and len(caplog.records) == 1
    assert corrupt.read_bytes().rstrip(b"\n") == tail.rstrip(b"\n")
    assert path.read_bytes() == good + (json.dumps(row(9)) + "\n").encode()  # earlier rows byte for byte
    assert [r["question_id"] for r in stored(store)] == [0, 1, 2, 9]


def test_torn_line_in_a_fresh_file_and_repeated_repairs(tmp_path):
    path = tmp_path / "ds" / "m" / "plain-abc.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"question_id": 0, "tu')
    with open_store(tmp_path) as store:
        assert store.done == {}
        store.append(row(0))
    path.write_bytes(path.read_bytes() + b'{"quest')
    with open_store(tmp_path) as store:
        assert list(store.done) == [(0, 0)]
    assert path.with_suffix(".corrupt").read_bytes() == b'{"question_id": 0, "tu\n{"quest\n'


def test_unreadable_line_before_the_last_is_skipped_and_kept(tmp_path):
    path = filled(tmp_path, 2)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"not json\n" + lines[1])
    with open_store(tmp_path) as store:
        assert sorted(store.done) == [(0, 0), (1, 0)]
    assert b"not json" in path.read_bytes() and not path.with_suffix(".corrupt").exists()


def test_partial_node_files_are_deleted_on_open(tmp_path):
    filled(tmp_path, 1)
    nodes = tmp_path / "ds" / "m" / "plain-abc.nodes"
    nodes.mkdir()
    (nodes / "q5_t0.partial").write_bytes(b"PAR1 half a parquet")
    (nodes / "q0_t0.parquet").write_bytes(b"kept")
    open_store(tmp_path).close()
    assert sorted(p.name for p in nodes.iterdir()) == ["q0_t0.parquet"]


# --- a full disk --------------------------------------------------------------------------------

class FullDisk:
    """Stands in for ``open`` in eagle2.results.store: files opened to append take ``room`` more bytes, then
    every write fails with ENOSPC (a short write first, as a real full disk does)."""

    def __init__(self, room: int):
        self.room = room

    def __call__(self, path, mode="r", **kw):
        f = builtins.open(path, mode, **kw)
        return _Limited(f, self) if "a" in mode else f


class _Limited:
    def __init__(self, f, disk: FullDisk):
        self.f, self.disk = f, disk

    def write(self, data) -> int:
        if self.disk.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        written = self.f.write(bytes(data[: self.disk.room]))
        self.disk.room -= written
        return written

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


@pytest.mark.parametrize("room", [0, 9, -1], ids=["nothing", "a few bytes", "all but the newline"])
def test_full_disk_appends_nothing_and_the_next_row_is_whole(tmp_path, monkeypatch, room):
    path = filled(tmp_path, 2)
    before = path.read_bytes()
    line = (json.dumps(row(7)) + "\n").encode()
    disk = FullDisk(room % len(line))
    with open_store(tmp_path) as store:
        monkeypatch.setattr(results, "open", disk, raising=False)
        with pytest.raises(StoreWriteError, match="No space left on device.*earlier rows are intact"):
            store.append(row(7))
        assert path.read_bytes() == before and (7, 0) not in store.done
        disk.room = 10**6  # space freed
        store.append(row(7))
    assert path.read_bytes() == before + line


def test_full_disk_while_writing_node_records_leaves_no_partial_file(tmp_path, monkeypatch):
    import pandas as pd

    def half_parquet(frame, path, **kw):
        Path(path).write_bytes(b"PAR1 half")
        raise OSError(errno.ENOSPC, "No space left on device")

    path = filled(tmp_path, 1)
    before = path.read_bytes()
    monkeypatch.setattr(pd.DataFrame, "to_parquet", half_parquet)
    with open_store(tmp_path) as store, pytest.raises(StoreWriteError):
        store.append({**row(3), "dataset": "ds", "model": "m", "method": "plain", "temperature": 0.0,
                      "config_hash": "abc"}, nodes={"depth": [1]})
    assert path.read_bytes() == before
    assert list((tmp_path / "ds" / "m" / "plain-abc.nodes").iterdir()) == []


def test_full_disk_while_moving_a_torn_line_aside_changes_nothing(tmp_path, monkeypatch):
    path = filled(tmp_path, 1)
    path.write_bytes(path.read_bytes() + b'{"torn')
    before = path.read_bytes()
    monkeypatch.setattr(results, "open", FullDisk(0), raising=False)
    with pytest.raises(StoreWriteError):
        open_store(tmp_path)
    assert path.read_bytes() == before and not (path.parent / "plain-abc.lock").exists()


# --- one writer per rows file -------------------------------------------------------------------

HOLD = ("import sys, time; from eagle2.results.store import ResultStore; "
        "s = ResultStore(sys.argv[1], 'ds', 'm', 'plain', 'abc'); print('held', flush=True); time.sleep(120)")


def test_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tmp_path, caplog):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreBusyError, match=f"pid {holder.pid} on {socket.gethostname()}"):
            open_store(tmp_path)
        open_store(tmp_path, chash="other").close()  # a different config is never blocked
    finally:
        holder.kill()
        holder.wait()
    with caplog.at_level(logging.WARNING), open_store(tmp_path) as store:  # SIGKILLed: its lock is stale
        store.append(row(1))
    assert "stale lock" in caplog.text and f"pid {holder.pid}" in caplog.text


def test_same_process_holds_once_and_releases_on_exceptions(tmp_path):
    lock = tmp_path / "ds" / "m" / "plain-abc.lock"
    with pytest.raises(ZeroDivisionError), open_store(tmp_path):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(StoreBusyError, match=f"pid {os.getpid()}"):
            open_store(tmp_path)
        raise ZeroDivisionError("a run that fails midway")
    assert not lock.exists()
    open_store(tmp_path).close()


def write_lock(root: Path, age_s: float = 0.0, text: str | None = None, **holder) -> Path:
    lock = root / "ds" / "m" / "plain-abc.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "token": "t"}
    lock.write_text(json.dumps({**mine, **holder}) if text is None else text)
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


@pytest.mark.parametrize("holder, age_s, busy", [
    ({"host": "elsewhere", "pid": 1}, 10, True),  # another machine, heartbeat fresh
    ({"host": "elsewhere", "pid": 1}, 10**4, False),  # another machine, heartbeat stopped
    ({}, 10, False),  # our pid, but not a lock this process holds: an earlier process (containers)
    ({"text": ""}, 10, True),  # being written
    ({"text": ""}, 10**4, False),  # its writer died before writing it
], ids=["foreign-fresh", "foreign-silent", "our-pid-not-ours", "empty-young", "empty-old"])
def test_lock_staleness(tmp_path, holder, age_s, busy):
    write_lock(tmp_path, age_s, **holder)
    if busy:
        with pytest.raises(StoreBusyError):
            open_store(tmp_path)
    else:
        open_store(tmp_path).close()


def test_a_writer_whose_lock_was_taken_over_stops(tmp_path):
    with open_store(tmp_path) as store:
        store.append(row(0))
        write_lock(tmp_path, token="someone else")
        with pytest.raises(StoreBusyError, match="lost the lock"):
            store.append(row(1))
    assert [r["question_id"] for r in stored(store)] == [0]


def test_heartbeat_refreshes_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "HEARTBEAT_S", 0.02)
    with open_store(tmp_path):
        lock = tmp_path / "ds" / "m" / "plain-abc.lock"
        os.utime(lock, (0, 0))
        deadline = time.time() + 5
        while lock.stat().st_mtime == 0 and time.time() < deadline:
            time.sleep(0.01)
        assert lock.stat().st_mtime > 0


def test_readers_of_jsonl_see_rows_files_only(tmp_path):
    path = filled(tmp_path, 1)
    path.write_bytes(path.read_bytes() + b'{"torn')
    with open_store(tmp_path):
        assert sorted(p.name for p in tmp_path.rglob("*.jsonl")) == ["plain-abc.jsonl"]
        assert {p.suffix for p in path.parent.iterdir()} == {".jsonl", ".lock", ".corrupt"}


# --- the config hash ----------------------------------------------------------------------------

def config(*overrides) -> DictConfig:
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def perturbed(value):
    if isinstance(value, DictConfig):
        return {**OmegaConf.to_container(value), "name": f"{value.get('name')}-changed"}
    if isinstance(value, ListConfig):
        return [*value, "changed"]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    return 1 if value is None else f"{value}-changed"


@pytest.mark.parametrize("overrides", [[], ["method=sps"], ["experiment=table1", "model=vicuna7b"]])
def test_every_output_changing_setting_is_hashed(overrides):
    cfg = config(*overrides)
    base = config_hash(cfg)
    for key in cfg:
        changed = OmegaConf.create(OmegaConf.to_container(cfg))
        changed[key] = perturbed(cfg[key])
        same = config_hash(changed) == base
        assert same == (key in NOT_OUTPUT_KEYS), (
            f"top-level setting {key!r}: {'not ' if same else ''}in the config hash; hash it in "
            f"eagle2/results/store.py if it changes outputs, else list it in NOT_OUTPUT_KEYS")


def test_settings_added_later_keep_existing_hashes():
    for overrides in ([], ["method=plain"], ["model=vicuna7b", "dataset=gsm8k"]):
        cfg = config(*overrides)
        legacy = OmegaConf.to_container(cfg)
        del legacy["truncate_long_prompts"], legacy["model"]["path"], legacy["dataset"]["hub"]
        del legacy["too_long_prompts"]
        assert config_hash(OmegaConf.create(legacy)) == config_hash(cfg)


@pytest.mark.parametrize("override", ["truncate_long_prompts=true", "too_long_prompts=truncate_left",
                                      "model.path=/weights/elsewhere",
                                      "dataset.hub={path: gsm8k, split: test}"])
def test_settings_added_later_change_the_hash_when_set(override):
    assert config_hash(config(override)) != config_hash(config())


def test_a_too_long_policy_that_keeps_the_prompts_as_they_are_keeps_the_hash():
    assert config_hash(config("too_long_prompts=skip")) == config_hash(config())
    assert config_hash(config("too_long_prompts=truncate_left")) == config_hash(config("truncate_long_prompts=true"))


def test_batch_drafting_is_hashed_only_when_off_in_a_batch():
    assert config_hash(config("batch_drafting=false")) == config_hash(config())  # batch 1: nothing to draft together
    assert config_hash(config("batch_size=4", "batch_drafting=false")) != config_hash(config("batch_size=4"))
    assert config_hash(config("batch_size=4", "batch_drafting=true")) == config_hash(config("batch_size=4"))
