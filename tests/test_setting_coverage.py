"""Every setting of every shipped method is checked before any model loads: each key of each ``conf/method`` YAML
is checked by its meaning (``eagle2.bench.validation.CHECKED_BY_MEANING``) or by its drafter's declared
``CHECKS``; and the drafters' own checks answer a bad value in one line naming the key and what it must be."""

from __future__ import annotations

import importlib

import pytest

from eagle2.bench import runner
from eagle2.bench.validation import CHECKED_BY_MEANING, REFUSED
from eagle2.registry import known_methods, method_spec
from tests.test_validation import config, no_model  # noqa: F401  (no_model: a fixture failing if the target loads)

HOW_BUILT = {"name", "display", "order", "drafter", "weights"}  # what a method is, not a setting


@pytest.mark.parametrize("name", known_methods())
def test_every_key_of_every_method_is_checked(name):
    cfg = config(f"method={name}").method
    module = importlib.import_module(method_spec(cfg).drafter.rpartition(".")[0])
    unchecked = set(cfg) - HOW_BUILT - CHECKED_BY_MEANING - set(getattr(module, "CHECKS", {}))
    assert not unchecked, f"method={name}: no check for {sorted(unchecked)}"


BAD = [
    (["method=eagle2", "method.adaptive_depth=true", "method.total_tokens=8"],
     "method.adaptive_depth=True is invalid: must be true or false, true only with method.total_tokens=auto"),
    (["method=eagle3", "method.reprofile=2"], "method.reprofile=2 is invalid: must be true or false"),
    (["method=hass", "method.lookup_branch=yes"], "method.lookup_branch='yes' is invalid: must be true or false"),
    (["method=eagle2", "method.profile_dir=3"], "method.profile_dir=3 is invalid: must be null"),
    (["method=oracle", "method.reference=5"], "method.reference=5 is invalid: must be null (no stored rows"),
]


@pytest.mark.parametrize("overrides, line", BAD, ids=[" ".join(o) for o, _ in BAD])
@pytest.mark.usefixtures("no_model")
def test_a_bad_drafter_setting_is_one_line_before_the_target_loads(overrides, line, tmp_path):
    cfg = config(*overrides, "dataset.limit=1", f"paths.results={tmp_path}")
    with pytest.raises(REFUSED) as err:
        runner.run(cfg)
    assert "\n" not in str(err.value) and line in str(err.value), str(err.value)
