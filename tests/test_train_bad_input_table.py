"""train_head.py's bad-input table, run through its entry point in-process (the override check, then ``main`` on
the composed config): each input answered in one line naming the key or the file, a non-zero exit without a
traceback, before the target loads, and nothing written under the run's ``train.work_dir`` or into its corpus.
The makers of damaged files are the run.py table's (``tests/test_bad_input_table.py``); the preflight that
answers is ``eagle2.training.recipe.check_inputs`` over the objectives' and sources' declarations."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import train_head
from eagle2.bench.overrides import refuse_bad_overrides
from tests.test_bad_input_table import cut_head, text_file
from tests.test_validation import no_model  # noqa: F401  (a fixture failing if the target loads)

ROOT = Path(__file__).resolve().parents[1]
A_FILE = ("a_file.txt", text_file("not a folder"))


def run_train_head(argv: list[str]) -> None:
    """``python train_head.py ARGV`` in-process: Hydra's refusals as one line, then ``main`` on the config."""
    refuse_bad_overrides("train_head", argv)
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train_head", overrides=argv)
    train_head.main.__wrapped__(cfg)


TABLE = [  # (overrides, a file to make: (name, maker) or None, what the one line must say)
    (["stage=nosuch"], None, "[train_head] unknown stage 'nosuch'; choose one of corpus, head"),
    (["train=nosuch"], None, "[eagle2] Could not find 'train/nosuch'; the options are "),
    (["stage=head", "train.head.lrr=1"], None, "unknown key train.head.lrr: the config as composed has no such key"),
    (["train=sharegpt", "stage=head", "train.head.resume_dirr=x"], None, "unknown key train.head.resume_dirr"),
    (["train=sharegpt", "stage=head", "train.head.resume_dir={file}"], A_FILE,
     "train.head.resume_dir={file} is a file; give the folder of a training state"),
    (["stage=joint", "train.joint.heads=[head,medusa]"], None, "train.joint.heads: 'medusa' cannot join a joint run"),
    (["stage=joint", "train.joint.heads=[head,head]"], None, "train.joint.heads lists a head twice"),
    (["stage=joint", "train.joint.heads=[head,hass]"], None, "train.joint.primary: 'eagle3' is not one of "
                                                            "train.joint.heads ['head', 'hass']"),
    (["stage=head", "train.head.init_from={tmp}/nosuch"], None, "train.head.init_from={tmp}/nosuch: no such folder"),
    (["stage=head", "train.head.init_from={file}"], ("head", cut_head),
     "train.head.init_from: {file}/model.safetensors is not a whole safetensors file"),
    (["stage=eagle3", "train.eagle3.init_from={file}"], ("head", cut_head),
     "train.eagle3.init_from: {file}/model.safetensors is not a whole safetensors file"),
    (["stage=joint", "train.head.init_from={file}"], ("head", cut_head),  # a member's section, read by joint
     "train.head.init_from: {file}/model.safetensors is not a whole safetensors file"),
    (["stage=hass", "train.hass.init_from={file}"], A_FILE, "train.hass.init_from={file} is a file; give the folder"),
    (["stage=pard_draft", "train.pard_draft.init_from={tmp}/nosuch"], None, "train.pard_draft.init_from={tmp}/nosuch: "
                                                                            "no such folder"),
    (["stage=head", "train.corpus.out_dir={tmp}/nonexistent"], None, "stage=head trains on train.corpus.out_dir="
                                                                     "{tmp}/nonexistent, which holds no corpus shards"),
    (["stage=head", "train.corpus.out_dir={file}"], A_FILE, "train.corpus.out_dir={file}, which is a file: give the "
                                                            "corpus folder"),
    (["stage=corpus", "train.corpus.out_dir={file}"], A_FILE, "train.corpus.out_dir={file} is a file; give a folder"),
    (["stage=hydra", "train.hydra.out_dir={file}"], A_FILE, "train.hydra.out_dir={file} is a file; give a folder"),
    (["stage=head", "threads=0"], None, "threads=0 is invalid: must be null (torch's default) or an integer >= 1"),
    (["stage=head", "threads=-2"], None, "threads=-2 is invalid"),
    (["stage=head", "model.dtype=int4"], None, "model.dtype='int4' is invalid: must be auto or one of"),
    (["stage=eval", "train.eval.kinds=[nosuch]"], None, "train.eval.kinds must list some of head, eagle3"),
    (["stage=head", "train.head.epochs=0"], None, "stage=head: train.head.epochs=0 is invalid: must be an integer"),
    (["stage=eagle3", "train.eagle3.lr=-1"], None, "train.eagle3.lr=-1 is invalid: must be a number > 0"),
    (["stage=joint", "train.joint.val_fraction=1.5"], None, "train.joint.val_fraction=1.5 is invalid"),
    (["stage=draft", "train.draft.token_budget=0.5"], None, "train.draft.token_budget=0.5 is invalid"),
    (["stage=hass", "train.hass.betas=[0.9,1.2]"], None, "train.hass.betas=[0.9, 1.2] is invalid"),
    (["stage=head", "train.head.best_by=loss2"], None, "train.head.best_by='loss2' is invalid: must be last or one of"),
    (["stage=head", "train.head.max_steps=0"], None, "train.head.max_steps=0 is invalid: must be an"),
]


