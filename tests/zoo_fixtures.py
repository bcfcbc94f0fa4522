"""Random checkpoints written the way the real ones are published, for the zoo smoke tests and the
head-format tests: targets with a GPU model config's shapes (``eagle2.heads.shapes``) and a byte-level
tokenizer with that family's vocabulary size and special tokens, EAGLE-1/2 heads in the authors'
format and variants, EAGLE-3 heads in the official layout, SpS drafts as full causal-LM checkpoints (like
``double7/vicuna-68m``).

``weight_writers()`` maps a drafter family (a model-config key that a ``conf/method`` YAML lists under
``weights``) to the random-checkpoint writer its declaration names (``eagle2.heads.family.Family.fixture``;
the published-format writers of the shipped families are here). A method whose family names no writer is
skipped by the zoo test with that reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from eagle2.heads.shapes import random_llama

# special tokens at their real ids, per vocabulary size (the Llama-2 and Llama-3 tokenizers)
SPECIAL_TOKENS = {
    32000: {"<unk>": 0, "<s>": 1, "</s>": 2},
    128256: {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|start_header_id|>": 128006,
             "<|end_header_id|>": 128007, "<|eot_id|>": 128009},
}
# a Llama-3.1-style chat template (header tokens, the system block opening with its date lines), for the
# Llama-3 vocabulary's configs that use the checkpoint's own template (model.template=tokenizer)
HEADER_TEMPLATE = (
    "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] | trim }}"
    "{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}<|eot_id|>"
    "{% for m in rest %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}"
    "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}")
VICUNA_68M = {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12, "num_key_value_heads": 12,
              "num_hidden_layers": 2}  # double7/vicuna-68m's config.json


def write_tokenizer(folder: Path, vocab_size: int) -> Path:
    """A byte-level BPE tokenizer (no merges: one token per byte) with ``vocab_size`` entries, the
    family's special tokens at their real ids, and BOS added the way that family adds it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    specials = SPECIAL_TOKENS[vocab_size]
    alphabet = sorted(ByteLevel.alphabet())
    free = [i for i in range(vocab_size) if i not in specials.values()]
    vocab = {ch: free[i] for i, ch in enumerate(alphabet)}
    vocab.update({f"<filler{i}>": i for i in free[len(alphabet):]})
    vocab.update(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    bos, eos = (("<s>", "</s>") if vocab_size == 32000 else ("<|begin_of_text|>", "<|eot_id|>"))
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, specials[bos])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   unk_token="<unk>" if "<unk>" in specials else None)
    if vocab_size == 128256:
        fast.chat_template = HEADER_TEMPLATE
    fast.save_pretrained(folder)
    return folder


def write_target(folder: Path, config: LlamaConfig, seed: int = 0) -> Path:
    """A random target (fp16 safetensors, as the hub checkpoints are; drawn in fp16, never held in fp32: a
    Llama-3-8B-wide layer with its vocabulary is 5 GB in fp32) whose input embedding is
    ``target_embedding(config, seed)``, and its tokenizer."""
    model = random_llama(config, dtype=torch.float16, seed=seed)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(target_embedding(config, seed))
    model.save_pretrained(folder)
    del model  # before the tokenizer: a 128k vocabulary's is built in Python
    write_tokenizer(folder, config.vocab_size)
    return folder


def target_embedding(config: LlamaConfig, seed: int = 0) -> torch.Tensor:
    """The input embedding of ``write_target(folder, config, seed)``'s target (fp16 values, in fp32). The
    published-format heads written here store it, as the authors' heads store a frozen copy of their
    target's: a loader then reuses the target's own (``shared_or_own_embedding``), as with the real ones. In
    fp16, as written (drawn so: no fp32 copy, 2 GB at a 128k vocabulary)."""
    return _random((config.vocab_size, config.hidden_size), torch.Generator().manual_seed(seed), dtype=torch.float16)


def _random(shape, generator, std: float = 0.02, dtype=torch.float32) -> torch.Tensor:
    """Uniform with standard deviation ``std``, drawn in one pass (a 70B-vocabulary embedding is 0.5G entries)."""
    return torch.empty(shape, dtype=dtype).uniform_(-std * 3**0.5, std * 3**0.5, generator=generator)


