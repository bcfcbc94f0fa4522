"""REST, SuffixDecoding and SAMD on the real SmolLM2 in fp32 with a real corpus (a datastore of the
shipped conversations corpus): token-identical to plain decoding, drafts accepted. Their certification on
tiny models (temperature 0 and > 0, negative controls) is in ``test_lossless_new_methods``, batched
decoding in ``test_batch``."""

from __future__ import annotations

import pytest

from eagle2.prompts.chat import encode_conversation
from tests.test_greedy import QUESTIONS, decode


@pytest.fixture(scope="module")
def corpus_datastore():
    """A datastore of the shipped conversations corpus (SmolLM2 token shards, tracked in git)."""
    from eagle2.heads.rest_datastore import Datastore
    from eagle2.training.support.datastore import SHIPPED_SHARDS, chat_entries

    return Datastore.from_entries(chat_entries([SHIPPED_SHARDS]))


@pytest.mark.slow  # ~2-6 min: SmolLM2 in fp32, two questions, plain and three methods each
def test_equal_plain_on_smollm2(smollm2, corpus_datastore, monkeypatch):
    import tests.conftest as conftest
    from eagle2.heads.eagle_head import load_head
    from eagle2.prompts.questions import PROJECT_ROOT

    model, tok = smollm2
    head = load_head(str(PROJECT_ROOT / "artifacts/smollm2/eagle_head"), model)  # the shipped head, for SAMD
    monkeypatch.setitem(conftest.shared_rest_datastore.made, model, corpus_datastore)
    accepted = 0
    for q in QUESTIONS[:2]:
        prompt = encode_conversation(tok, "tokenizer", [q], [])
        ref = decode(model, {"name": "plain"}, prompt, 32, eos={tok.eos_token_id}).output_ids
        for method in ({"name": "rest"}, {"name": "suffix"},  # the YAML defaults
                       {"name": "samd", "depth": 4, "top_k": 4, "total_tokens": 12}):
            out = decode(model, method, prompt, 32, head=head, eos={tok.eos_token_id})
            assert out.output_ids == ref, method
            accepted += sum(out.accept_lengths) - out.target_forwards
    assert accepted > 0
