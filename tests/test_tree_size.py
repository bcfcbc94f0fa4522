"""The tracked tree travels to the GPU machine: its files add up to under 50 MiB, leaving room in the device
call's 64 MiB for the carried wheels (`make gpu-bundle`: omegaconf, hydra-core, antlr4, under 1 MB; the limit
was 48 MiB until the compiled draft heads needed the room). A failure names the ten biggest files. A long
training run's weights do not live in the tree: they are promoted into the shipped heads, or kept in the
history (artifacts/smollm2/README.md, round 8)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 50 * 2**20


def tracked_sizes(root: Path) -> dict[str, int]:
    """Bytes of every file git tracks under ``root`` (deleted ones skipped)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    files = [root / n for n in names.decode().split("\0") if n]
    return {str(p.relative_to(root)): p.stat().st_size for p in files if p.is_file()}


def size_report(sizes: dict[str, int], limit: int = LIMIT) -> str | None:
    """None under ``limit``; else the total and the ten biggest files."""
    total = sum(sizes.values())
    if total < limit:
        return None
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:10]
    lines = "\n".join(f"  {size / 1e6:8.2f} MB  {name}" for name, size in biggest)
    return f"tracked files {total / 2**20:.1f} MiB >= {limit / 2**20:.0f} MiB; the biggest:\n{lines}"


def test_tracked_tree_is_under_its_budget():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    report = size_report(tracked_sizes(ROOT))
    assert report is None, report


def test_size_report_names_the_biggest_files():
    """Negative control: an over-budget tree fails with its biggest file named first."""
    report = size_report({"a/model.safetensors": 40 * 2**20, "b.json": 11 * 2**20, "c.py": 100})
    assert report.startswith("tracked files 51.0 MiB >= 50 MiB")
    assert report.index("a/model.safetensors") < report.index("b.json")
    assert size_report({"c.py": 100}) is None
