"""Does the greatest sink track the masked canvas (paper Fig. 7, Dream)? Where each (step, layer, head)'s greatest
sink sits against the diffusion canvas: on the rightmost masked token, another masked one, or the prompt, and how
that follows the frontier as it moves (scores in sum units, as in sinklib.dynamics)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from sinklib.dynamics import KEY_TYPES, greatest_sinks, key_types
from sinklib.trace import Trace
from sinklib.validation import BadValue


def _require_diffusion(trace: Trace, param: str) -> None:
    if trace.is_autoregressive:
        raise BadValue(f"{param} is not allowed: {param} must be a diffusion trace, but model "
                       f"{trace.meta.get('model', '')!r} is autoregressive (its canvas has no masked positions, "
                       f"so no unmasking frontier to track)")


def _last_masked(trace: Trace) -> torch.Tensor:
    """[steps] the rightmost position still masked when each step ran; −1 if none."""
    index = torch.arange(trace.is_masked.shape[1]).expand_as(trace.is_masked)
    return torch.where(trace.is_masked, index, torch.full_like(index, -1)).amax(1)


FRONTIER_COLUMNS = ["model", "sink_rows", "share_on_rightmost_masked", "share_on_masked", "share_on_prompt",
                    "share_on_decoded", "spearman_frontier_median", "spearman_rightmost_median", "heads_correlated"]


def frontier_tracking(trace: Trace, eps: float = 3.0) -> pd.DataFrame:
    """One row per (step, layer, head) whose greatest key is an Eq. 3 sink: greatest_sinks' columns, plus
    `rightmost_masked` (the rightmost position still masked at that step; −1 if none), `key_type` (KEY_TYPES, at that
    step), `on_rightmost_masked`, `on_masked` (on any still-masked position), `on_frontier` (on the leftmost masked
    position, first_masked's unmasking frontier) and `distance_to_frontier` (position − frontier, in positions;
    positive right of it; NaN when nothing is masked). Diffusion traces only (ValueError on an autoregressive one)."""
    _require_diffusion(trace, "trace")
    top = greatest_sinks(trace, eps)
    top = top[top["is_sink"]].drop(columns="is_sink").reset_index(drop=True)
    steps, positions = top["step"].to_numpy(), top["position"].to_numpy()
    rightmost = _last_masked(trace).numpy()[steps]
    has_mask = top["frontier"].to_numpy() >= 0
    return top.assign(rightmost_masked=rightmost,
                      key_type=np.asarray(KEY_TYPES)[key_types(trace).numpy()[steps, positions]],
                      on_rightmost_masked=has_mask & (positions == rightmost),
                      on_masked=trace.is_masked.numpy()[steps, positions],
                      on_frontier=has_mask & (positions == top["frontier"].to_numpy()),
                      distance_to_frontier=np.where(has_mask, positions - top["frontier"].to_numpy(), np.nan))


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation; NaN with fewer than two points or a constant side (it is undefined there)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    from scipy.stats import spearmanr  # noqa: PLC0415  (scipy.stats: 2 s of import, for the one rank correlation)

    return float(spearmanr(x, y)[0])


def _head_correlations(rows: pd.DataFrame, column: str) -> np.ndarray:
    """Spearman of the greatest sink's position against `column`, per (trace, layer, head), over steps with a mask."""
    masked = rows[rows["frontier"] >= 0]
    return np.array([_spearman(group["position"].to_numpy(), group[column].to_numpy())
                     for _, group in masked.groupby(["trace", "layer", "head"])], dtype=float)


def _median(values: np.ndarray) -> float:
    defined = values[~np.isnan(values)]
    return float(np.median(defined)) if len(defined) else float("nan")


def _frontier_row(model: str, rows: pd.DataFrame) -> dict:
    to_frontier = _head_correlations(rows, "frontier")
    share = (lambda column: float(column.mean())) if len(rows) else (lambda column: float("nan"))
    return {"model": model, "sink_rows": len(rows), "share_on_rightmost_masked": share(rows["on_rightmost_masked"]),
            "share_on_masked": share(rows["on_masked"]), "share_on_prompt": share(rows["key_type"] == "prompt"),
            "share_on_decoded": share(rows["key_type"] == "decoded"),
            "spearman_frontier_median": _median(to_frontier),
            "spearman_rightmost_median": _median(_head_correlations(rows, "rightmost_masked")),
            "heads_correlated": int((~np.isnan(to_frontier)).sum())}


def frontier_summary(traces: Sequence[Trace], eps: float = 3.0) -> pd.DataFrame:
    """Per model, over the (trace, step, layer, head) whose greatest key is an Eq. 3 sink (`sink_rows`): the shares
    on the rightmost masked position, on any masked position, on prompt keys and on decoded keys (the last three sum
    to 1); and Spearman's correlation, across steps with something masked, between the greatest sink's position and
    the frontier (first_masked; `spearman_frontier_median`) or the rightmost masked position
    (`spearman_rightmost_median`), per (trace, layer, head), then the median over those where it is defined
    (`heads_correlated`: how many, against the frontier). Where masks only shrink (no remasking) the frontier never
    moves left and the rightmost masked position never moves right: a sink riding the rightmost masked token leftward
    correlates +1 with that position and ≤ 0 (or undefined) with the frontier. Diffusion traces only (ValueError
    naming traces[i])."""
    for index, trace in enumerate(traces):
        _require_diffusion(trace, f"traces[{index}]")
    frames = [frontier_tracking(trace, eps).assign(trace=index, model=trace.meta.get("model", ""))
              for index, trace in enumerate(traces)]
    if not frames:
        return pd.DataFrame(columns=FRONTIER_COLUMNS)
    found = pd.concat(frames, ignore_index=True)
    rows = [_frontier_row(model, found[found["model"] == model])
            for model in dict.fromkeys(trace.meta.get("model", "") for trace in traces)]
    return pd.DataFrame(rows, columns=FRONTIER_COLUMNS)
