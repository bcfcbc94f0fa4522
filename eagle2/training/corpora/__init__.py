"""Corpus sources, one module each: ``prompts`` (instruction prompts answered by the target, or the dataset's
own answers; MT-bench's held-out set), ``sharegpt`` (ShareGPT conversations with their own answers),
``conversations`` (two-turn self-instruct conversations), ``own_answers`` (ShareGPT's user turns answered by
the target); ``generate`` is the one batched decoder they all answer with. The formats they write are
``shards.py``'s."""
