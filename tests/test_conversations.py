"""The self-instruct two-turn conversation generator (``eagle2/training/corpora/conversations.py``) and its stages,
on tiny random models and a character tokenizer (seconds); the SmolLM2 tokenizer for its template."""

from __future__ import annotations

import torch

from eagle2.training.corpora.conversations import generate_conversations, user_header_ids
from eagle2.training.corpora.generate import generate
from eagle2.training.corpora.prompts import build_corpus
from eagle2.training.data import shard_sequences
from eagle2.training.shards import Dedup, ngram_keys, read_shards, read_token_shard
from tests.conftest import tiny_llama

SPECIAL = {2: "<|begin_of_text|>", 59: "<|start_header_id|>", 60: "<|end_header_id|>"}
CHARS = "~" + "abcdefghijklmnopqrstuvwxyz0123456789 .,?!:'\n-()\"/;+=*&%#" + "^`_"  # ids 0 and 3..63


class CharTokenizer:
    """A lossless character tokenizer over 64 ids for the llama3 template: 1 = ``<|eot_id|>`` (EOS, the
    only special id), 2 and 59/60 the template's other markers, the rest characters (text is lower-cased)."""

    eos_token_id, pad_token_id, all_special_ids = 1, 0, [1]

    def __init__(self):
        self.to_id = {c: i for i, c in zip([0] + list(range(3, 59)) + [61, 62, 63], CHARS)}
        self.words = {1: "<|eot_id|>", **SPECIAL}

    def __call__(self, text, add_special_tokens=True):
        ids, i, text = [], 0, text.lower()
        while i < len(text):
            hit = next(((k, w) for k, w in self.words.items() if text.startswith(w, i)), None)
            if hit:
                ids.append(hit[0])
                i += len(hit[1])
            else:
                ids.append(self.to_id.get(text[i], self.to_id[" "]))
                i += 1
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens=False):
        chars = {i: c for c, i in self.to_id.items()}
        return "".join("" if (i == 1 and skip_special_tokens) else self.words.get(i, chars.get(i, "")) for i in ids)


