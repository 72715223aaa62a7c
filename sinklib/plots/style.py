"""What every figure shares: the palettes (colour-blind safe: seaborn "colorblind", cividis), the score axis's
label (sum units: Σ over queries), the order of models, and saving a figure as PNG and PDF with its provenance."""
from __future__ import annotations

import warnings

from pathlib import Path
from typing import Any


import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import to_rgb

from sinklib.provenance import KEY, as_text, content_part


# seaborn's "colorblind" palette (sns.color_palette("colorblind"), the same ten RGB triples), written out: importing
# seaborn costs every notebook kernel about 2.4 s (it imports scipy.stats), and only the heatmap needs it
PALETTE = [to_rgb(colour) for colour in ("#0173B2", "#DE8F05", "#029E73", "#D55E00", "#CC78BC", "#CA9161", "#FBAFE4",
                                         "#949494", "#ECE133", "#56B4E9")]


CMAP = "cividis"


SCORE_LABEL = "incoming attention score (sum over queries)"


# matplotlib warns whenever placing a loc="best" legend took over a second (when saving, and again when a notebook
# shows the figure): a measure of the machine's load, not of the figure, which made a notebook's committed output
# change with how busy the machine was
warnings.filterwarnings("ignore", message='Creating legend with loc="best" can be slow')


def in_order(column: pd.Series) -> list:
    """The column's distinct values in order of first appearance. (pd.unique, not dict.fromkeys: iterating a
    column of millions of scores' model names one by one took most of notebook 01's time.)"""
    return list(pd.unique(column))


def save_figure(fig: plt.Figure, name: str, folder: str | Path = "figures",
                record: dict[str, Any] | None = None) -> list[Path]:
    """Write `name`.png and `name`.pdf (reproducible: no timestamps in the PDF). `record` (sinklib.provenance):
    its content part (config, seed, notebook) goes in the PNG's "sinklib" text chunk and the PDF's Subject."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png", folder / f"{name}.pdf"]
    content = None if record is None else as_text(content_part(record))
    text = {} if content is None else {"png": {KEY: content}, "pdf": {"Subject": content}}
    fig.savefig(paths[0], dpi=130, bbox_inches="tight", metadata={"Software": None, **text.get("png", {})})
    fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None, "Creator": None, "Producer": None,
                                                         **text.get("pdf", {})})
    return paths


def close(fig: plt.Figure) -> None:
    """Free a figure that has been saved (matplotlib keeps every figure it made until closed)."""
    plt.close(fig)


def grid(frame: pd.DataFrame, shape: tuple[int, int], value: str = "score") -> np.ndarray:
    """[steps, positions] float: `frame`'s `value` at its (step, position) rows, NaN where it has none."""
    values = np.full(shape, np.nan)
    values[frame["step"].to_numpy(int), frame["position"].to_numpy(int)] = frame[value].to_numpy(float)
    return values
