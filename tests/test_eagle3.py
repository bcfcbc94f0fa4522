"""EAGLE-3: feature capture, the official checkpoint layout (good and bad), and lossless decoding."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from eagle2.bench.methods import build_drafter
from eagle2.core.engine import generate
from eagle2.core.features import LayerTap, eagle3_layers
from eagle2.core.sampling import SamplingParams
from eagle2.heads.eagle3_head import Eagle3Head, load_eagle3_head, save_eagle3_head
from eagle2.heads.eagle_head import causal_mask
from tests.conftest import tiny_eagle3_head, tiny_llama

GREEDY = SamplingParams()
EAGLE3 = OmegaConf.create({"name": "eagle3", "total_tokens": 6, "depth": 3, "top_k": 3})


def random_eagle3_head(target, draft_vocab_size: int | None = None, seed: int = 0) -> Eagle3Head:
    return tiny_eagle3_head(target, seed=seed, draft_vocab_size=draft_vocab_size)


@pytest.fixture(scope="module")
def tiny6():
    return tiny_llama(vocab=64, layers=6, seed=3, scale=4.0)


def test_layer_tap_reads_the_inputs_of_the_named_layers(tiny6):
    ids = torch.tensor([[5, 9, 2, 7, 7, 3]])
    with LayerTap(tiny6, (2, 3, 5)) as tap:
        out = tiny6(ids, output_hidden_states=True)
        fused = tap.read()
    expected = torch.cat([out.hidden_states[i] for i in (2, 3, 5)], dim=-1)  # hidden_states[i]: input of layer i
    torch.testing.assert_close(fused, expected)
    assert not tiny6.model.layers[2]._forward_pre_hooks  # closed: no hook left behind
    assert eagle3_layers(32) == (2, 16, 29) and eagle3_layers(30) == (2, 15, 27)


def test_official_layout_round_trip_and_d2t(tiny6, tmp_path):
    head = random_eagle3_head(tiny6, draft_vocab_size=40)
    folder = save_eagle3_head(head, tmp_path / "h")
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= set(state)
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * 32 and state["fc.weight"].shape == (32, 96)
    ids = torch.arange(40) + state["d2t"]  # draft id -> target id, as the authors' code maps it
    assert torch.equal(state["t2d"].nonzero()[:, 0], ids) and bool((ids[1:] > ids[:-1]).all())
    assert json.loads((folder / "config.json").read_text())["draft_vocab_size"] == 40
    loaded = load_eagle3_head(folder, tiny6)
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value)
    assert loaded.feature_layers == eagle3_layers(6)


def _write(folder, state, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_bad_checkpoints_are_refused_by_name(tiny6, tmp_path):
    head = random_eagle3_head(tiny6, draft_vocab_size=40)
    good = save_eagle3_head(head, tmp_path / "good")
    config = json.loads((good / "config.json").read_text())
    state = {k: v for k, v in head.state_dict().items() if "rotary" not in k}
    # a .bin (loaded with weights_only=True) with the optional embedding loads
    loaded = load_eagle3_head(_write(tmp_path / "bin", {**state, "embed_tokens.weight": torch.randn(64, 32)},
                                     config), tiny6)
    assert loaded.embed_tokens is not tiny6.get_input_embeddings()
    missing = {k: v for k, v in state.items() if k != "norm.weight"}
    with pytest.raises(KeyError, match="norm.weight"):
        load_eagle3_head(_write(tmp_path / "missing", missing, config), tiny6)
    with pytest.raises(KeyError, match="midlayer.extra"):
        load_eagle3_head(_write(tmp_path / "extra", {**state, "midlayer.extra": torch.zeros(1)}, config), tiny6)
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_eagle3_head(_write(tmp_path / "shape", {**state, "lm_head.weight": torch.zeros(41, 32)}, config), tiny6)
    with pytest.raises(KeyError, match="draft_vocab_size"):
        load_eagle3_head(_write(tmp_path / "eagle2", state, {k: v for k, v in config.items()
                                                             if k != "draft_vocab_size"}), tiny6)
    bad_d2t = {**state, "d2t": state["d2t"] + 1000}
    with pytest.raises(ValueError, match="d2t"):
        load_eagle3_head(_write(tmp_path / "d2t", bad_d2t, config), tiny6)


class RootRecorder:
    """Wraps a drafter: keeps the log-probabilities of the root's children of every round."""

    def __init__(self, drafter):
        self.inner, self.roots, self.prefixes = drafter, [], []
        catch_up = drafter.catch_up

        def recording_catch_up():
            out = catch_up()
            self.roots.append(out.clone())
            self.prefixes.append(drafter.committed)
            return out
        drafter.catch_up = recording_catch_up


