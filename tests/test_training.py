"""Training and held-out evaluation of EAGLE heads and SpS draft models, on a tiny random Llama target
and a tiny self-distillation corpus built from it (CPU, offline, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from eagle2.heads.draft_model import build_draft_model, load_draft_model, save_draft_model
from eagle2.heads.eagle_head import load_head, save_head
from eagle2.training.corpora.prompts import build_corpus, worker_batches
from eagle2.training.data import all_sequences, make_batches, split_shards
from eagle2.training.evaluation.evaluate import chain_anchors
from eagle2.training.objectives.draft import draft_chain, evaluate_draft, train_draft
from eagle2.training.objectives.eagle import evaluate_head, head_chain, train_head
from eagle2.training.support.losses import LossProjection
from tests.conftest import tiny_head

VOCAB = 64


class ByteTokenizer:
    """Just enough of a tokenizer for ``build_corpus`` with the vicuna template."""

    eos_token_id = None  # no EOS: every answer has exactly max_new_tokens tokens
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [3 + b % (VOCAB - 3) for b in text.encode()]}


def tiny_target(seed: int = 0, layers: int = 3) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper next-token distributions than the default init gives
        model.lm_head.weight.mul_(20)
    return model


PROMPTS = [f"question {i}: {'abc' * (i % 4)} what is {i * 7} plus {i}?" for i in range(16)]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def tiny_corpus(target, out: Path, batch_size: int = 4) -> Path:
    """The self-distillation corpus of ``PROMPTS`` (16 answer tokens each), one shard per ``batch_size`` prompts."""
    build_corpus(target, ByteTokenizer(), PROMPTS, out, template="vicuna", system_prompt="S", batch_size=batch_size,
                 max_new_tokens=16, max_prompt_tokens=128, temperature=0.0, samples_per_prompt=1, seed=0)
    return out


@pytest.fixture(scope="module")
def corpus(target, tmp_path_factory) -> Path:
    return tiny_corpus(target, tmp_path_factory.mktemp("corpus"))


def head_cfg(**over):
    cfg = {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.0, "warmup": 2, "min_lr_ratio": 0.1, "epochs": 3,
           "max_steps": None, "token_budget": 256, "max_batch": 4, "grad_clip": 1.0, "noise": 0.05, "w_reg": 1.0,
           "w_cls": 0.1, "init_from_target": False, "num_layers": 1, "seed": 0, "loss_dtype": "float32",
           "checkpoint_every": 4, "log_every": 1, "val_every": None, "val_fraction": 0.25, "val_max_sequences": None,
           "unroll": 1, "unroll_cls_fraction": 1.0, "init_from": None, "max_train_sequences": None}
    cfg.update(over)
    return OmegaConf.create(cfg)


def draft_cfg(**over):
    base = dict(head_cfg(), num_layers=2, loss_on_prompt=False, lr=3e-3)
    base.update(over)
    return OmegaConf.create(base)


def train_losses(out_dir: Path, key: str = "loss") -> dict[int, float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if r["split"] == "train"}


def test_corpus_split_and_batches(corpus):
    train, val = split_shards(corpus, 0.25)
    assert len(train) == 3 and len(val) == 1 and val[0] not in train
    seqs = all_sequences(corpus)
    assert len(seqs) == 16 and all(len(s.tokens) == s.start + 16 - 1 or len(s.tokens) > s.start for s in seqs)
    lengths = [len(s.tokens) for s in seqs]
    batches = make_batches(lengths, 256, 4, seed=0, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(16))
    assert all(len(b) * max(lengths[i] for i in b) <= 256 or len(b) == 1 for b in batches)
    assert batches == make_batches(lengths, 256, 4, seed=0, epoch=0)
    assert batches != make_batches(lengths, 256, 4, seed=0, epoch=1)


def test_corpus_worker_takes_its_share_then_helps_from_the_end(target, corpus, tmp_path):
    assert worker_batches(list(range(10)), 1, 3) == [1, 4, 7, 9, 8, 6, 5, 3, 2, 0]
    # worker 1 of 2 alone writes every batch (its own, then the idle worker's), identical to one worker's
    build_corpus(target, ByteTokenizer(), PROMPTS, tmp_path, template="vicuna", system_prompt="S", batch_size=4,
                 max_new_tokens=16, max_prompt_tokens=128, temperature=0.0, samples_per_prompt=1, seed=0,
                 worker=1, workers=2)
    names = sorted(p.name for p in tmp_path.glob("shard_*.safetensors"))
    assert names == sorted(p.name for p in corpus.glob("shard_*.safetensors")) and len(names) == 4
    for name in names:
        torch.testing.assert_close(load_file(str(tmp_path / name)), load_file(str(corpus / name)))


@pytest.mark.parametrize("unroll", [{}, {"unroll": 2, "unroll_cls_fraction": 0.5}], ids=["1-step", "unrolled"])
def test_head_training_loss_decreases(target, corpus, tmp_path, unroll):
    _, summary = train_head(target, corpus, head_cfg(epochs=8, **unroll), tmp_path / "run")
    losses = train_losses(tmp_path / "run")
    steps = sorted(losses)
    first, last = sum(losses[s] for s in steps[:3]) / 3, sum(losses[s] for s in steps[-3:]) / 3
    assert last < 0.8 * first, (first, last)
    assert summary["step"] == summary["total_steps"] == len(steps)
    assert 0.0 <= summary["val"]["top1"] <= 1.0
    train, val = split_shards(corpus, 0.25)  # the shards it read, for training.json
    assert summary["corpus_shards"] == {"train": [p.name for p in train], "held_out": [p.name for p in val]}


def test_head_init_from_target_passes_feature_through(target):
    from eagle2.training.objectives.eagle import new_head

    head = new_head(target, init_from_target=True)
    h = head.config.hidden_size
    assert torch.equal(head.fc.weight[:, h:], torch.eye(h)) and not head.fc.weight[:, :h].any()
    last = target.model.layers[-1]
    assert torch.equal(head.layers[0].mlp.up_proj.weight, last.mlp.up_proj.weight)
    assert torch.equal(head.layers[0].self_attn.q_proj.weight, last.self_attn.q_proj.weight)


def assert_resume_matches_uninterrupted(train, target, corpus, cfg, tmp_path) -> None:
    """A run stopped after 5 steps and resumed ends with the weights (every tensor, buffers too) of an
    uninterrupted run; ``train`` is ``train_head``-shaped: (target, corpus, cfg, out_dir, stop_after)."""
    ref, ref_summary = train(target, corpus, cfg, tmp_path / "ref")
    _, part_summary = train(target, corpus, cfg, tmp_path / "cut", stop_after=5)
    assert part_summary["stopped"] and part_summary["step"] == 5
    resumed, summary = train(target, corpus, cfg, tmp_path / "cut")
    assert summary["step"] == ref_summary["step"] == ref_summary["total_steps"]
    for (k, a), b in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-6), k


def test_head_resume_after_stop_matches_uninterrupted(target, corpus, tmp_path):
    assert_resume_matches_uninterrupted(train_head, target, corpus, head_cfg(epochs=2), tmp_path)
    ref_losses, cut_losses = train_losses(tmp_path / "ref"), train_losses(tmp_path / "cut")
    assert sorted(cut_losses) == sorted(ref_losses)  # every step logged once, none repeated
    for step, loss in ref_losses.items():
        assert cut_losses[step] == pytest.approx(loss, rel=1e-5, abs=1e-6)


def test_head_resume_after_crash(target, corpus, tmp_path):
    cfg = head_cfg(epochs=2)
    ref, _ = train_head(target, corpus, cfg, tmp_path / "ref")

    def crash(step, stats):
        if step == 7:
            raise KeyboardInterrupt  # a kill between checkpoints (every 4 steps)

    with pytest.raises(KeyboardInterrupt):
        train_head(target, corpus, cfg, tmp_path / "cut", on_step=crash)
    state = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert state["step"] == 4
    assert max(train_losses(tmp_path / "cut")) == 7
    resumed, summary = train_head(target, corpus, cfg, tmp_path / "cut")
    assert summary["step"] == summary["total_steps"]
    for a, b in zip(ref.state_dict().values(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6)
    steps = [json.loads(line)["step"] for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == sorted(set(steps)) == sorted(train_losses(tmp_path / "ref"))  # steps 5-7 logged once


def test_head_asked_to_stop_checkpoints_its_step_and_resumes(target, corpus, tmp_path):
    """``kill -TERM`` between checkpoints (every 4 steps): the run ends at the step it was in, with that step's
    checkpoint (nothing lost), as a partial run; the same call resumes to an uninterrupted run's weights."""
    import os
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    cfg = head_cfg(epochs=2)
    ref, _ = train_head(target, corpus, cfg, tmp_path / "ref")

    def ask(step, stats):
        if step == 7:
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    _, part = train_head(target, corpus, cfg, tmp_path / "cut", on_step=ask)
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the run's alone
    assert part["stopped"] and part["partial"] and part["step"] == 7
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["step"] == 7
    resumed, summary = train_head(target, corpus, cfg, tmp_path / "cut")
    assert summary["step"] == summary["total_steps"]
    for a, b in zip(ref.state_dict().values(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6)


def test_draft_training_loss_decreases_and_round_trip(target, corpus, tmp_path):
    draft, _ = train_draft(target, corpus, draft_cfg(epochs=6), tmp_path / "run")
    kl = train_losses(tmp_path / "run", "kl")  # the soft CE minus the target's entropy
    steps = sorted(kl)
    assert sum(kl[s] for s in steps[-3:]) < 0.5 * sum(kl[s] for s in steps[:3])
    assert draft.lm_head is target.lm_head and draft.model.embed_tokens is target.model.embed_tokens
    save_draft_model(draft, tmp_path / "sps")
    loaded = load_draft_model(str(tmp_path / "sps"), target)
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        assert torch.equal(draft(ids).logits, loaded(ids).logits)
    assert not loaded.training


def test_evaluate_head_and_draft_numbers(target, corpus, tmp_path):
    seqs = all_sequences(corpus)
    head, _ = train_head(target, corpus, head_cfg(epochs=2), tmp_path / "head")
    save_head(head, tmp_path / "eagle_head")
    head = load_head(tmp_path / "eagle_head", target)
    cfg = OmegaConf.create({"depth": 5, "stride": 2, "max_sequences": None, "token_budget": 2048, "max_batch": 16,
                            "max_anchors_per_sequence": 64})
    for metrics in (evaluate_head(head, target, seqs, cfg),
                    evaluate_draft(build_draft_model(target, 2), target, seqs, cfg)):
        tf, chain = metrics["teacher_forced"], metrics["chain"]
        assert 0.0 <= tf["top1"] <= tf["top4"] <= 1.0 and tf["positions"] > 0
        probs = [chain["accept_ge"][str(d)] for d in range(1, 6)]
        assert all(0.0 <= p <= 1.0 for p in probs) and probs == sorted(probs, reverse=True)
        assert chain["tau"] == pytest.approx(1 + sum(probs)) and chain["anchors"] > 0


def _slow_chain(step_fn, seq, anchors, depth):
    """Reference chain drafting: one anchor at a time, re-running the whole prefix each step."""
    out = []
    for j in anchors:
        out.append(step_fn(seq, j, depth))
    return torch.tensor(out)


def test_chain_drafting_matches_step_by_step_reference(target, corpus):
    from eagle2.heads.eagle_head import causal_mask
    from eagle2.training.objectives.eagle import new_head

    seq = all_sequences(corpus)[3]
    head = new_head(target, init_from_target=False).eval()
    draft = build_draft_model(target, 2, init_from_target=False)
    proj = LossProjection(target.lm_head)
    anchors = chain_anchors(len(seq.tokens), seq.start, 4, 3)

    @torch.no_grad()
    def head_ref(seq, j, depth):
        toks, feats = list(seq.tokens[1:j + 2]), seq.features[:j + 1].float()
        drafted = []
        for _ in range(depth):
            n = len(toks)
            out = head(torch.tensor(toks)[None], feats[None], position_ids=torch.arange(n)[None],
                       attention_mask=causal_mask(n, 0, torch.float32))
            tok = int(proj(out[0, -1]).argmax())
            drafted.append(tok)
            toks.append(tok)
            feats = torch.cat([feats, out[0, -1:]])
        return drafted

    @torch.no_grad()
    def draft_ref(seq, j, depth):
        toks = list(seq.tokens[:j + 2])
        drafted = []
        for _ in range(depth):
            tok = int(draft(torch.tensor(toks)[None]).logits[0, -1].argmax())
            drafted.append(tok)
            toks.append(tok)
        return drafted

    assert torch.equal(head_chain(head, proj, seq, anchors, 4), _slow_chain(head_ref, seq, anchors, 4))
    assert torch.equal(draft_chain(draft, proj, seq, anchors, 4), _slow_chain(draft_ref, seq, anchors, 4))


def test_train_head_entry_config_composes():
    from hydra import compose, initialize_config_dir

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        for name in ("smollm2", "tiny"):
            cfg = compose(config_name="train_head", overrides=[f"train={name}"])
            assert cfg.stage in ("corpus", "head", "draft", "eval", "all")
            assert cfg.train.corpus.max_new_tokens > 0 and cfg.train.head.lr > 0 and cfg.train.draft.num_layers >= 1
            assert cfg.train.export.head and cfg.train.export.draft
        full = compose(config_name="train_head", overrides=["train=smollm2"])
        c = full.train.corpus
        assert (c.template, c.system_prompt, c.batch_size, c.max_new_tokens, c.max_prompt_tokens, c.temperature,
                c.samples_per_prompt, c.seed) == ("tokenizer", None, 32, 192, 384, 0.0, 1, 0)
        assert c.out_dir == "artifacts/work/smollm2/corpus"
        assert full.train.export.head == full.model.head == "artifacts/smollm2/eagle_head"


@pytest.mark.slow
def test_tiny_recipe_on_smollm2(tmp_path):
    """The tiny recipe end to end on the real SmolLM2 (needs the cached model)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    work = tmp_path / "tiny"
    subprocess.run([sys.executable, "train_head.py", "train=tiny", "stage=all", f"train.work_dir={work}",
                    f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=root, check=True)
    metrics = json.loads((work / "eagle_head" / "eval.json").read_text())
    assert 0.0 <= metrics["alpaca_heldout"]["teacher_forced"]["top1"] <= 1.0
    assert (work / "sps_draft" / "eval.json").is_file()
    shards = json.loads((work / "eagle_head" / "training.json").read_text())["corpus_shards"]
    assert shards["train"] and shards["held_out"] and not set(shards["train"]) & set(shards["held_out"])


def test_chunked_soft_cross_entropy_matches_naive():
    from eagle2.training.support.losses import soft_cross_entropy

    torch.manual_seed(0)
    lm_head = torch.nn.Linear(16, 50, bias=False)
    x = torch.randn(37, 16, requires_grad=True)
    y = torch.randn(37, 16)
    loss, stats = soft_cross_entropy(x, y, LossProjection(lm_head), topk=4, chunk=8)
    loss.backward()
    x2 = x.detach().clone().requires_grad_(True)
    q_logits = lm_head(y).detach()
    q = torch.softmax(q_logits, -1)
    logp = torch.log_softmax(lm_head(x2), -1)
    naive = -(q * logp).sum(-1).mean()
    naive.backward()
    assert loss.item() == pytest.approx(naive.item(), rel=1e-5)
    assert torch.allclose(x.grad, x2.grad, atol=1e-6)
    want = q_logits.argmax(-1)
    assert stats["top1"] == pytest.approx((logp.argmax(-1) == want).float().mean().item())
    assert stats["top4"] == pytest.approx((logp.topk(4, -1).indices == want[:, None]).any(-1).float().mean().item())
    assert stats["entropy"] == pytest.approx(-(q * q.log()).sum(-1).mean().item(), rel=1e-5)


@pytest.mark.parametrize("damage", ["missing", "unexpected", "shape"])
def test_draft_load_names_a_bad_key(target, tmp_path, damage):
    from safetensors.torch import load_file, save_file

    folder = save_draft_model(build_draft_model(target, 2), tmp_path / "sps")
    state = load_file(str(folder / "model.safetensors"))
    key = "model.layers.1.mlp.up_proj.weight"
    if damage == "missing":
        del state[key]
    elif damage == "unexpected":
        key = "lm_head.weight"
        state[key] = torch.zeros(VOCAB, 32)
    else:
        state[key] = torch.zeros(3, 3)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError if damage == "shape" else KeyError, match=key.replace(".", r"\.")):
        load_draft_model(str(folder), target)


def test_draft_layers_start_from_evenly_spaced_target_layers(target):
    from eagle2.heads.draft_model import layer_sources

    assert layer_sources(30, 2) == [0, 29] and layer_sources(30, 3) == [0, 14, 29] and layer_sources(30, 1) == [29]
    draft = build_draft_model(target, 2)
    for dst, src in zip(draft.model.layers, (0, 2)):
        assert torch.equal(dst.mlp.down_proj.weight, target.model.layers[src].mlp.down_proj.weight)
    assert torch.equal(draft.model.norm.weight, target.model.norm.weight)
    own = [n for n, p in draft.named_parameters() if p.requires_grad]
    assert own and not any("embed_tokens" in n or "lm_head" in n for n in own)


def test_ordinary_checkpoint_folder_loads_with_its_own_embedding(target, tmp_path):
    torch.manual_seed(3)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2)).eval()
    other.save_pretrained(tmp_path / "hub_like")
    loaded = load_draft_model(str(tmp_path / "hub_like"), target)
    ids = torch.randint(0, VOCAB, (1, 9))
    with torch.no_grad():
        assert torch.allclose(other(ids).logits, loaded(ids).logits)
    assert loaded.lm_head is not target.lm_head and not loaded.training


def test_dataset_answers_corpus_is_teacher_forced(target, tmp_path):
    """With the dataset's own answers the target reads them: tokens are prompt + answer, and the stored
    features equal a plain forward over that sequence."""
    from eagle2.core.cache import forward_target, new_cache
    from eagle2.training.shards import read_shards

    answers = [f"answer {i}" for i in range(len(PROMPTS))]
    build_corpus(target, ByteTokenizer(), PROMPTS, tmp_path, template="vicuna", system_prompt="S", batch_size=4,
                 max_new_tokens=16, max_prompt_tokens=128, temperature=0.0, samples_per_prompt=1, seed=0,
                 answers=answers)
    shards = read_shards(tmp_path)
    assert sum(len(s["response_start"]) for s in shards) == len(PROMPTS)
    shard = shards[0]
    start, end = int(shard["offsets"][0]), int(shard["offsets"][1])
    tokens = shard["tokens"][start:end].long()
    answer = tokens[int(shard["response_start"][0]):].tolist()
    assert answer in [ByteTokenizer()(a, add_special_tokens=False)["input_ids"] for a in answers]
    with torch.no_grad():
        full = forward_target(target, tokens[None], new_cache(target))[0]
    assert torch.allclose(shard["features"][start:end].float(), full, atol=1e-2)


def _unrolled_reference(head, seq, steps: int) -> list[dict[int, torch.Tensor]]:
    """Per step s, {position j: predicted feature}, drafted one chain at a time through a KV cache:
    the true prefix 0..a, then s-1 of the head's own features (true tokens)."""
    from eagle2.core.cache import new_cache
    from eagle2.heads.eagle_head import causal_mask

    tokens, feats = seq.tokens, seq.features.float()
    n_pos = len(tokens) - 1
    preds: list[dict[int, torch.Tensor]] = [{} for _ in range(steps)]
    for a in range(n_pos):
        cache = new_cache(head)
        out = head(tokens[None, 1:a + 2], feats[None, :a + 1], position_ids=torch.arange(a + 1)[None],
                   attention_mask=causal_mask(a + 1, 0, torch.float32), cache=cache)
        f_hat = out[0, -1]
        preds[0][a] = f_hat
        for s in range(2, steps + 1):
            j = a + s - 1
            if j >= n_pos:
                break
            f_hat = head(tokens[None, j + 1:j + 2], f_hat[None, None], position_ids=torch.tensor([[j]]),
                         attention_mask=causal_mask(1, j, torch.float32), cache=cache)[0, 0]
            preds[s - 1][j] = f_hat
    return preds


@pytest.mark.parametrize("steps", [2, 3])
def test_unrolled_head_loss_matches_step_by_step_drafting(target, corpus, steps):
    """The training-time-test loss equals the loss of features drafted one chain at a time."""
    from eagle2.training.data import collate
    from eagle2.training.objectives.eagle import head_loss

    torch.manual_seed(1)
    head = tiny_head(target)
    seqs = all_sequences(corpus)[:3]
    proj = LossProjection(target.get_output_embeddings())
    batch = collate(seqs, "cpu")
    with torch.no_grad():
        loss, stats = head_loss(head, batch, proj=proj, noise=0.0, w_reg=1.0, w_cls=0.0, unroll=steps,
                                train=False)
        refs = [_unrolled_reference(head, s, steps) for s in seqs]
    import torch.nn.functional as F

    step_losses = []
    for s in range(steps):
        p, y = [], []
        for seq, ref in zip(seqs, refs):
            for j, f_hat in ref[s].items():
                if j + 1 >= seq.start:
                    p.append(f_hat)
                    y.append(seq.features[j + 1].float())
        step_losses.append(F.smooth_l1_loss(torch.stack(p), torch.stack(y)))
    assert loss.item() == pytest.approx(float(sum(step_losses) / steps), rel=1e-4)
    assert f"top1_s{steps}" in stats


def test_head_training_continues_from_a_saved_head(target, corpus, tmp_path):
    """``init_from``: training starts from a saved head's weights (lr 0 keeps them) and its vocabulary."""
    start = tiny_head(target, seed=5)
    start.draft_vocab = torch.tensor([4, 9, 7])
    save_head(start, tmp_path / "start")
    trained, _ = train_head(target, corpus, head_cfg(epochs=1, lr=0.0, init_from=str(tmp_path / "start")),
                            tmp_path / "run")
    for (k, a), b in zip(start.state_dict().items(), trained.state_dict().values()):
        assert torch.equal(a, b), k
    assert trained.draft_vocab.tolist() == [4, 9, 7]
    fresh, _ = train_head(target, corpus, head_cfg(epochs=1, lr=0.0), tmp_path / "fresh")
    assert not torch.equal(fresh.fc.weight, start.fc.weight)


def test_autocast_setting_follows_the_cpu(monkeypatch, target, corpus, tmp_path):
    """``autocast=auto`` is bf16 only where the CPU multiplies bf16 natively (an ONEDNN_MAX_CPU_ISA cap
    below bf16 counts as none); train rows record the choice, the CPU kind and the rate."""
    from eagle2.core.cpu import cpu_has_native_bf16
    from eagle2.training.support.precision import autocast_dtype

    cpu = torch.device("cpu")
    assert autocast_dtype("off", cpu) is None and autocast_dtype("bf16", cpu) == torch.bfloat16
    assert autocast_dtype("auto", cpu) == (torch.bfloat16 if cpu_has_native_bf16() else None)
    with pytest.raises(ValueError, match="autocast"):
        autocast_dtype("fp16", cpu)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert autocast_dtype("auto", cpu) is None
    train_head(target, corpus, head_cfg(epochs=1, autocast="auto"), tmp_path / "run")
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert (row["autocast"], row["cpu_kind"]) == ("off", "avx2") and row["tok_s"] > 0 and row["threads"] >= 1
