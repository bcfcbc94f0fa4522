"""Bad inputs a new user types, each answered in one line before the target loads where no model is needed
(unknown keys, drafter-weight paths, over-long prompts), writing nothing into any results file and
leaving stored rows as they were; turns that fail while decoding are counted and make run.py exit non-zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle2.bench import runner
from eagle2.bench.known_keys import known_tree, unknown_keys
from eagle2.bench.prompt_lengths import PromptTooLongError
from eagle2.bench.validation import ConfigError, validate_run_config
from eagle2.heads.eagle_head import save_head
from eagle2.heads.locations import WeightLocationError
from eagle2.results.store import config_hash, read_rows
from tests.conftest import tiny_head
from tests.test_runner import config
from tests.test_validation import no_model  # noqa: F401  (a fixture: fails if the target loads)

ROOT = Path(__file__).resolve().parents[1]


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


# ------------------------------------------------------------------ unknown keys

@pytest.mark.parametrize("override, named, nearest", [
    ("+model.eagle_head=/somewhere", "model.eagle_head", "model.head"),
    ("+method.totl_tokens=8", "method.totl_tokens", "method.total_tokens"),
    ("+dataset.limt=3", "dataset.limt", "dataset.limit"),
    ("+temprature=0.7", "temprature", "temperature"),
    ("+paths.result=/tmp/x", "paths.result", "paths.results"),
])
@pytest.mark.usefixtures("no_model")
def test_an_unknown_key_is_refused_with_the_nearest_known_one(override, named, nearest, tmp_path):
    cfg = config("method=plain", override, f"paths.results={tmp_path}")
    with pytest.raises(ConfigError) as err:
        runner.run(cfg)
    assert f"unknown key {named}" in one_line(err.value) and nearest in str(err.value)
    assert runner.record_cell_failure(cfg, err.value).startswith("nowhere")
    assert not any(tmp_path.iterdir())


def test_known_keys_come_from_every_option_of_every_group():
    known = known_tree()
    assert "medusa_choices" in known["model"] and "allow_offload" in known["model"]  # model/_base via each model
    assert {"total_tokens", "choices", "max_ngram", "reference"} <= set(known["method"])  # eagle2, eagle, pld, oracle
    # every shipped combination passes, including the presets that set keys of their own
    for override in ("method=medusa", "method=oracle", "method=pld", "model=vicuna7b", "experiment=table1",
                     "experiment=batch_scaling", "dataset=cnn_dm", "model.max_memory={0: 70GiB}"):
        assert unknown_keys(config(override)) == [], override


@pytest.mark.heavy  # composes every config twice from cold; the known keys themselves are checked by default above
def test_known_keys_are_cached_on_disk_until_a_yaml_changes(tmp_path, monkeypatch):
    """Composing every option takes seconds a run; the disk cache answers while the config folder is unchanged,
    and any edit (a new key) composes again: the new key is known at once."""
    import shutil

    import eagle2.bench.known_keys as kk

    conf, cache = tmp_path / "conf", tmp_path / "cache"
    shutil.copytree(kk.CONF_DIR, conf)
    first = kk.known_tree(str(conf), str(cache))
    assert len(list(cache.glob("*.json"))) == 1
    kk.known_tree.cache_clear()
    monkeypatch.setattr(kk, "_compose_known", lambda conf_dir: pytest.fail("composed again, cache unused"))
    assert kk.known_tree(str(conf), str(cache)) == first
    monkeypatch.undo()
    kk.known_tree.cache_clear()
    (conf / "method" / "pld.yaml").write_text((conf / "method" / "pld.yaml").read_text() + "brand_new_key: 1\n")
    assert "brand_new_key" in kk.known_tree(str(conf), str(cache))["method"]  # a stale cache is never read
    kk.known_tree.cache_clear()
    for path in cache.glob("*.json"):
        path.write_text("{torn")
    assert "brand_new_key" in kk.known_tree(str(conf), str(cache))["method"]  # unreadable: composed again
    kk.known_tree.cache_clear()


def test_the_known_keys_cache_is_keyed_by_its_own_code_too(tmp_path, monkeypatch):
    """A change to the code that builds the key list is a new cache entry, not a stale list read back."""
    import eagle2.bench.known_keys as kk

    before = kk._conf_fingerprint(str(kk.CONF_DIR))
    changed = tmp_path / "known_keys.py"
    changed.write_text(Path(kk.__file__).read_text() + "\n# changed\n")
    monkeypatch.setattr(kk, "__file__", str(changed))
    assert kk._conf_fingerprint(str(kk.CONF_DIR)) != before


# ------------------------------------------------------------------ drafter-weight paths

def _eagle2(tmp_path, head) -> object:
    return config("method=eagle2", "dataset=nq", "dataset.limit=1", "max_new_tokens=4", f"model.head={head}",
                  f"paths.results={tmp_path / 'r'}")


def _damaged(folder: Path, name: str, data: bytes) -> Path:
    (folder / name).write_bytes(data)
    return folder


def _removed(folder: Path, name: str) -> Path:
    (folder / name).unlink()
    return folder


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, smollm2):
    return save_head(tiny_head(smollm2[0]), tmp_path_factory.mktemp("head") / "eagle_head")


@pytest.mark.parametrize("case, message", [
    ("file", "is a file; give the folder that holds config.json and model.safetensors"),
    ("typo", "no such folder (looked in the working directory and the project), and not a hub id"),
    ("no_config", "the folder has no config.json"),
    ("no_weights", "the folder holds none of model.safetensors, pytorch_model.bin"),
    ("lfs", "is a git-LFS pointer, not the file (the clone was made without git-lfs)"),
    ("cut", "is not a whole safetensors file"),
    ("config_not_json", "config.json is not JSON"),
])
@pytest.mark.usefixtures("no_model")
def test_a_bad_head_location_is_one_line_naming_it_before_the_target_loads(case, message, tmp_path, head_dir):
    import shutil

    folder = tmp_path / "head"
    shutil.copytree(head_dir, folder)
    weights = folder / "model.safetensors"
    damage = {
        "file": lambda: weights,
        "typo": lambda: tmp_path / "heda" / "eagle_head",
        "no_config": lambda: _removed(folder, "config.json"),
        "no_weights": lambda: _removed(folder, "model.safetensors"),
        "lfs": lambda: _damaged(folder, "model.safetensors", b"version https://git-lfs.github.com/spec/v1\noid x\n"),
        "cut": lambda: _damaged(folder, "model.safetensors", weights.read_bytes()[:100]),
        "config_not_json": lambda: _damaged(folder, "config.json", b"{not json"),
    }
    location = damage[case]()
    with pytest.raises(WeightLocationError) as err:
        runner.run(_eagle2(tmp_path, location))
    assert message in one_line(err.value) and "model.head" in str(err.value) and "hub" not in str(err.value).replace(
        "not a hub id", "")
    assert not list((tmp_path / "r").rglob("*.jsonl"))


def test_only_a_location_that_could_be_a_hub_id_is_left_to_the_hub(tmp_path):
    from eagle2.heads.locations import check_weights_location, could_be_hub_id

    assert could_be_hub_id("yuhuili/EAGLE-Vicuna-7B-v1.3") and not could_be_hub_id("artifacts/smollm2/eagle_hed")
    assert not could_be_hub_id("./heads/x") and not could_be_hub_id(str(tmp_path / "x"))
    check_weights_location("yuhuili/EAGLE-Vicuna-7B-v1.3", "model.head")  # not here: the hub's to answer


# ------------------------------------------------------------------ prompt lengths

def _questions(tmp_path, *turn_lists) -> Path:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question_id": i + 1, "turns": turns}) + "\n"
                            for i, turns in enumerate(turn_lists)))
    return data


def _plain(tmp_path, data, *extra):
    return config("method=plain", f"dataset.path={data}", "max_new_tokens=4", "model.max_context=128",
                  "model.dtype=float32", f"paths.results={tmp_path / 'r'}", *extra)


@pytest.mark.usefixtures("no_model")
def test_a_too_long_prompt_refuses_the_run_before_the_target_loads_and_keeps_stored_rows(tmp_path):
    short = _questions(tmp_path, ["Hi"])
    stored = tmp_path / "r" / "mt_bench" / "smollm2"
    stored.mkdir(parents=True)
    cfg = _plain(tmp_path, short)
    rows_file = stored / f"plain-{config_hash(runner.resolved(cfg))}.jsonl"
    rows_file.write_text(json.dumps({"question_id": 9, "turn": 0, "status": "failed", "error": "x"}) + "\n")
    before = rows_file.read_bytes()
    long = _questions(tmp_path, ["Hi"], ["word " * 400])
    with pytest.raises(PromptTooLongError) as err:
        runner.run(_plain(tmp_path, long))
    assert one_line(err.value).startswith("question 2 turn 0: prompt has ")
    assert "too_long_prompts=skip" in str(err.value)
    assert runner.record_cell_failure(_plain(tmp_path, long), err.value).startswith("nowhere")
    assert rows_file.read_bytes() == before and [p.name for p in stored.iterdir()] == [rows_file.name]


def test_the_prompt_length_limit_is_exact():
    """A prompt of exactly context - max_new_tokens tokens fits (and decodes its whole answer), one more does not;
    with ``model.stop_at_context`` a prompt fits up to one token short of the context.

    Negative control (by hand): ``fits`` with ``<`` for ``<=`` fails here."""
    from eagle2.bench.prompt_lengths import fits
    from eagle2.core.engine import generate
    from eagle2.core.sampling import SamplingParams
    from eagle2.drafters.plain import PlainDrafter
    from tests.conftest import tiny_llama

    cfg = config("model=smollm2", "max_new_tokens=4", "model.stop_at_context=false")
    assert fits(12, cfg, 16) and not fits(13, cfg, 16)
    cfg = config("model=smollm2", "max_new_tokens=4", "model.stop_at_context=true")
    assert fits(15, cfg, 16) and not fits(16, cfg, 16)
    out = generate(tiny_llama(vocab=16, layers=1, seed=0), PlainDrafter(), [1] * 12, SamplingParams(0.0), 4, set(),
                   None, 16)
    assert len(out.output_ids) == 4


def test_too_long_prompts_skip_and_truncate_left(tmp_path):
    data = _questions(tmp_path, ["Hi", "word " * 400], ["word " * 400], ["Hello"])
    summary = runner.run(_plain(tmp_path, data, "too_long_prompts=skip"))
    got = {(r["question_id"], r["turn"]): r["status"] for r in read_rows(next((tmp_path / "r").rglob("*.jsonl")))}
    assert got == {(1, 0): "ok", (3, 0): "ok"}  # nothing stored for the skipped turns
    assert summary["turns"] == 2 and summary["failed_turns"] == 0
    summary = runner.run(_plain(tmp_path, data, "too_long_prompts=truncate_left"))
    assert summary["turns"] == 4 and summary["failed_turns"] == 0
    with pytest.raises(ConfigError, match="too_long_prompts='cut' is invalid: must be fail or skip or truncate_left"):
        validate_run_config(_plain(tmp_path, data, "too_long_prompts=cut"))


@pytest.mark.slow  # run.py decodes SmolLM2 in a subprocess
@pytest.mark.entrypoint
def test_a_turn_its_answers_make_too_long_is_counted_and_the_cli_exits_non_zero(tmp_path, smollm2):
    """The check before loading counts unknown answers as empty; a second turn that only its first answer
    pushes past the context fails while decoding: a failed row, counted, and run.py's last line says so."""
    from eagle2.prompts.chat import encode_conversation

    tokenizer = smollm2[1]
    turns = ["Say a long sentence.", "Again."]
    second = len(encode_conversation(tokenizer, "tokenizer", turns, [""]))
    data = _questions(tmp_path, turns)
    cmd = [sys.executable, "run.py", "method=plain", "logger=none", "warmup_tokens=0", f"dataset.path={data}",
           "max_new_tokens=8", f"model.max_context={second + 8 + 2}", "model.dtype=float32",
           f"paths.results={tmp_path / 'r'}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0, out.stdout
    assert "1 turns, 1 failed" in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("[eagle2] 1 turn(s) failed (first: question 1 turn 1: ContextOverflowError: prompt has")
    rows = read_rows(next((tmp_path / "r").rglob("*.jsonl")))
    assert [(r["turn"], r["status"]) for r in rows] == [(0, "ok"), (1, "failed")]
