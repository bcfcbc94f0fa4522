"""The result-row schema (eagle2/results/row_schema.py) is what the runner writes, and it catches drift."""

from __future__ import annotations

import pytest

from eagle2.results.row_schema import FAILED_ROW_FIELDS, ROW_FIELDS, RowSchemaError, check_row


def good_row() -> dict:
    samples = {(int, str): 3, (int,): 1, (str, type(None)): None, (str,): "x", (list,): [1], (dict,): {},
               (int, float): 0.5, (int, float, type(None)): None, (int, type(None)): None,
               (dict, type(None)): None, (bool, type(None)): None, (bool,): False}
    return {key: samples[types] for key, types in ROW_FIELDS.items()} | {"status": "ok"}


def test_a_row_with_every_field_passes_and_any_drift_fails():
    check_row(good_row())
    missing = good_row()
    del missing["tau"]
    with pytest.raises(RowSchemaError, match="missing \\['tau'\\]"):
        check_row(missing)
    with pytest.raises(RowSchemaError, match="unexpected \\['taus'\\]"):
        check_row(good_row() | {"taus": 1.0})
    with pytest.raises(RowSchemaError, match="turn=str"):
        check_row(good_row() | {"turn": "0"})
    with pytest.raises(RowSchemaError, match="failed row lacks"):
        check_row({"status": "failed"})
    check_row({key: None for key in FAILED_ROW_FIELDS} | {"status": "failed"})
