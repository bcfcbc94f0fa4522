"""Where the identity audit's records live and how they are read: one JSON line per audited question turn,
``<method>-<hash>.identity.ndjson`` beside the rows file. The audit (``eagle2.bench.identity``) writes them;
the report (``analysis.identity``) summarises them."""

from __future__ import annotations

from pathlib import Path

from eagle2.results.store import read_rows

RECORD_SUFFIX = ".identity.ndjson"


def records_path(rows_file: Path) -> Path:
    """Where the audit records of a rows file go."""
    return rows_file.with_name(rows_file.name.removesuffix(".jsonl") + RECORD_SUFFIX)


def read_records(path: Path) -> list[dict]:
    """The audit records of one file (a line cut by a kill is skipped: that turn is audited again)."""
    return read_rows(path)


def load_audit_records(results: str | Path) -> list[dict]:
    """Every audit record under ``results`` (recursively)."""
    return [r for p in sorted(Path(results).rglob(f"*{RECORD_SUFFIX}")) for r in read_records(p)]