def _argv(overrides: list[str], tmp_path: Path, corpus: Path) -> list[str]:
    """The case's overrides after a work dir under ``tmp_path`` and a corpus holding one token shard's name."""
    base = [f"train.work_dir={tmp_path / 'work'}"]
    if not any(o.startswith("train.corpus.out_dir=") for o in overrides):
        base.append(f"train.corpus.out_dir={corpus}")
    return base + overrides


@pytest.fixture
def corpus(tmp_path):
    """A corpus folder the preflight accepts (the shard is never read: the target never loads)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "tokens_00000.npz").write_bytes(b"")
    return folder


@pytest.mark.parametrize("overrides, make, line", TABLE, ids=[" ".join(o) for o, _, _ in TABLE])
@pytest.mark.usefixtures("no_model")
def test_a_bad_train_head_input_is_one_line_before_the_target_loads_and_writes_nothing(overrides, make, line,
                                                                                       tmp_path, corpus, capsys):
    file = make[1](tmp_path / make[0]) if make else None
    given = [o.format(tmp=tmp_path, file=file) for o in overrides]
    with pytest.raises(SystemExit) as err:
        run_train_head(_argv(given, tmp_path, corpus))
    text = err.value.code
    assert "[train_head]" not in capsys.readouterr().out  # the refusal is the command's only line
    print(f"{' '.join(given)} -> {text}")
    assert isinstance(text, str) and text.startswith(("[train_head] ", "[eagle2] "))  # exit status 1, no traceback
    assert "\n" not in text and line.format(tmp=tmp_path, file=file) in text
    assert not (tmp_path / "work").exists() and [p.name for p in corpus.iterdir()] == ["tokens_00000.npz"]


@pytest.mark.parametrize("overrides", [["stage=head"], ["stage=joint"], ["train=sharegpt", "stage=head"],
                                       ["stage=pard_draft"], ["stage=hass", "threads=1", "model.dtype=bf16"]])
@pytest.mark.usefixtures("no_model")
def test_good_inputs_pass_the_preflight_and_reach_the_target(overrides, tmp_path, corpus):
    """The control: the same entry with good inputs gets past every check to the target's load."""
    with pytest.raises(AssertionError, match="a model was loaded"):
        run_train_head(_argv(overrides, tmp_path, corpus))


def test_every_shipped_training_section_passes_the_loop_settings_check():
    """The loop's rule table (``support.loop_settings``) refuses none of the shipped train configs' sections."""
    from eagle2.training.objectives import objectives
    from eagle2.training.support.loop_settings import check_loop_settings

    checked = 0
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        for path in sorted((ROOT / "conf" / "train").glob("*.yaml")):
            cfg = compose("train_head", overrides=[f"train={path.stem}"])
            for stage in objectives():
                if cfg.train.get(stage) is not None:
                    check_loop_settings(cfg.train[stage], f"train.{stage}")
                    checked += 1
    assert checked >= 50
