"""What the figures say in their own legend: Fig. 4 / 8 names which dotted line is the sink before the move and which
after (issue 68)."""
from types import SimpleNamespace

import numpy as np
import pytest

plots = pytest.importorskip("sinklib.plots", reason="the figures need matplotlib (the notebooks extra)")


def test_the_moving_sink_figure_tells_the_sink_before_from_the_sink_after():
    trace = SimpleNamespace(meta={"model": "tiny-llada"})
    maps = [np.eye(6), np.eye(6)]
    figure = plots.attention_pair(maps, [3, 4], trace, 1, 0, marked={"greatest sink at step 3 (before)": [2],
                                                                      "greatest sink at step 4 (after)": [5]})
    for ax in figure.axes[:2]:  # the two panels (their colour bars come after them)
        lines = {line.get_label(): (line.get_linestyle(), line.get_xdata()[0]) for line in ax.get_lines()}
        assert lines == {"greatest sink at step 3 (before)": (":", 2), "greatest sink at step 4 (after)": ("--", 5)}
        assert [text.get_text() for text in ax.get_legend().get_texts()] == list(lines)
    plots.close(figure)


def test_positions_given_as_a_list_are_sinks_of_one_style_without_a_legend():
    trace = SimpleNamespace(meta={"model": "tiny-llada"})
    figure = plots.attention_pair([np.eye(6)], [3], trace, 1, 0, marked=[1, 4])
    ax = figure.axes[0]
    assert [(line.get_linestyle(), line.get_xdata()[0]) for line in ax.get_lines()] == [(":", 1), (":", 4)]
    assert ax.get_legend() is None
    plots.close(figure)
