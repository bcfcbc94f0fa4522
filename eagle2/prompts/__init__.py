"""Prompts, below both the harness and training: chat templates (``chat``) and the benchmark questions
(``questions``). Knows nothing about models or decoding."""
