"""The benchmark harness: the runner behind ``run.py``, drafter building (the
registry itself: ``eagle2.registry``), target loading, config
validation, loggers and the identity audit. Imports the layers below it (``core``, ``heads``,
``drafters``, ``results``, ``prompts``), never ``training`` or ``analysis``. Importing it registers
what composing ``conf/`` needs: the config resolvers (``eagle2.bench.resolvers``) and the drafter families'
model keys (``eagle2.bench.family_keys``)."""

from eagle2.bench.family_keys import register as _register_family_keys
from eagle2.bench.resolvers import register as _register_resolvers

_register_resolvers()
_register_family_keys()
