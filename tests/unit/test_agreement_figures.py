"""Figures of a rerun against the committed ones: a PNG painted over, a PDF swapped for another figure's, each made
from a copy of a committed figure, differs; what another CPU changes (a bit of noise, a coordinate a rounding apart)
agrees."""
import shutil

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="the figures' check reads PNGs with Pillow (matplotlib's dependency: "
                                                "the notebooks extra, not in the transformers-4.56 environment)")

from sinklib.lab import agreement_figures  # noqa: E402
from sinklib.lab.agreement_rows import DIFFERS, IDENTICAL, NEAR, WITHIN  # noqa: E402
from sinklib.paths import FIGURES_DIR as FIGURES  # noqa: E402



def _pair(tmp_path, stem, rerun_stem=None):
    """The committed figure `stem` (PNG and PDF) on both sides; the rerun's PDF is `rerun_stem`'s where given."""
    for side in ("c", "r"):
        (tmp_path / side).mkdir(parents=True)
        for suffix in (".png", ".pdf"):
            source = rerun_stem if side == "r" and suffix == ".pdf" and rerun_stem else stem
            shutil.copy2(FIGURES / f"{source}{suffix}", tmp_path / side / f"{stem}{suffix}")
    return tmp_path / "c" / f"{stem}.png", tmp_path / "r" / f"{stem}.png"


def _doctor_png(path, change):
    pixels = np.asarray(Image.open(path).convert("RGBA")).astype(np.int64)
    Image.fromarray(np.clip(change(pixels), 0, 255).astype(np.uint8), "RGBA").save(path)


def _painted(share):
    def paint(pixels):
        side = int(np.sqrt(share * pixels.shape[0] * pixels.shape[1]))
        top, left = pixels.shape[0] // 3, pixels.shape[1] // 3
        pixels[top:top + side, left:left + side, :3] = 255 - pixels[top:top + side, left:left + side, :3]
        return pixels
    return paint


def _noise(pixels):
    steps = np.random.default_rng(0).integers(-1, 2, size=pixels.shape)
    steps[..., 3] = 0
    return pixels + steps


@pytest.mark.parametrize("change, parted, status", [
    (_painted(0.005), False, DIFFERS),  # a block painted over half a percent of the pixels
    (_painted(0.0005), False, DIFFERS),  # even a small one: a region, not anti-aliasing
    (_noise, False, WITHIN),  # every pixel moved by one level at most: rounding, nothing drawn otherwise
    (_noise, True, WITHIN),
    (_painted(0.005), True, NEAR),  # where the notebook's data parted, cells may be drawn otherwise
])
def test_a_png_painted_over_differs_and_one_bit_noise_agrees(tmp_path, change, parted, status):
    committed, rerun = _pair(tmp_path, "fig05_layer_head_tiny-llada")
    _doctor_png(committed, change)
    row = agreement_figures.compare_figure(committed, rerun, parted)
    assert row.status == status, row
    if status == DIFFERS:
        assert "another plot" in row.detail


@pytest.mark.parametrize("parted", [False, True])
@pytest.mark.parametrize("stem, other", [("fig04_moving_sink_tiny-llada", "fig04_moving_sink_tiny-dream"),
                                         ("fig06b_transient_tiny-llada", "fig06b_transient_tiny-dream"),
                                         ("table1_masking_arithmetic", "table1_masking_capitals")])
def test_a_pdf_swapped_for_another_figures_differs(tmp_path, stem, other, parted):
    """The PNG left alone, its PDF twin replaced by another figure's of the same notebook (the same size and run
    record where the figures are a model's twins): another drawing, or where the data parted, other words."""
    committed, rerun = _pair(tmp_path, stem, rerun_stem=other)
    row = agreement_figures.compare_figure(committed, rerun, parted)
    assert row.status == DIFFERS and row.detail.startswith(f"{stem}.pdf: "), row
    assert agreement_figures.compare_figure(*_pair(tmp_path / "again", stem), parted).status == IDENTICAL


def _drawn(path, values):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sinklib import plots

    figure, axes = plt.subplots(figsize=(4, 3))
    axes.plot(values)
    axes.set_title("a title")
    plots.save_figure(figure, path.stem, path.parent, {"config": {"eps": 3.0}, "notebook": "n", "seed": 0})
    plt.close(figure)


@pytest.mark.parametrize("last, agrees", [(4.0001, True), (4.3, False)])
def test_a_pdf_drawn_from_numbers_a_rounding_apart_agrees(tmp_path, last, agrees):
    """Two PDFs of the same plot whose data differ by 1e-4 of their value differ in bytes, not in their drawing
    (coordinates moved by far less than half a pixel); data that moved visibly differ."""
    _drawn(tmp_path / "c" / "f.png", [1, 2, 3, 4])
    _drawn(tmp_path / "r" / "f.png", [1, 2, 3, last])
    pdfs = (tmp_path / "c" / "f.pdf", tmp_path / "r" / "f.pdf")
    assert pdfs[0].read_bytes() != pdfs[1].read_bytes()
    assert (agreement_figures.pdf_difference(*pdfs) == "") is agrees
