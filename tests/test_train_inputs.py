"""train_head.py's bad inputs, each one line before the target loads: an unknown stage, a stage's missing
input (a corpus, prompt files, the artifacts to evaluate), a resume_dir state that cannot be read (not JSON,
no fingerprint, a git-LFS pointer for the weights); and no "exported to None" for a stopped run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from eagle2.training.objectives.eagle import train_head
from eagle2.training.recipe import PreflightError, _exported, check_inputs, stages_of
from eagle2.training.support.warm_state import WarmStateError, read_warm_state
from tests.test_online_features import token_corpus  # noqa: F401  (a fixture)
from tests.test_training import head_cfg, tiny_target

ROOT = Path(__file__).resolve().parents[1]
LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 1234\n"


def train_cfg(*overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        return compose("train_head", overrides=list(overrides))


@pytest.mark.entrypoint  # train_head.py in subprocesses; each stage's message is checked in-process below
def test_unknown_stage_and_missing_corpus_are_one_line_before_the_target_loads(tmp_path):
    for stage, message in [("heads", "[train_head] unknown stage 'heads'; choose one of corpus, head"),
                           ("head", f"[train_head] stage=head trains on train.corpus.out_dir={tmp_path / 'none'}, "
                                    "which holds no corpus shards")]:
        out = subprocess.run([sys.executable, "train_head.py", "train=tiny", f"stage={stage}",
                              f"train.corpus.out_dir={tmp_path / 'none'}", f"model.cache_dir={tmp_path / 'cache'}"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode != 0 and out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
        assert out.stderr.strip().startswith(message), out.stderr
        assert not (tmp_path / "cache").exists()  # loading the target would have converted its GGUF there


@pytest.mark.parametrize("stages, overrides, message", [
    (("head",), ["train.corpus.out_dir={empty}"], "stage=head trains on train.corpus.out_dir="),
    (("eagle3", "draft"), ["train.corpus.out_dir={empty}"], "build it first with train_head.py stage=corpus"),
    (("corpus",), ["train.corpus.prompts=[data/train/nope.json.gz]"], "nope.json.gz does not exist"),
    (("eval",), ["train.export.head={empty}/never_trained"], "stage=eval measures train.export.head="),
    (("own_answers",), ["train=sharegpt", "train.own_answers.source={empty}"], "build it first with train_head.py "
                                                                               "stage=sharegpt"),
    (("corpus", "joint"), ["train.joint.heads=[head,medusa]"], "stage=joint: train.joint.heads: 'medusa' cannot join"),
    (("corpus", "joint"), ["train.joint.heads=[head,hass]"], "stage=joint: train.joint.primary: 'eagle3' is not"),
])
def test_each_stage_names_its_missing_input(stages, overrides, message, tmp_path):
    cfg = train_cfg(*(o.format(empty=tmp_path) for o in overrides))
    with pytest.raises(PreflightError, match=message.replace("[", r"\[")) as err:
        check_inputs(cfg, ROOT, stages)
    assert "\n" not in str(err.value)


def test_inputs_an_earlier_stage_makes_are_not_looked_for(tmp_path):
    cfg = train_cfg("train=tiny", f"train.corpus.out_dir={tmp_path / 'new'}", f"train.work_dir={tmp_path}")
    check_inputs(cfg, ROOT, stages_of("all"))  # corpus first, then head, eagle3, draft, medusa, eval
    check_inputs(train_cfg(), ROOT, ("conversations", "features"))


def _committed(tmp_path, token_corpus) -> tuple[object, object, Path]:  # noqa: F811
    target = tiny_target()
    cfg = head_cfg(epochs=4, autocast="off", checkpoint_every=3, resume_dir=str(tmp_path / "committed"))
    train_head(target, token_corpus, cfg, tmp_path / "run", stop_after=3)
    (tmp_path / "run" / "checkpoint.pt").unlink()  # a fresh clone: only the committed state
    return target, cfg, tmp_path / "committed"


@pytest.mark.parametrize("damage, message", [
    ("not_json", "resume.json is not JSON"),
    ("no_fingerprint", "resume.json has no fingerprint: not a state this trainer wrote"),
    ("lfs_weights", "trainable.safetensors is a git-LFS pointer, not the file"),
    ("cut_weights", "trainable.safetensors is not a whole safetensors file"),
    ("cut_rows", "metrics.jsonl.gz is not gzipped JSON lines"),
])
def test_a_warm_state_that_cannot_be_read_is_one_line_naming_the_file(damage, message, tmp_path,
                                                                      token_corpus):  # noqa: F811
    target, cfg, folder = _committed(tmp_path, token_corpus)
    state = json.loads((folder / "resume.json").read_text())
    if damage == "not_json":
        (folder / "resume.json").write_text('{"fingerprint": ')
    elif damage == "no_fingerprint":
        (folder / "resume.json").write_text(json.dumps({k: v for k, v in state.items() if k != "fingerprint"}))
    elif damage == "lfs_weights":
        (folder / "trainable.safetensors").write_bytes(LFS)
    elif damage == "cut_rows":
        (folder / "metrics.jsonl.gz").write_bytes((folder / "metrics.jsonl.gz").read_bytes()[:-9])
    else:
        (folder / "trainable.safetensors").write_bytes((folder / "trainable.safetensors").read_bytes()[:64])
    with pytest.raises(WarmStateError, match=message) as before_loading:
        read_warm_state(folder)
    assert str(folder) in str(before_loading.value) and "\n" not in str(before_loading.value)
    with pytest.raises(WarmStateError, match=message):  # the trainer resumes through the same check
        train_head(target, token_corpus, cfg, tmp_path / "run", stop_after=4)
    sharegpt = train_cfg("train=sharegpt", f"train.head.resume_dir={folder}", f"train.corpus.out_dir={token_corpus}")
    with pytest.raises(WarmStateError, match=message):  # and train_head.py runs it before the target loads
        check_inputs(sharegpt, ROOT, ("head",))


def test_a_stopped_training_run_says_nothing_was_exported():
    assert _exported("head", None) == ("[train_head] head: training stopped before its end (stop_after), nothing "
                                       "exported; rerun the stage to continue from its checkpoint")
    assert _exported("SpS draft", Path("/x")) == "[train_head] SpS draft exported to /x"