def test_engine_feeds_the_head_the_tapped_features_of_the_committed_tokens(tiny6):
    """The head's root distribution in every round equals the head run offline over a fresh
    teacher-forced forward of the committed sequence: right layers, right positions (kept tree nodes)."""
    head = random_eagle3_head(tiny6, seed=1)
    # every token is a child of the root, so each round accepts one (rarely the best-ranked one)
    wide = OmegaConf.merge(EAGLE3, {"total_tokens": 80, "depth": 2, "top_k": 64})
    drafter = build_drafter(wide, tiny6, GREEDY, None, weights={"eagle3_head": head})
    rec = RootRecorder(drafter)
    prompt = [2, 5, 3, 9, 4]
    out = generate(tiny6, drafter, prompt, GREEDY, 16, set())
    assert min(out.accept_lengths[:-1]) >= 2
    seq = torch.tensor([prompt + out.output_ids])
    with torch.no_grad():
        hs = tiny6(seq, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i] for i in eagle3_layers(6)], dim=-1)[0]
        n = seq.shape[1] - 1  # head position j reads (t[j+1], f[j])
        pred = head(seq[:, 1:], feats[None, :-1], position_ids=torch.arange(n)[None],
                    attention_mask=causal_mask(n, 0, feats.dtype))[0]
        logp = torch.log_softmax(head.drafting_lm_head()(pred).float(), -1)
    for root_logp, committed in zip(rec.roots, rec.prefixes):
        torch.testing.assert_close(root_logp, logp[committed - 1], atol=1e-4, rtol=1e-4)
    # negative control: a drafter reading the wrong layers drafts from other distributions
    head.feature_layers = (1, 3, 4)
    wrong = RootRecorder(build_drafter(wide, tiny6, GREEDY, None, weights={"eagle3_head": head}))
    generate(tiny6, wrong.inner, prompt, GREEDY, 16, set())
    assert not torch.allclose(wrong.roots[1], logp[wrong.prefixes[1] - 1], atol=1e-3)


@pytest.mark.parametrize("draft_vocab", [None, 40])
def test_eagle3_greedy_equals_plain_on_tiny(tiny6, draft_vocab):
    head = random_eagle3_head(tiny6, draft_vocab_size=draft_vocab, seed=2)
    plain = build_drafter(OmegaConf.create({"name": "plain"}), tiny6, GREEDY, None)
    for prompt in ([2, 5, 3], [7, 7, 3, 9, 4, 11]):
        drafter = build_drafter(EAGLE3, tiny6, GREEDY, None, weights={"eagle3_head": head})
        want = generate(tiny6, plain, prompt, GREEDY, 24, set()).output_ids
        assert generate(tiny6, drafter, prompt, GREEDY, 24, set()).output_ids == want


def test_random_official_head_runs_through_run_py_identical_to_plain(tmp_path, smollm2, shared_target_loads):
    """The done-when check: a random head in the official layout for SmolLM2's shape, via
    ``method=eagle3 model.eagle3_head=DIR``, decodes token-identically to plain in fp32."""
    from analysis.metrics import iter_rows
    from eagle2.bench.runner import run
    from eagle2.prompts.questions import PROJECT_ROOT

    head_dir = save_eagle3_head(random_eagle3_head(smollm2[0], draft_vocab_size=8192), tmp_path / "head")
    common = ["logger=none", "warmup_tokens=0", "dataset=gsm8k", "dataset.limit=1", "max_new_tokens=12",
              f"paths.results={tmp_path / 'r'}", f"model.eagle3_head={head_dir}", "model.dtype=float32",
              "model.eagle2.total_tokens=6"]
    with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
        for method in ("plain", "eagle3"):
            run(compose("config", overrides=[f"method={method}", *common]))
    rows = {(r["method"], r["turn"]): r["output_ids"] for r in iter_rows(tmp_path / "r")}
    assert rows[("eagle3", 0)] == rows[("plain", 0)]


def test_a_reduced_vocabulary_head_drafts_only_its_own_tokens(tiny6):
    """``d2t`` holds offsets (target id = draft id + d2t[draft id]): every drafted token is one of the
    head's draft vocabulary, and its draft ids map back to exactly that set."""
    head = random_eagle3_head(tiny6, draft_vocab_size=16, seed=7)
    vocab = set(torch.nonzero(head.t2d).flatten().tolist())
    assert len(vocab) == 16 and set(head.draft_token_ids().tolist()) == vocab
    assert vocab != set(range(16)) and vocab != set(head.d2t.tolist())  # offsets and ids differ here
    drafter = build_drafter(EAGLE3, tiny6, GREEDY, None, weights={"eagle3_head": head})
    drafted, propose = [], drafter.propose

    def recording(root, room):
        tree = propose(root, room)
        drafted.extend(tree.tokens[1:].tolist())
        return tree

    drafter.propose = recording
    generate(tiny6, drafter, [2, 5, 3, 9], GREEDY, 20, set())
    assert len(drafted) > 20 and set(drafted) <= vocab, sorted(set(drafted) - vocab)


def test_each_drafted_token_is_the_target_id_of_its_draft_logit(tiny6):
    """``d2t`` read at the draft id itself: the drafter's k best children are, best first, the target ids
    ``d + d2t[d]`` of the k highest draft log-probabilities d, with those log-probabilities as confidences
    (an index off by one would propose a neighbour's token, or run past the table)."""
    head = random_eagle3_head(tiny6, draft_vocab_size=16, seed=7)
    drafter = build_drafter(EAGLE3, tiny6, GREEDY, None, weights={"eagle3_head": head})
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        logp = drafter.log_probs(torch.randn(1, tiny6.config.hidden_size, generator=gen))[0]  # (16,)
        tokens, conf = drafter.top(logp, 3)
        draft_ids = torch.topk(logp, 3).indices
        assert tokens.tolist() == (draft_ids + head.d2t[draft_ids]).tolist()
        assert torch.equal(conf, logp[draft_ids]) and bool(head.t2d[tokens].all())
    last = torch.full((16,), -1e9)
    last[15] = 0.0  # the table's last row: an off-by-one runs past it or maps elsewhere
    assert drafter.top(last, 1)[0].tolist() == [15 + int(head.d2t[15])]
