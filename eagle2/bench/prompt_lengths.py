"""Every question turn's prompt measured against the context with the tokenizer alone, before the target
loads, and the policy for one that does not fit (``too_long_prompts``):

- ``fail`` (the default): the run is refused in one line naming the first such turn, its length and the
  room the context leaves; nothing is decoded or stored;
- ``skip``: such a turn and the question's later turns (they contain it) are left out of this run, with
  one line saying how many; nothing is stored for them;
- ``truncate_left``: such a prompt keeps its last tokens (the older ``truncate_long_prompts=true``).

A later turn's prompt holds the model's earlier answers, which exist only once decoded: the check counts
the answers already stored and empty ones for the rest, a lower bound, so a turn it passes can still
overflow while decoding; that turn is then stored as a failed row and counted in the run's summary.
"""

from __future__ import annotations

from omegaconf import DictConfig

from eagle2.prompts.chat import encode_conversation

POLICIES = ("fail", "skip", "truncate_left")


class PromptTooLongError(ValueError):
    """A question turn's prompt leaves no room for the answer in the model's context (policy ``fail``)."""


def too_long_policy(cfg: DictConfig) -> str:
    """The run's policy for a prompt that does not fit; ``truncate_long_prompts=true`` means ``truncate_left``."""
    if cfg.get("truncate_long_prompts"):
        return "truncate_left"
    return str(cfg.get("too_long_prompts") or "fail")


def room(cfg: DictConfig, context: int) -> int:
    """Prompt tokens the context leaves room for, with ``max_new_tokens`` to answer."""
    return context - int(cfg.max_new_tokens)


def fits(length: int, cfg: DictConfig, context: int) -> bool:
    """Whether a prompt of ``length`` tokens can be decoded as it is (``model.stop_at_context``: a prompt
    shorter than the context decodes until the context is full)."""
    return length <= room(cfg, context) or (bool(cfg.model.get("stop_at_context")) and length < context)


def overflow_message(length: int, cfg: DictConfig, context: int) -> str:
    return (f"prompt has {length} tokens but the context of {context} leaves room for {room(cfg, context)} with "
            f"max_new_tokens={cfg.max_new_tokens}")


def fitting_questions(cfg: DictConfig, questions: list[dict], tokenizer, store) -> list[dict]:
    """``questions`` with the turns that cannot fit the context handled by ``too_long_policy`` (module
    docstring); ``store`` gives the answers already stored for earlier turns."""
    policy = too_long_policy(cfg)
    if policy == "truncate_left":
        return questions
    context = int(cfg.model.max_context)
    kept, too_long = [], []  # too_long: (question_id, turn, length) of each first turn that cannot fit
    for q in questions:
        answers: list[str] = []
        for turn in range(len(q["turns"])):
            done = store.finished(q["question_id"], turn)
            if not done:
                prompt = encode_conversation(tokenizer, cfg.model.template, q["turns"][: turn + 1], answers,
                                             cfg.model.system_prompt)
                if not fits(len(prompt), cfg, context):
                    too_long.append((q["question_id"], turn, len(prompt)))
                    q = {**q, "turns": q["turns"][:turn]}
                    break
            answers.append(done["output_text"] if done else "")
        if q["turns"]:
            kept.append(q)
    if not too_long:
        return questions
    qid, turn, length = too_long[0]
    others = f" (and {len(too_long) - 1} more questions)" if len(too_long) > 1 else ""
    if policy == "fail":
        raise PromptTooLongError(f"question {qid} turn {turn}: {overflow_message(length, cfg, context)}{others}; "
                                 "set too_long_prompts=skip or too_long_prompts=truncate_left, or lower "
                                 "max_new_tokens")
    print(f"[eagle2] too_long_prompts=skip: leaving out question {qid} from turn {turn} on ({length} prompt "
          f"tokens, room for {room(cfg, context)}){others}", flush=True)
    return kept
