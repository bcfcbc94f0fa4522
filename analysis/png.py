"""Figures written as palette PNGs: a plot's flat colours and their antialiasing fit in 256 colours, so a
median-cut palette keeps the picture and stores it in about a third of the bytes of a true-colour PNG (the
figures are tracked, and the tracked tree travels to GPU machines under a size budget)."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image


def write_palette_png(image: Image.Image, path: str | Path) -> Path:
    """Write ``image`` to ``path`` as an optimised PNG of at most 256 colours (median cut)."""
    image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(path, format="PNG", optimize=True)
    return Path(path)


def save_png(figure, path: str | Path, **savefig_kwargs) -> Path:
    """Render a matplotlib ``figure`` (``savefig_kwargs`` as for ``savefig``) and write it as a palette PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", **savefig_kwargs)
    buffer.seek(0)
    with Image.open(buffer) as image:
        return write_palette_png(image, path)
