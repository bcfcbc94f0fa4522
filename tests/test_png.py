"""Figures are written as palette PNGs (``analysis.png``): at most 256 colours, the picture kept."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from analysis.png import save_png, write_palette_png  # noqa: E402


def _figure():
    fig, ax = plt.subplots(figsize=(4, 3))
    for k in range(6):
        ax.plot(np.arange(20), np.sin(np.arange(20) / (k + 2)) + k, marker="o", label=f"line {k}")
    ax.axhline(1.5, linestyle="--")
    ax.legend(fontsize=6)
    ax.set_title("a plot with antialiased lines and text")
    return fig


def test_a_figure_is_a_palette_png_that_keeps_its_picture(tmp_path):
    fig = _figure()
    fig.savefig(tmp_path / "true_colour.png", dpi=100)
    save_png(fig, tmp_path / "palette.png", dpi=100)
    plt.close(fig)
    with Image.open(tmp_path / "palette.png") as palette, Image.open(tmp_path / "true_colour.png") as truth:
        assert palette.mode == "P" and len(palette.getcolors(256)) <= 256
        a = np.asarray(palette.convert("RGB"), dtype=float)
        b = np.asarray(truth.convert("RGB"), dtype=float)
    assert a.shape == b.shape and np.abs(a - b).mean() < 1.0  # within one level of 255 on average
    assert (tmp_path / "palette.png").stat().st_size < (tmp_path / "true_colour.png").stat().st_size


def test_a_coarse_palette_would_be_seen(tmp_path):
    """Control: the same picture in 4 colours is far from the original by the same measure."""
    fig = _figure()
    fig.savefig(tmp_path / "true_colour.png", dpi=100)
    plt.close(fig)
    with Image.open(tmp_path / "true_colour.png") as truth:
        coarse = truth.convert("RGB").quantize(4)
        write_palette_png(truth, tmp_path / "palette.png")
        b = np.asarray(truth.convert("RGB"), dtype=float)
    assert np.abs(np.asarray(coarse.convert("RGB"), dtype=float) - b).mean() >= 1.0
    with Image.open(tmp_path / "palette.png") as palette:
        assert np.abs(np.asarray(palette.convert("RGB"), dtype=float) - b).mean() < 1.0
