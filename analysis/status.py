"""README.md's status tables, copied from the generated results pages: ``python -m analysis.status [--check]``.

Each page under ``docs/results/`` (written by ``python -m analysis.report RESULTS --page``; one per CPU kind or
GPU) gives one section: its machine, commit, date and dtype, and its headline table verbatim. The sections
replace what README.md holds between ``<!-- status:begin -->`` and ``<!-- status:end -->``; nothing outside
that block is touched. ``--check`` writes nothing and exits 1 when the block differs from the pages.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.results_page import headline_block, stamp_of

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- status:begin -->", "<!-- status:end -->"
KINDS = ("bf16-native", "avx2", "gpu")  # the machine kinds the status names; a page gpu*.md counts as gpu


def page_section(page: Path, root: Path = ROOT) -> str:
    """One page's section of the status block (ValueError naming the page when it is not a generated page)."""
    text = page.read_text()
    stamp = stamp_of(text)
    missing = [k for k in ("Commit", "Date", "Machine", "Dtype") if k not in stamp]
    if missing:
        raise ValueError(f"{page}: not a generated results page (no {', '.join(missing)} line)")
    try:
        table = headline_block(text)
    except ValueError as exc:
        raise ValueError(f"{page}: {exc}") from None
    link = page.relative_to(root).as_posix() if page.is_relative_to(root) else str(page)
    return "\n".join([f"**{page.stem}**: {stamp['Dtype']}, commit {stamp['Commit']}, {stamp['Date']}, "
                      f"[{link}]({link})", "", table, ""])


def render(pages: list[Path], root: Path = ROOT) -> str:
    """The status block's body for ``pages`` (sorted by name), then the machine kinds without a page."""
    pages = sorted(pages)
    have = {"gpu" if p.stem.startswith("gpu") else p.stem for p in pages}
    missing = [k for k in KINDS if k not in have]
    sections = [page_section(p, root) for p in pages]
    if missing:
        sections.append(f"No page yet for: {', '.join(missing)} (`make results` on such a machine writes one).\n")
    return "\n".join(sections)


def replace_block(readme_text: str, body: str) -> str:
    """``readme_text`` with the status block's body replaced (ValueError when the markers are missing)."""
    if readme_text.count(BEGIN) != 1 or readme_text.count(END) != 1:
        raise ValueError(f"README.md needs exactly one {BEGIN} and one {END}")
    head, rest = readme_text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body.rstrip()}\n{END}{tail}"


def status_block(readme_text: str) -> str:
    """What README.md holds between the status markers (ValueError when they are missing)."""
    if BEGIN not in readme_text or END not in readme_text:
        raise ValueError(f"README.md has no {BEGIN} ... {END} block")
    return readme_text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.status", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--pages", default=str(ROOT / "docs" / "results"), help="the folder of generated pages")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when README's block is stale")
    args = ap.parse_args(argv)
    readme = Path(args.readme)
    try:
        text = readme.read_text()
        new = replace_block(text, render(sorted(Path(args.pages).glob("*.md")), readme.resolve().parent))
    except (OSError, ValueError) as exc:
        print(f"[status] {exc}", file=sys.stderr)
        return 2
    if args.check:
        stale = new != text
        print(f"[status] {readme}: status block {'differs from the pages' if stale else 'up to date'}")
        return 1 if stale else 0
    readme.write_text(new)
    print(f"[status] {readme}: status block rewritten from {args.pages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
