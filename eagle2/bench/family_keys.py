"""The drafter families' weight keys as a config node: ``model/_families`` in Hydra's ConfigStore, ``{key: null}``
for every family ``eagle2.heads.family`` declares. ``conf/model/_base.yaml`` lists it in its defaults, so every model
config has ``model.<key>`` (``model.head=/some/dir`` composes) without a hand-written line per family.

``register()`` is idempotent; importing ``eagle2.bench`` calls it, as it registers the resolvers the configs use, so
whatever composes ``conf/`` imports ``eagle2.bench`` first (``run.py``, ``train_head.py``, the tests' conftest).
Composing without it fails with Hydra's ``In 'model/_base': Could not load 'model/_families'.``
"""

from __future__ import annotations

NODE = "_families"  # starts with _: a base the model options include, not a model (known_keys skips such options)


def register() -> None:
    try:
        from hydra.core.config_store import ConfigStore
    except ImportError:  # a bare GPU node before `make gpu-env`: nothing composes configs there either
        return
    from eagle2.heads.family import families

    ConfigStore.instance().store(group="model", name=NODE, node={key: None for key in families()})
