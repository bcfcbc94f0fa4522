"""The results store: one JSON row per question turn, appended and fsync'ed as soon as it exists.

Layout under ``paths.results``: ``<dataset>/<model>/<method>-<hash>.jsonl``, where the hash covers
everything that changes the outputs (the target, the method's settings and drafter weights, dataset,
sampling, seed, token limit, prompt truncation) and nothing that does not (limit, paths, logger,
device, threads, warm-up, other methods' knobs). Settings added after rows were stored enter the hash
only when set away from their old behaviour (``truncate_long_prompts`` when true, ``model.path`` and
``dataset.hub`` when given), so existing configs keep their hash and their rows.

Rerunning a config appends to the same file and skips the (question_id, turn) pairs already finished;
a different config never touches it. Per-node draft records go beside it, one parquet file per turn in
``<method>-<hash>.nodes/``, written through a ``.partial`` file and renamed.

One writer per rows file: ``<method>-<hash>.lock`` holds the writer's pid, host and a token, refreshed
by a heartbeat; a second writer is refused with one line naming it, and a lock whose process is gone
(same host, pid not running) or whose heartbeat stopped is taken over. Under the lock, opening the
store repairs what a crash or a full disk left: trailing lines cut short or unreadable are moved to
``<method>-<hash>.corrupt`` (with a warning naming it) and ``.partial`` node files are deleted. Every
append writes a whole line or nothing: on any error the file is cut back to its previous length. Lock
and corrupt files do not end in ``.jsonl``, so readers of ``*.jsonl`` never see them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from eagle2.core.cpu import auto_dtype
from eagle2.registry import SPEC_KEYS, method_spec

log = logging.getLogger(__name__)

HASHED_KEYS = ("model", "method", "temperature", "top_p", "top_k", "seed", "max_new_tokens")
# what the target's outputs depend on; a drafter's own settings reach the hash through the resolved
# method config, and its weights through its YAML's ``weights`` (so a plain run's hash ignores drafter knobs)
TARGET_KEYS = ("name", "source", "hub_id", "dtype", "attn_implementation", "template", "system_prompt",
               "stop_tokens", "max_context")
# hashed only when not null (added later: configs without them keep their hash)
TARGET_KEYS_WHEN_SET = ("path",)
DATASET_KEYS, DATASET_KEYS_WHEN_SET = ("name", "path"), ("hub",)
METHOD_KEYS_WHEN_SET = ("draft_temperature", "lookup_k", "lookup_max_ngram", "lookup_min_ngram", "max_num_draft")
# switches added later, hashed only when on (with the keys that only they read): off hashes as before
METHOD_SWITCHES = {"lookup_branch": ("lookup_k", "lookup_max_ngram", "lookup_min_ngram"), "adaptive_depth": ()}

HEARTBEAT_S = 30.0  # the lock holder refreshes the lock file's time this often
STALE_AFTER_S = 300.0  # a lock not refreshed for this long is taken over, whatever its host
_HELD: set[str] = set()  # tokens of the locks this process holds


def config_hash(cfg) -> str:
    """Short hash of the settings that determine the outputs."""
    from omegaconf import OmegaConf  # here, not at the top: reading rows (the GPU check) needs no omegaconf

    resolved = OmegaConf.to_container(cfg, resolve=True)
    picked = {k: resolved.get(k) for k in HASHED_KEYS}
    artifacts = method_spec(cfg.method).weights
    picked["model"] = _pick(resolved["model"], TARGET_KEYS + artifacts, TARGET_KEYS_WHEN_SET)
    if picked["model"].get("dtype") == "auto":  # what it means on this machine: equal runs, equal hashes
        picked["model"]["dtype"] = auto_dtype(str(resolved["model"].get("device", "cpu")))
    picked["dataset"] = _pick(resolved["dataset"], DATASET_KEYS, DATASET_KEYS_WHEN_SET)
    picked["method"] = _method_settings(picked["method"])
    if resolved.get("truncate_long_prompts") or resolved.get("too_long_prompts") == "truncate_left":
        picked["truncate_long_prompts"] = True
    if resolved.get("ignore_eos"):  # decoding past the stop tokens; off keeps every hash
        picked["ignore_eos"] = True
    if str((resolved.get("engine") or {}).get("compile")).endswith("true"):  # compiled; eager keeps every hash
        picked["compile"] = True
    if int(resolved.get("batch_size") or 1) > 1:  # batch 1 keeps every existing hash
        picked["batch_size"] = int(resolved["batch_size"])
        picked["batch_refill"] = bool(resolved.get("batch_refill", True))
        if not resolved.get("batch_drafting", True):  # rows drafting one after another; the default keeps hashes
            picked["batch_drafting"] = False
    if resolved.get("serving"):  # experiment=serving: its rate and arrivals (other runs keep every hash)
        picked["serving"] = {k: v for k, v in resolved["serving"].items() if k != "slo"}
    blob = json.dumps(picked, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def _pick(section: dict, keys: tuple, keys_when_set: tuple) -> dict:
    picked = {k: section.get(k) for k in keys}
    picked.update({k: section[k] for k in keys_when_set if section.get(k) is not None})
    return picked


def _method_settings(method: dict) -> dict:
    method = dict(method)
    for where_not_what in ("profile_dir", "reprofile", "reference", *SPEC_KEYS):  # where things live, not what is run
        method.pop(where_not_what, None)
    if str(method.get("total_tokens")) != "auto":
        method.pop("max_total_tokens", None)  # only auto budgets read it (and older hashes stay valid)
    for switch, its_keys in METHOD_SWITCHES.items():  # off = the old behaviour: older hashes stay valid
        if not method.get(switch):
            for key in (switch, *its_keys):
                method.pop(key, None)
    if method.get("policy") == "auto":  # eagle2.drafters.policy.resolved_policy: pays only beside an auto budget
        method["policy"] = "pays" if str(method.get("total_tokens")) == "auto" else "always"
    if method.get("policy") in (None, "always"):  # every round drafts: the behaviour older hashes stand for
        method.pop("policy", None)
    for added_later in METHOD_KEYS_WHEN_SET:  # null = the default behaviour: older hashes stay valid
        if method.get(added_later) is None:
            method.pop(added_later, None)
    return method


class StoreBusyError(Exception):
    """Another live process writes this rows file."""


class StoreWriteError(OSError):
    """A row could not be stored (a full disk, an I/O error); the file is as it was before it."""


def append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` entirely and fsync it, or not at all: on any error, cut it back."""
    with open(path, "ab", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[f.write(view):]
            os.fsync(f.fileno())
        except BaseException:
            os.ftruncate(f.fileno(), size)
            raise


@contextmanager
def removed_on_error(path: Path, reported_as: Path):
    """Delete ``path`` when the block fails; an OSError becomes a StoreWriteError about ``reported_as``."""
    try:
        yield
    except BaseException as exc:
        path.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _write_error(reported_as, exc) from exc
        raise


def parse_rows(data: bytes | str) -> list[dict]:
    """The rows of a JSON-lines text: every line that is a JSON object; an unreadable line (cut by a kill,
    or a torn tail before repair) is skipped. The one row reader of the project: the store, the
    analysis and the tests read rows through it."""
    rows = []
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_rows(path: str | os.PathLike) -> list[dict]:
    """``parse_rows`` of one file (empty when it does not exist)."""
    path = Path(path)
    return parse_rows(path.read_bytes()) if path.exists() else []


def is_row(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return False


def good_length(data: bytes) -> int:
    """Length of ``data`` without its trailing torn (no newline) or unreadable lines."""
    end = len(data)
    while end:
        start = data.rfind(b"\n", 0, end - 1) + 1
        if data.endswith(b"\n", start, end) and is_row(data[start:end]):
            return end
        end = start
    return 0


class RowsLock:
    """``<rows>.lock``: the pid, host and token of the one process that writes a rows file."""

    def __init__(self, path: Path):
        self.path = path
        self.me = {"pid": os.getpid(), "host": socket.gethostname(), "token": uuid.uuid4().hex,
                   "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        self._stop = threading.Event()

    def acquire(self) -> None:
        for _ in range(5):
            if self._create():
                _HELD.add(self.me["token"])
                threading.Thread(target=self._heartbeat, daemon=True).start()
                return
            holder, age = self._holder()
            if holder is None:  # released meanwhile
                continue
            if not _stale(holder, age):
                raise StoreBusyError(f"{self.path.with_suffix('.jsonl')} is being written by {_who(holder)}; "
                                     "this run did nothing: rerun it once that one has ended")
            log.warning("taking over the stale lock %s of %s", self.path, _who(holder))
            self._break(holder)
        raise StoreBusyError(f"could not take the lock {self.path}: other processes keep taking it")

    def check(self) -> None:
        """Raise if another process has taken the lock over (this one was presumed dead)."""
        holder, _ = self._holder()
        if holder is None or holder.get("token") != self.me["token"]:
            who = _who(holder) if holder else "nobody"
            raise StoreBusyError(f"lost the lock {self.path} (now held by {who}); stopping, not to write twice")

    def release(self) -> None:
        self._stop.set()
        _HELD.discard(self.me["token"])
        holder, _ = self._holder()
        if holder is not None and holder.get("token") == self.me["token"]:
            self.path.unlink(missing_ok=True)

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with removed_on_error(self.path, self.path), os.fdopen(fd, "w") as f:  # no empty lock left behind
            f.write(json.dumps(self.me) + "\n")
        return True

    def _holder(self) -> tuple[dict | None, float]:
        """(what the lock file says, seconds since its last heartbeat); (None, 0) when there is none."""
        try:
            age = time.time() - self.path.stat().st_mtime
            text = self.path.read_text()
        except FileNotFoundError:
            return None, 0.0
        try:
            return dict(json.loads(text)), age
        except (ValueError, TypeError):  # being written, or garbage: only its age can tell
            return {}, age

    def _break(self, holder: dict) -> None:
        """Remove the stale lock ``holder``, unless another process replaced it meanwhile."""
        breaker = self.path.with_name(self.path.name + ".break")
        try:
            os.close(os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:  # another process is taking over; a breaker that died left it behind
            if time.time() - breaker.stat().st_mtime > 60:
                breaker.unlink(missing_ok=True)
            time.sleep(0.1)
            return
        try:
            if self._holder()[0] == holder:
                self.path.unlink(missing_ok=True)
        finally:
            breaker.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            if self._holder()[0] != self.me:
                return
            os.utime(self.path)


def _stale(holder: dict, age: float) -> bool:
    if age > STALE_AFTER_S:
        return True
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False  # another machine (its heartbeat decides), or a lock being written
    if holder["pid"] == os.getpid():
        return holder.get("token") not in _HELD  # a dead earlier process that had our pid (containers)
    return not _pid_alive(holder["pid"])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _who(holder: dict) -> str:
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} (since {holder.get('since', '?')})"


class ResultStore:
    """A rows file opened for writing: locked, repaired and loaded; use as a context manager."""

    def __init__(self, root: str | os.PathLike, dataset: str, model: str, method: str, chash: str):
        self.folder = Path(root) / dataset / model
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rows_path = self.folder / f"{method}-{chash}.jsonl"
        self.nodes_dir = self.folder / f"{method}-{chash}.nodes"
        self.corrupt_path = self.rows_path.with_suffix(".corrupt")
        self.done: dict[tuple[int, int], dict] = {}
        self.failed: dict[tuple[int, int], dict] = {}  # question turns that failed in this process
        self._lock = RowsLock(self.rows_path.with_suffix(".lock"))
        self._lock.acquire()
        try:
            self._load(self._repair())
        except BaseException:
            self._lock.release()
            raise

    @classmethod
    def for_config(cls, cfg, chash: str) -> ResultStore:
        return cls(cfg.paths.results, cfg.dataset.name, cfg.model.name, cfg.method.name, chash)

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._lock.release()

    def finished(self, question_id, turn: int) -> dict | None:
        return self.done.get((question_id, turn))

    def append(self, row: dict, nodes: dict | None = None) -> None:
        self._lock.check()
        written = self._write_nodes(row, nodes) if nodes else None
        try:
            append_whole(self.rows_path, (json.dumps(row) + "\n").encode())
        except OSError as exc:
            if written:
                written.unlink(missing_ok=True)
            raise _write_error(self.rows_path, exc) from exc
        if row.get("status") == "ok":
            self.done[(row["question_id"], row["turn"])] = row
        elif row.get("question_id") is not None:
            self.failed[(row["question_id"], row["turn"])] = row

    def _repair(self) -> bytes:
        """Delete ``.partial`` node files; move trailing torn or unreadable lines aside; return the rest."""
        for partial in self.nodes_dir.glob("*.partial"):
            partial.unlink()
        data = self.rows_path.read_bytes() if self.rows_path.exists() else b""
        keep = good_length(data)
        if keep < len(data):
            self._move_aside(data[keep:], keep)
        return data[:keep]

    def _move_aside(self, tail: bytes, keep: int) -> None:
        try:
            append_whole(self.corrupt_path, tail if tail.endswith(b"\n") else tail + b"\n")
            with open(self.rows_path, "r+b") as f:
                f.truncate(keep)
                os.fsync(f.fileno())
        except OSError as exc:
            raise _write_error(self.rows_path, exc) from exc
        log.warning("%s: its last line was cut short or unreadable (%d bytes); moved to %s, that turn is redone",
                    self.rows_path, len(tail), self.corrupt_path)

    def _load(self, data: bytes) -> None:
        for row in parse_rows(data):  # an unreadable line before the last is skipped: that turn is redone
            if row.get("status") == "ok":
                self.done[(row["question_id"], row["turn"])] = row

    def _write_nodes(self, row: dict, nodes: dict) -> Path:
        import pandas as pd

        self.nodes_dir.mkdir(exist_ok=True)
        frame = pd.DataFrame(nodes)
        for key in ("question_id", "turn", "dataset", "model", "method", "temperature", "config_hash"):
            frame[key] = row[key]
        path = self.nodes_dir / f"q{row['question_id']}_t{row['turn']}.parquet"
        tmp = path.with_suffix(".partial")
        with removed_on_error(tmp, path):
            frame.to_parquet(tmp, index=False)
            tmp.replace(path)
        return path


def _write_error(path: Path, exc: OSError) -> StoreWriteError:
    error = StoreWriteError(f"cannot write {path}: {exc.strerror or exc}; earlier rows are intact and the "
                            "file is as it was before this write")
    error.errno = exc.errno
    return error
