"""The figures: one function per figure, tidy data in, matplotlib Figure out (scores in sum units: Σ over queries;
every axis says so). `paper`: the paper's figures; `beyond`: this project's own questions (notebooks 06–08); `style`:
palettes, labels, saving as PNG and PDF. Every name is here, as `plots.<name>`."""
from sinklib.plots.style import CMAP, PALETTE, SCORE_LABEL, close, grid, in_order, save_figure
from sinklib.plots.paper import (MARK_STYLES, attention_pair, greatest_sink_positions, layer_head_map, masking_plot,
                                 query_split, score_bars, score_histograms, sink_token_bars, threshold_sweep_plot,
                                 token_step_heatmap, transient_sink)
from sinklib.plots.beyond import (GROUP_COLOURS, cached_attention_plot, carry_plot, columns_by_setting_plot,
                                  frontier_plot, key_type_stability_plot, lens_plot, stability_plot,
                                  training_dynamics_plot)

__all__ = ["CMAP", "PALETTE", "SCORE_LABEL", "close", "grid", "in_order", "save_figure", "MARK_STYLES", "attention_pair",
           "greatest_sink_positions", "layer_head_map", "masking_plot", "query_split", "score_bars", "score_histograms",
           "sink_token_bars", "threshold_sweep_plot", "token_step_heatmap", "transient_sink", "GROUP_COLOURS",
           "cached_attention_plot", "carry_plot", "columns_by_setting_plot", "frontier_plot", "key_type_stability_plot",
           "lens_plot", "stability_plot", "training_dynamics_plot"]
