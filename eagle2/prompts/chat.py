"""Conversation templates: turn a list of user turns (and earlier answers) into prompt token ids.

``tokenizer`` uses the tokenizer's own chat template (SmolLM2, Llama-3); ``vicuna`` is FastChat's
vicuna_v1.1 format; ``llama2`` is the ``[INST]`` format; ``llama3`` the header-token format written
out explicitly (for checkpoints that lack a template). Nothing here knows about decoding.
"""

from __future__ import annotations

VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's questions.")
TEMPLATES = ("tokenizer", "vicuna", "llama2", "llama3")


def chat_messages(users: list[str], answers: list[str], system: str | None) -> list[dict]:
    """The conversation as chat messages (system, then user and assistant turns in order)."""
    msgs = [{"role": "system", "content": system}] if system else []
    for i, user in enumerate(users):
        msgs.append({"role": "user", "content": user})
        if i < len(answers):
            msgs.append({"role": "assistant", "content": answers[i]})
    return msgs


def render(template: str, users: list[str], answers: list[str], system: str | None) -> str:
    """Text of the conversation, ending where the assistant's next answer starts."""
    if template == "vicuna":
        text = (system or VICUNA_SYSTEM) + " "
        for i, user in enumerate(users):
            text += f"USER: {user} ASSISTANT:"
            if i < len(answers):
                text += f" {answers[i]}</s>"
        return text
    if template == "llama2":
        text = ""
        for i, user in enumerate(users):
            if i == 0 and system:
                user = f"<<SYS>>\n{system}\n<</SYS>>\n\n{user}"
            text += ("" if i == 0 else "<s>") + f"[INST] {user.strip()} [/INST]"
            if i < len(answers):
                text += f" {answers[i].strip()} </s>"
        return text + " "  # the authors' LLaMA-2-Chat scripts end the prompt with "[/INST] "
    if template == "llama3":
        text = "<|begin_of_text|>"
        for m in chat_messages(users, answers, system):
            text += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>"
        return text + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    raise ValueError(f"unknown chat template {template!r}; choose one of {TEMPLATES}")


def encode_conversation(tokenizer, template: str, users: list[str], answers: list[str],
                        system: str | None = None) -> list[int]:
    """Prompt ids for the next assistant turn."""
    if len(answers) not in (len(users) - 1, len(users)) or not users:
        raise ValueError("need one more user turn than answers")
    answers = answers[: len(users) - 1]
    if template == "tokenizer":
        ids = tokenizer.apply_chat_template(chat_messages(users, answers, system), add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    text = render(template, users, answers, system)
    add_bos = template in ("vicuna", "llama2")
    return tokenizer(text, add_special_tokens=add_bos)["input_ids"]


def stop_ids(tokenizer, extra_tokens=()) -> set[int]:
    """Token ids that end an answer: the tokenizer's EOS and the given extra stop tokens (e.g. a
    model config's ``stop_tokens``). Decoding and the training corpus use this one definition."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for tok in extra_tokens or ():
        ids.add(tokenizer.convert_tokens_to_ids(tok))
    return ids
