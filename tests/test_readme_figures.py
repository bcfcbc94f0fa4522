"""Every figure in README.md has a generated source (fast; no model).

- README's status block (between ``<!-- status:begin -->`` and ``<!-- status:end -->``) is exactly what
  ``python -m analysis.status`` renders from the generated pages in ``docs/results/``, and every number in
  it appears in one of those pages;
- outside that block, README.md and the hand-written docs pages carry no measured speed figure (a speedup
  ratio, tokens/s, milliseconds, a tau value): measurements live in generated pages only;
- every page in ``docs/results/`` is stamped (commit, date, machine, CPU, dtype, drafters, command) and
  holds a headline block.

- README.md and the hand-written docs pages speak to users, not of how the project is developed (no
  sessions, loans, helpers, issue numbers or the device tool's `carry`).

``docs/gpu.md`` is left out of both scans for now: it quotes the EAGLE-2 paper's published figures and a GPU
time estimate, and its wording is being rewritten on its own; include it once it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analysis import status
from analysis.results_page import STAMP_KEYS, headline_block, stamp_of

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs" / "results").glob("*.md"))
HAND_WRITTEN = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "gpu.md"]
SPEED_FIGURES = [
    r"\b\d+\.\d+x\b",                                       # a speedup ratio, 1.25x
    r"\b\d+(?:\.\d+)?\s*(?:tokens/s|tok/s|tokens per second)",  # a rate
    r"\b\d+(?:\.\d+)?\s*ms\b",                              # a measured latency
    r"\btau\s*(?:=|of|~|is)?\s*\d+\.\d+",                   # an acceptance figure, tau 1.87
    r"\b\d+\.\d+\s*\(\s*tau",                               # 0.83 (tau ...
]
DEVELOPMENT_WORDS = [r"\bsessions?\b", r"\bloans?\b", r"\bhelpers?\b", r"\bissue\s*#?\d", r"`carry`"]
NUMBER = re.compile(r"\d+(?:\.\d+)?x?")


def outside_status_block(text: str) -> str:
    head, rest = text.split(status.BEGIN, 1)
    return head + rest.split(status.END, 1)[1]


def speed_figures(text: str) -> list[str]:
    return [m.group() for pattern in SPEED_FIGURES for m in re.finditer(pattern, text)]


def test_status_block_is_rendered_from_the_pages():
    block = status.status_block(README.read_text())
    assert block == status.render(PAGES, ROOT).strip(), (
        "README.md's status block differs from docs/results/: run `python -m analysis.status` "
        "(never type figures into it)")


def test_every_number_in_the_status_block_is_in_a_generated_page():
    sources = " ".join(p.read_text() for p in PAGES)
    missing = [n for n in NUMBER.findall(status.status_block(README.read_text())) if n not in sources]
    assert not missing, f"figures in README's status block with no generated source: {missing}"


@pytest.mark.parametrize("path", [README, *HAND_WRITTEN], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_speed_figure_outside_generated_blocks(path):
    text = path.read_text()
    text = outside_status_block(text) if path == README else text
    assert not speed_figures(text), (
        f"{path.name} carries measured figures {speed_figures(text)}: put them in a generated page "
        "(make results) and README's status block (python -m analysis.status)")


@pytest.mark.parametrize("path", [README, *HAND_WRITTEN], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_user_docs_do_not_speak_of_the_development_setup(path):
    found = [m.group() for w in DEVELOPMENT_WORDS for m in re.finditer(w, path.read_text(), re.IGNORECASE)]
    assert not found, f"{path.name} speaks of the development setup: {found}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_generated_pages_are_stamped(page):
    text = page.read_text()
    stamp = stamp_of(text)
    assert set(STAMP_KEYS) <= set(stamp), f"{page.name} lacks {set(STAMP_KEYS) - set(stamp)}"
    assert re.fullmatch(r"`[0-9a-f]{7,40}(-dirty)?`", stamp["Commit"]), stamp["Commit"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", stamp["Date"]), stamp["Date"]
    assert page.stem in stamp["Machine"] or page.stem.startswith("gpu")
    assert "| method |" in headline_block(text)


def test_the_scan_catches_typed_figures():
    """The patterns see the usual ways a measured figure is written, and not durations or sizes."""
    for typed in ("eagle2 runs at 1.25x plain", "plain 18.9 tokens/s", "T(1) = 30.7 ms", "tau 1.94",
                  "0.83 (tau 1.68)"):
        assert speed_figures(typed), typed
    for fine in ("a 30-second heartbeat", "64 new tokens", "B = 1, 2, 4, 8", "tau = decode tokens per forward"):
        assert not speed_figures(fine), fine


def test_status_command_rewrites_only_its_block(tmp_path):
    pages = tmp_path / "pages"
    pages.mkdir()
    stamp = "\n".join(f"- **{k}**: {v}" for k, v in zip(STAMP_KEYS, ["`abc1234`", "2026-01-02", "CPU kind avx2",
                                                                     "X", "float32 (kernels: stock)", "none", "`c`"]))
    (pages / "avx2.md").write_text(f"# t\n\n{stamp}\n\n<!-- headline:begin -->\n| method |\n| plain 1.00x |\n"
                                   "<!-- headline:end -->\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{status.BEGIN}\nold 9.99x\n{status.END}\nafter\n")
    args = ["--readme", str(readme), "--pages", str(pages)]
    assert status.main([*args, "--check"]) == 1
    assert status.main(args) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n") and "9.99x" not in text
    assert "| plain 1.00x |" in status.status_block(text) and "No page yet for: bf16-native, gpu" in text
    assert status.main([*args, "--check"]) == 0
    (pages / "avx2.md").write_text("# typed by hand\n| plain 1.00x |\n")  # no stamp: refused, README kept
    assert status.main(args) == 2 and readme.read_text() == text