def greedy_loop(target, prompt: list[int], stops: set[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding, one full forward per token, no cache, no batch: the reference."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            ids.append(int(target(torch.tensor([ids])).logits[0, -1].argmax()))
            if ids[-1] in stops:
                break
    return ids[len(prompt):]


def test_the_corpus_decoder_is_greedy_decoding_and_samples_reproducibly():
    """``generate`` (every corpus's batched decoder) at temperature 0 is a plain greedy loop per prompt (rows of
    different lengths in one batch, stops kept); top-p near 0 is greedy; a seed reproduces a sampled batch."""
    target = tiny_llama(vocab=64, seed=3, scale=4.0)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [4], [8, 8, 2, 3]]
    stop = {greedy_loop(target, prompts[0], set(), 12)[4]}  # a token the first answer reaches: its stop
    greedy = generate(target, prompts, stop, 12, batch_size=3)
    assert greedy == [greedy_loop(target, p, stop, 12) for p in prompts] and greedy[0][-1] in stop
    assert generate(target, prompts, {1}, 12) == [greedy_loop(target, p, {1}, 12) for p in prompts]
    assert generate(target, prompts, stop, 12, temperature=1.0, top_p=1e-6, generator=torch.Generator()) == greedy
    one = generate(target, prompts, {1}, 12, temperature=1.0, top_p=0.95, generator=torch.Generator().manual_seed(0))
    assert one == generate(target, prompts, {1}, 12, temperature=1.0, top_p=0.95,
                           generator=torch.Generator().manual_seed(0))
    assert all(len(new) <= 12 and 1 not in new[:-1] for new in one)


def test_a_greedy_corpus_answer_is_the_plain_greedy_loop(tmp_path):
    """The prompts corpus (``build_corpus``) stores, after each prompt, exactly a plain greedy loop's answer."""
    from tests.test_training import PROMPTS, ByteTokenizer, tiny_target

    target, tok = tiny_target(), ByteTokenizer()
    build_corpus(target, tok, PROMPTS[:5], tmp_path, template="vicuna", system_prompt="S", batch_size=3,
                 max_new_tokens=10, max_prompt_tokens=128, temperature=0.0, samples_per_prompt=1, seed=0)
    rows = [seq for shard in read_shards(tmp_path) for seq in shard_sequences(shard)]
    assert len(rows) == 5
    for seq in rows:
        prompt = seq.tokens[:seq.start].tolist()
        assert seq.tokens[seq.start:].tolist() == greedy_loop(target, prompt, set(), 10)


def test_dedup_drops_benchmark_overlap_and_near_duplicates():
    from eagle2.prompts.questions import all_benchmark_questions

    bench = all_benchmark_questions()
    question = max(bench, key=len)
    dedup = Dedup(bench)
    words = question.split()
    assert dedup.reason("Hello there. " + " ".join(words[:9]).upper() + " and more") == "benchmark"
    short = min((q for q in bench if len(q.split()) < 8), key=len, default=None)
    if short is not None:  # a short benchmark turn: its whole normalised text
        assert dedup.reason(short.lower() + "!") == "benchmark"
    text = "Write a poem about a lighthouse keeper who befriends a lonely whale in winter"
    assert dedup.reason(text) is None
    keys = dedup.add(text)
    assert keys == ngram_keys(text) and len(keys) == len(text.split()) - 7
    assert dedup.reason(text + " please") == "duplicate"
    assert dedup.reason(text + " please", allowed=keys) is None  # a second turn may quote its own first
    assert dedup.reason("Tell me about a lighthouse keeper who befriends a lonely whale") == "duplicate"  # 1 of 2
    assert dedup.reason("a lighthouse keeper who befriends a lonely whale, then sails to the old harbour town "
                        "to buy bread and fresh fish for the long dark season") is None  # 1 of 20: different


def test_user_header_of_smollm2_template_and_its_prefix_property(smollm2):
    """The user header is the chat template up to the user's text; two-turn prompts repeat the first."""
    from eagle2.prompts.chat import encode_conversation

    _, tok = smollm2
    header = user_header_ids(tok, "tokenizer", [], [], None)
    assert tok.decode(header).endswith("<|im_start|>user\n")
    p1 = encode_conversation(tok, "tokenizer", ["Write a haiku."], [], None)
    answer = tok("Leaves fall.\nSoft wind.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    p2 = encode_conversation(tok, "tokenizer", ["Write a haiku.", "Another one."], ["Leaves fall.\nSoft wind."], None)
    assert p2[: len(p1) + len(answer)] == p1 + answer
    after = user_header_ids(tok, "tokenizer", ["Write a haiku."], ["Leaves fall.\nSoft wind."], None)
    assert p2[: len(after)] == after and tok.decode(after).endswith("<|im_start|>user\n")


def test_generate_conversations_writes_resumable_two_turn_token_shards(tmp_path):
    target = tiny_llama(vocab=64, seed=0, layers=2, scale=8.0)
    lm_head = torch.nn.Linear(32, 64, bias=True)  # an EOS bias: sampled user turns end within the limit
    with torch.no_grad():
        lm_head.weight.copy_(target.lm_head.weight)
        lm_head.bias.zero_()[1] = 1.5
    target.lm_head = lm_head
    tok = CharTokenizer()
    kw = dict(categories={"writing": ["Write a poem about"], "math": ["Calculate", "Solve"]},
              follow_ups=["Now", "Can you"], template="llama3", system_prompt="be brief", batch_size=6,
              max_user_tokens=64, min_user_tokens=3, max_answer_tokens=10, temperature=1.0, top_p=0.95, seed=0)
    generate_conversations(target, tok, tmp_path / "a", n_batches=2, **kw)
    generate_conversations(target, tok, tmp_path / "b", n_batches=1, **kw)  # killed after one shard ...
    generate_conversations(target, tok, tmp_path / "b", n_batches=2, **kw)  # ... and resumed
    two_turn = 0
    for name in ("tokens_00000.npz", "tokens_00001.npz"):
        convs, meta = read_token_shard(tmp_path / "a" / name)
        convs_b, meta_b = read_token_shard(tmp_path / "b" / name)
        assert convs == convs_b and meta["conversations"] == meta_b["conversations"]
        assert len(convs) + sum(v for k, v in meta["dropped"].items() if k.startswith("turn1_")) == 6
        for (ids, spans), record in zip(convs, meta["conversations"]):
            assert len(spans) == len(record["users"]) and record["category"] in ("writing", "math")
            assert tok.decode(ids[: spans[0][0]]).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
            assert tok.decode(ids[: spans[0][0]]).startswith("<|begin_of_text|><|start_header_id|>system")
            if len(spans) == 2:
                two_turn += 1
                between = tok.decode(ids[spans[0][1]: spans[1][0]])
                assert record["users"][1].lower() in between and spans[1][1] == len(ids)
    assert two_turn >= 1


def test_conversation_stages_are_named_only_and_their_configs_compose():
    """stage=conversations / stage=features run when named, never in ``all``; both configs compose."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from eagle2.training.recipe import STAGES, stages_of

    assert stages_of("conversations") == ("conversations",) and stages_of("features") == ("features",)
    assert stages_of("all") == STAGES and "conversations" not in STAGES
    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        for train in ("smollm2", "tiny"):
            c = compose(config_name="train_head", overrides=[f"train={train}"]).train.conversations
            assert c.template == "tokenizer" and len(c.categories) == 8 and c.features.tap_layers == "eagle3"
            assert c.features.out_dir.startswith("artifacts/work/")
    assert c.out_dir == "artifacts/work/tiny/conversations_tokens"