def published_head_config(target_config: LlamaConfig, *, rope_theta: bool | None = None, model_type: bool = True,
                          bias: bool | None = None) -> dict:
    """A head ``config.json`` as the authors publish it (their Vicuna/LLaMA2 configs: no ``rope_theta``,
    ``"rope_scaling": null``; their LLaMA3 ones: ``rope_theta`` and ``"bias": false``). ``rope_theta``
    None = as the authors do for this target (only when it is not 10000)."""
    t = target_config
    theta = t.rope_parameters["rope_theta"]
    cfg = {"architectures": ["LlamaForCausalLM"], "bos_token_id": t.bos_token_id, "eos_token_id": t.eos_token_id,
           "hidden_act": "silu", "hidden_size": t.hidden_size, "initializer_range": 0.02,
           "intermediate_size": t.intermediate_size, "max_position_embeddings": t.max_position_embeddings,
           "model_type": "llama", "num_attention_heads": t.num_attention_heads,
           "num_key_value_heads": t.num_key_value_heads, "num_hidden_layers": 1, "pretraining_tp": 1,
           "rms_norm_eps": t.rms_norm_eps, "rope_scaling": None, "tie_word_embeddings": False,
           "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True, "vocab_size": t.vocab_size}
    if rope_theta or (rope_theta is None and theta != 10000.0):
        cfg["rope_theta"] = theta
    if not model_type:
        del cfg["model_type"]
    if bias is not None:
        cfg["bias"] = bias
    return cfg


def published_head_weights(target_config: LlamaConfig, *, bias: bool = True, embed: bool = True,
                           inv_freq: bool = False, seed: int = 1, dtype=torch.float16,
                           target_seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of an EAGLE-1/2 head at the target's width, as the authors' ``Model`` saves them; its
    ``embed_tokens.weight`` is the embedding of the target ``write_target`` writes with ``target_seed``."""
    from eagle2.heads.eagle_head import EagleHead, head_config_from_target

    with torch.device("meta"):
        shapes = {k: v.shape for k, v in EagleHead(head_config_from_target(target_config), bias=bias)
                  .state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    weights = {k: (torch.ones(s) if k.endswith("layernorm.weight") else _random(s, gen)) for k, s in shapes.items()}
    if embed:
        weights["embed_tokens.weight"] = target_embedding(target_config, target_seed)
    if inv_freq:
        head_dim = target_config.hidden_size // target_config.num_attention_heads
        weights["layers.0.self_attn.rotary_emb.inv_freq"] = 1.0 / 10000 ** (torch.arange(0, head_dim, 2) / head_dim)
    return {k: v.to(dtype) if k != "layers.0.self_attn.rotary_emb.inv_freq" else v for k, v in weights.items()}


def save_weights(folder: Path, weights: dict[str, torch.Tensor], fmt: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(weights, folder / "pytorch_model.bin")


def write_published_head(folder: Path, target_config: LlamaConfig, seed: int = 1, *, fmt: str = "bin",
                         embed: bool = True, inv_freq: bool = False, rope_theta: bool | None = None,
                         model_type: bool = True, bias: bool | None = None, dtype=torch.float16) -> Path:
    """An EAGLE-1/2 head as the authors publish it: fp16 ``pytorch_model.bin`` with ``embed_tokens.weight``
    and their ``config.json`` (options write the other variants)."""
    save_weights(folder, published_head_weights(target_config, bias=bias is not False, embed=embed,
                                                inv_freq=inv_freq, seed=seed, dtype=dtype), fmt)
    config = published_head_config(target_config, rope_theta=rope_theta, model_type=model_type, bias=bias)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def write_full_draft(folder: Path, target_config: LlamaConfig, seed: int = 2, *, fmt: str = "bin",
                     inv_freq: bool = False, dtype=torch.float32, shape: dict | None = None) -> Path:
    """An SpS draft as a full ``LlamaForCausalLM`` checkpoint with the target's vocabulary (default:
    ``double7/vicuna-68m``'s shape), optionally with saved rotary buffers as older transformers wrote."""
    config = LlamaConfig(**{**VICUNA_68M, **(shape or {}), "vocab_size": target_config.vocab_size,
                            "max_position_embeddings": target_config.max_position_embeddings,
                            "bos_token_id": target_config.bos_token_id, "eos_token_id": target_config.eos_token_id,
                            "tie_word_embeddings": False})
    state = random_llama(config, seed=seed).state_dict()
    if inv_freq:
        head_dim = config.hidden_size // config.num_attention_heads
        for i in range(config.num_hidden_layers):
            state[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = 1.0 / 10000 ** (
                torch.arange(0, head_dim, 2) / head_dim)
    save_weights(folder, {k: v.to(dtype) if "inv_freq" not in k else v for k, v in state.items()}, fmt)
    (folder / "config.json").write_text(config.to_json_string())
    return folder


def write_medusa_head(folder: Path, target_config: LlamaConfig, seed: int = 3, *, num_heads: int = 4) -> Path:
    """Medusa-1 heads as FasterDecoding publishes them: fp16 ``medusa_lm_head.pt`` with keys
    ``{k}.0.linear.{weight,bias}`` and ``{k}.1.weight`` (each head's own LM head) and a ``config.json``
    whose ``medusa_num_heads`` is 2 whatever the file holds (as medusa-vicuna-7b-v1.3's). Above 64M
    LM-head entries in all the heads share the target's LM head instead (the later "version 2" layout)."""
    gen = torch.Generator().manual_seed(seed)
    h, v = target_config.hidden_size, target_config.vocab_size
    state = {}
    for k in range(num_heads):
        state[f"{k}.0.linear.weight"] = _random((h, h), gen)
        state[f"{k}.0.linear.bias"] = _random((h,), gen)
        if num_heads * v * h <= 64 * 2**20:
            state[f"{k}.1.weight"] = _random((v, h), gen)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({k: t.to(torch.float16) for k, t in state.items()}, folder / "medusa_lm_head.pt")
    (folder / "config.json").write_text(json.dumps({"base_model_name_or_path": "lmsys/vicuna-7b-v1.3",
                                                    "medusa_num_heads": 2, "medusa_num_layers": 1}))
    return folder


def write_eagle3_head(folder: Path, target_config: LlamaConfig, seed: int = 4, *, fmt: str = "bin") -> Path:
    """An EAGLE-3 head in the official layout (as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: fp16
    ``pytorch_model.bin``, a draft vocabulary of a quarter of the target's with ``d2t``/``t2d``, no
    embedding). A target shallower than 4 layers (a zoo proxy) gets its fused layers named in
    ``eagle_config`` (0, L//2, L-1), as later official configs can name them."""
    from eagle2.heads.eagle3_head import Eagle3Head, eagle3_config_from_target, save_eagle3_head

    layers = target_config.num_hidden_layers
    fused = None if layers >= 4 else (0, layers // 2, layers - 1)
    gen = torch.Generator().manual_seed(seed)
    draft = max(target_config.vocab_size // 4, 1)
    with torch.device("meta"):
        head = Eagle3Head(eagle3_config_from_target(target_config, draft), fused or (2, layers // 2, layers - 3))
    head = head.to_empty(device="cpu")
    weights = {k: (torch.ones(v.shape) if k.endswith("norm.weight") else _random(v.shape, gen))
               for k, v in head.state_dict().items() if v.is_floating_point() and "rotary" not in k}
    head.load_state_dict(weights, strict=False)
    head.rotary_emb.__init__(head.config)  # computed buffers, never stored
    head.set_draft_vocabulary(torch.randperm(target_config.vocab_size, generator=gen)[:draft])
    save_eagle3_head(head, folder, dtype=torch.float16)
    if fmt == "bin":
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
        (folder / "model.safetensors").unlink()
        torch.save(state, folder / "pytorch_model.bin")
    if fused is None:  # the published configs do not name the layers when they are the default
        config = json.loads((folder / "config.json").read_text())
        config.pop("eagle_config")
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def write_rest_datastore(folder: Path, target_config: LlamaConfig, seed: int = 5) -> Path:
    """A REST datastore (``eagle2.heads.rest_datastore``) of random sequences over the byte tokens' ids (the
    zoo tokenizer's first 259 ids), so that some contexts match; returns the ``.npz`` file."""
    from eagle2.heads.rest_datastore import Datastore

    gen = torch.Generator().manual_seed(seed)
    ids = min(259, target_config.vocab_size)
    return Datastore.from_entries(torch.randint(ids, (40, 400), generator=gen).tolist()).save(folder / "datastore.npz")


def write_hydra_head(folder: Path, target_config: LlamaConfig, seed: int = 5, *, num_heads: int = 4) -> Path:
    """Hydra heads in this toolkit's format (``eagle2.heads.hydra_heads``): random path blocks of rank 16
    (the full H x H*(k+2) matrices of a 4096-wide model would be 0.5G parameters), the target's LM head
    shared; 4 heads, so the default 63-node tree (depth 4) fits."""
    from eagle2.heads.hydra_heads import HydraHeads, save_hydra_heads

    gen = torch.Generator().manual_seed(seed)
    heads = HydraHeads(num_heads, 1, target_config.hidden_size, None, rank=16)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(_random(p.shape, gen, std=0.05))
    return save_hydra_heads(heads, folder, dtype=torch.float16)


def weight_writers() -> dict:
    """Drafter family key -> its random-checkpoint writer ``(folder, target_config, seed) -> location``, as each
    family names it (``Family.fixture``)."""
    import importlib

    from eagle2.heads.family import families

    writers = {}
    for key, family in families().items():
        if family.fixture:
            module, _, name = family.fixture.partition(":")
            writers[key] = getattr(importlib.import_module(module), name)
    return writers


def full_draft_keys(config: LlamaConfig) -> set[str]:
    with torch.device("meta"):
        return set(LlamaForCausalLM(config).state_dict())
