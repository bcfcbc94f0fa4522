"""Training the drafters on SmolLM2 self-distillation corpora: the corpus, the losses, the training
loops, the recipe stages behind ``train_head.py`` and their held-out evaluation."""
