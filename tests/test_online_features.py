"""Online features (the target's forward inside the training step) and the drafting-vocabulary loss: the
features equal those of the offline feature shards, a head trains on a token corpus alone, and the
restricted soft cross-entropy is the full one over the kept rows (tiny random targets, seconds)."""

from __future__ import annotations

import json

import pytest
import torch

from eagle2.training.data import collate, is_token_corpus, load_sequences, split_shards, token_sequences
from eagle2.training.features import OnlineFeatures, tokens_to_features
from eagle2.training.objectives.eagle import train_head
from eagle2.training.shards import write_token_shard
from eagle2.training.support.losses import LossProjection, soft_cross_entropy
from tests.test_training import head_cfg, tiny_target


@pytest.fixture(scope="module")
def token_corpus(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    out = tmp_path_factory.mktemp("tokens")
    for shard in range(4):
        convs = []
        for _ in range(6):
            n = int(torch.randint(12, 40, (1,), generator=g))
            ids = torch.randint(2, 64, (n,), generator=g).tolist()
            convs.append((ids, [(4, n // 2), (n // 2 + 3, n)]))
        write_token_shard(out / f"tokens_{shard:05d}.npz", convs)
    return out


def test_online_features_equal_the_offline_shards(token_corpus, tmp_path):
    target = tiny_target()
    feature_dir = tokens_to_features(target, token_corpus, tmp_path / "features", pad_id=0, tap_layers=(0, 2))
    assert is_token_corpus(token_corpus) and not is_token_corpus(feature_dir)
    paths = split_shards(token_corpus, 0.25, "tokens_*.npz")[0]
    online = token_sequences(paths)
    offline = load_sequences([feature_dir / p.name.replace("tokens_", "shard_").replace(".npz", ".safetensors")
                              for p in paths])
    assert [s.tokens.tolist() for s in online] == [s.tokens.tolist() for s in offline]
    batch = OnlineFeatures(target, (0, 2))(collate(online[:5], "cpu"))
    ref = collate(offline[:5], "cpu")
    assert torch.equal(batch["answer"], ref["answer"]) and torch.equal(batch["start"], ref["start"])
    valid = ref["valid"]
    for key in ("features", "layer_features"):  # offline shards store fp16
        torch.testing.assert_close(batch[key][valid], ref[key][valid], atol=2e-2, rtol=1e-2)
    kept = dict(ref)
    assert OnlineFeatures(target)(kept) is kept and torch.equal(kept["features"], ref["features"])


def test_a_head_trains_on_a_token_corpus_with_online_features(token_corpus, tmp_path):
    target = tiny_target()
    _, summary = train_head(target, token_corpus, head_cfg(epochs=6, autocast="off", cls_vocab_size=48),
                            tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    assert summary["step"] >= 12 and sum(losses[-3:]) < sum(losses[:3])
    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert ckpt["fingerprint"]["features"] == "online" and ckpt["fingerprint"]["cls_vocab_size"] == 48


def test_drafting_vocabulary_cross_entropy_is_the_full_one_over_its_rows():
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(16, 50, bias=False)
    ids = torch.tensor([3, 7, 1, 40, 22, 9, 31])
    x = torch.randn(23, 16, requires_grad=True)
    y = torch.randn(23, 16)
    proj = LossProjection(lm_head, torch.float32, ids)
    loss, _ = soft_cross_entropy(x, y, proj, topk=0, chunk=5)
    loss.backward()
    x2 = x.detach().clone().double().requires_grad_(True)
    w = lm_head.weight.detach().double()[ids]
    q = torch.softmax(y.double() @ w.T, -1)
    naive = -(q * torch.log_softmax(x2 @ w.T, -1)).sum(-1).mean()
    naive.backward()
    assert loss.item() == pytest.approx(naive.item(), rel=1e-5)
    torch.testing.assert_close(x.grad.double(), x2.grad, atol=1e-6, rtol=1e-4)
    full = proj.exact()  # validation and evaluation use the full vocabulary
    assert full.weight.shape == lm_head.weight.shape and full is not proj


@pytest.mark.parametrize("rows_in", ["gzip", "resume_json"])
def test_a_fresh_clone_continues_from_the_committed_resume_state(rows_in, token_corpus, tmp_path):
    """No checkpoint.pt (never committed), but ``resume_dir``: the run goes on at the step, epoch, batch and
    learning rate where the committed state was written, keeping its metrics rows (from ``metrics.jsonl.gz``,
    or from ``resume.json``'s ``rows`` where an older trainer kept them); the weights are that state's (bf16).
    Without the state it would start again at step 0."""
    target = tiny_target()
    cfg = head_cfg(epochs=4, autocast="off", checkpoint_every=3, resume_dir=str(tmp_path / "committed"))
    _, first = train_head(target, token_corpus, cfg, tmp_path / "run", stop_after=6)
    state_path, rows_path = tmp_path / "committed" / "resume.json", tmp_path / "committed" / "metrics.jsonl.gz"
    assert first["partial"] and "rows" not in json.loads(state_path.read_text())
    if rows_in == "resume_json":  # the layout of a state written before the rows were gzipped beside it
        from eagle2.training.support.warm_state import warm_rows

        state = json.loads(state_path.read_text())
        state_path.write_text(json.dumps({**state, "rows": warm_rows(tmp_path / "committed", state)}))
        rows_path.unlink()
    (tmp_path / "run" / "checkpoint.pt").unlink()  # a fresh clone has only what is committed
    (tmp_path / "run" / "metrics.jsonl").unlink()
    ran = []
    head, summary = train_head(target, token_corpus, cfg, tmp_path / "run", stop_after=7,
                               on_step=lambda step, stats: ran.append(step))
    assert ran == [7]  # one step: it went on from step 6
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r["split"] == "train"]
    assert steps == list(range(1, 8)) and summary["step"] == 7
    cfg_plain = head_cfg(epochs=4, autocast="off", checkpoint_every=3)
    train_head(target, token_corpus, cfg_plain, tmp_path / "uninterrupted", stop_after=7)
    plain = [json.loads(r) for r in (tmp_path / "uninterrupted" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["lr"] == pytest.approx(plain[-1]["lr"], rel=1e-9)  # the schedule went on where it was
    assert rows[-1]["loss"] == pytest.approx(plain[-1]["loss"], rel=0.2)  # near, not equal: warm moments
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "committed" / "trainable.safetensors"))
    assert saved["fc.weight"].dtype == torch.bfloat16


def test_a_state_promoted_into_the_init_heads_resumes_from_resume_json_alone(token_corpus, tmp_path):
    """``snapshot_heads --promote``: the state's weights written into the head the run starts from, only
    ``resume.json`` kept (``trainable.safetensors`` is not committed): the run goes on at the state's step
    from those heads. Control: heads that are not the state's weights (one tensor nudged by one bf16 step)
    are refused in one line naming the folder, before any step."""
    from safetensors.torch import load_file

    from eagle2.heads.eagle_head import save_head
    from eagle2.training.support.warm_state import WarmStateError, read_warm_state
    from experiments.research.snapshot_heads import promote

    target = tiny_target()
    committed = tmp_path / "committed"
    cfg = head_cfg(epochs=4, autocast="off", checkpoint_every=3, resume_dir=str(committed))
    head, _ = train_head(target, token_corpus, cfg, tmp_path / "run", stop_after=6)
    (tmp_path / "run" / "checkpoint.pt").unlink()
    heads = save_head(head, tmp_path / "heads")  # the folder init_from names; promote overwrites its weights
    (heads / "training.json").write_text(json.dumps({"kind": "head", "target": "tiny", "recipe": {"lr": 1}}))
    (heads / "eval.json").write_text("{}")  # measured the weights promote replaces
    digest = promote(committed, {"": heads}, target)
    card = json.loads((heads / "training.json").read_text())
    assert card["promoted_from"]["step"] == 6 and card["promoted_from"]["weights_sha256"] == digest
    assert card["continued_from"]["recipe"] == {"lr": 1} and not (heads / "eval.json").exists()
    assert not (heads / "snapshot.json").exists()  # (a snapshot's stamp, not a promoted head's)
    stored = load_file(str(committed / "trainable.safetensors"))
    (committed / "trainable.safetensors").unlink()  # what a clone holds: resume.json and the promoted heads
    assert read_warm_state(committed)["weights_sha256"] == digest
    nudged = tmp_path / "nudged"
    save_head(head, nudged)
    weights = load_file(str(nudged / "model.safetensors"))
    key = next(k for k in weights if k in stored)
    weights[key] = (stored[key].float() * 1.01).to(weights[key].dtype)
    from safetensors.torch import save_file

    save_file(weights, str(nudged / "model.safetensors"))
    with pytest.raises(WarmStateError, match="are not its weights") as refused:
        train_head(target, token_corpus, head_cfg(**{**cfg, "init_from": str(nudged)}), tmp_path / "run",
                   stop_after=7)
    assert str(committed) in str(refused.value) and "\n" not in str(refused.value)
    ran = []
    resumed, summary = train_head(target, token_corpus, head_cfg(**{**cfg, "init_from": str(heads)}),
                                  tmp_path / "run", stop_after=7, on_step=lambda step, stats: ran.append(step))
    assert ran == [7] and summary["step"] == 7  # it went on from step 6, from the promoted heads
