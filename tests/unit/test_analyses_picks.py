"""The notebooks' picks (sinklib.lab.nbNN_….pick_…), each against numbers worked by hand on hand-built traces, and the
verdicts a notebook's "what this run shows" is written from (do_sinks_move), each rule both ways and undecided."""
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("matplotlib")  # sinklib.lab draws the notebooks' figures (the notebooks' extra)

from sinklib.lab import nb01_attention_distributions as nb01  # noqa: E402
from sinklib.lab import nb02_moving_sinks as nb02  # noqa: E402
from sinklib.lab import nb03_threshold_sweep as nb03  # noqa: E402
from sinklib.lab import nb07_what_sinks_carry as nb07  # noqa: E402
from sinklib.lab import nb08_sinks_for_speed as nb08  # noqa: E402
from sinklib.lab import verdicts  # noqa: E402
from sinklib.summary import Verdicts  # noqa: E402
from sinklib.trace import Trace  # noqa: E402

MASK = 9
SEQ, PROMPT = 8, 3
SINK = 6.0  # a sink's score; the other keys share the rest, so every row sums to SEQ (sum units: mean 1)
OTHER = (SEQ - SINK) / (SEQ - 1)
TOKENS = {1: "[BOS]", 2: "Q:", 3: "x", 4: "a", 5: "b", 6: "c", MASK: "[MASK]"}
DIFFUSION = SimpleNamespace(family=SimpleNamespace(canvas_moves=True, scores_cover_the_canvas=True))
AUTOREGRESSIVE = SimpleNamespace(family=SimpleNamespace(canvas_moves=False, scores_cover_the_canvas=False))


def build_trace(sinks_by_head, model="toy", margins=None):
    """One layer; head h's key sinks_by_head[h][t] (None: no sink, every key 1.0) receives SINK at step t. The prompt
    is [BOS] Q: x; positions 3.. are masked and unmasked one per step (tokens a, b, c, a, ...)."""
    steps = len(sinks_by_head[0])
    scores = torch.full((steps, 1, len(sinks_by_head), SEQ), 1.0)
    for head, positions in enumerate(sinks_by_head):
        for step, position in enumerate(positions):
            if position is not None:
                scores[step, 0, head] = OTHER
                scores[step, 0, head, position] = SINK
    tokens = torch.tensor([[1, 2, 3] + [MASK] * (SEQ - PROMPT)]).repeat(steps + 1, 1)
    for step in range(steps):
        tokens[step + 1:, min(PROMPT + step, SEQ - 1)] = 4 + step % 3
    return Trace(scores=scores, tokens=tokens, is_masked=tokens[:-1] == MASK, prompt_len=PROMPT, layer_names=["l0"],
                 token_strings=TOKENS, meta={"model": model},
                 margins=None if margins is None else torch.tensor(margins, dtype=torch.float64))


def test_pick_score_histograms_count_every_score_once_and_the_summary_describes_them():
    traces = {"toy": [build_trace([[0, 0], [None, 5]])]}
    histograms = nb01.pick_score_histograms(traces, bins=10)
    assert len(histograms) == 10 and histograms["count"].sum() == 2 * 2 * SEQ  # steps × heads × keys
    assert histograms["left"].iloc[0] == 0 or histograms["left"].iloc[0] < 1 and histograms["right"].iloc[-1] == SINK
    assert histograms["count"].iloc[-1] == 3, "the three sink scores fall in the last bin"
    summary = nb01.pick_score_summary(traces)
    assert summary.loc["toy", "count"] == 2 * 2 * SEQ and summary.loc["toy", "mean"] == pytest.approx(1.0)
    assert summary.loc["toy", "max"] == SINK


def test_pick_strongest_heads_takes_the_head_with_the_strongest_sink_over_the_steps():
    traces = {"a": [build_trace([[None, None, None], [4, 4, None]])],  # head 1: (6 + 6 + 1) / 3 against head 0's 1
              "b": [build_trace([[0, None, None], [None, None, None]])]}  # head 0: 8 / 3
    heads = nb01.pick_strongest_heads(traces)
    assert heads["model"].tolist() == ["a", "b"] and heads["layer"].tolist() == [0, 0]
    assert heads["head"].tolist() == [1, 0]


def test_pick_layer_heads_averages_the_main_sink_over_steps_then_generations():
    traces = {"toy": [build_trace([[0, 0], [None, None]]), build_trace([[None, None], [5, None]])]}
    table = nb01.pick_layer_heads(traces)
    # head 0: (6 + 6) / 2 = 6 in the first generation, 1 in the second; head 1: 1, then (6 + 1) / 2 = 3.5
    assert table.set_index("head")["score"].to_dict() == pytest.approx({0: (6 + 1) / 2, 1: (1 + 3.5) / 2})
    assert table["model"].tolist() == ["toy", "toy"] and table["layer"].tolist() == [0, 0]


def test_pick_generations_gives_each_steps_canvas_and_margin():
    table = nb01.pick_generations({"toy": [build_trace([[0, 0]], margins=[0.5, 1e-4])]})
    assert table[["step", "margin"]].values.tolist() == [[0, 0.5], [1, 1e-4]]
    assert table["canvas"].tolist() == [[1, 2, 3, 4, MASK, MASK, MASK, MASK], [1, 2, 3, 4, 5, MASK, MASK, MASK]]
    assert nb01.report_generations(table, {"toy": []}).shown.table.loc["toy", "within_float_rounding"] == 1


def test_pick_sink_tokens_counts_detections_per_token():
    # head 0 on [BOS] at steps 0-2; head 1 on the masked position 5 at steps 0, 1 and on 'a' (position 3) at step 2
    table = nb02.pick_sink_tokens({"toy": [build_trace([[0, 0, 0], [5, 5, 3]])]}, eps=3.0)
    assert table.values.tolist() == [["toy", "[BOS]", 3, 0.5], ["toy", "[MASK]", 2, 2 / 6], ["toy", "a", 1, 1 / 6]]


def test_at_an_eps_no_key_reaches_table_2_is_a_labelled_empty_table_never_a_crash(tmp_path):
    from sinklib.plots import paper

    traces = {"toy": [build_trace([[0, 0, 0], [5, 5, 3]])]}
    table = nb02.pick_sink_tokens(traces, eps=1000.0)
    assert table.empty and list(table.columns) == ["model", "token", "count", "share"]
    figure = paper.sink_token_bars(table, models=list(traces), eps=1000.0)
    assert any("no sink" in text.get_text() for ax in figure.axes for text in ax.texts)
    result = nb02.report_sink_tokens(table, figure, traces)
    assert result.tables["table2_sink_tokens"].empty and "| model" in result.texts["table2_sink_tokens.md"]


def test_pick_sink_dynamics_moves_and_lifetimes():
    # one head: sink at 0, 0, 5, 5, then none — one move of three pairs with a sink at both steps; runs 0×2, 5×2
    row = nb02.pick_sink_dynamics({"toy": [build_trace([[0, 0, 5, 5, None]])]}, eps=3.0).iloc[0]
    assert row["move_rate"] == pytest.approx(1 / 3) and row["mean_lifetime"] == 2
    assert row["share_heads_with_sink"] == pytest.approx(4 / 5) and row["model"] == "toy"


def test_pick_moving_events_keeps_the_diffusion_models_only():
    traces = {"diff": [build_trace([[0, 0, 5, 2]])], "arm": [build_trace([[0, 4, 4, 4]])]}
    events = nb02.pick_moving_events({"diff": DIFFUSION, "arm": AUTOREGRESSIVE}, traces, eps=3.0)
    assert events[["model", "trace", "step", "position_before", "position"]].values.tolist() == [
        ["diff", 0, 2, 0, 5], ["diff", 0, 3, 5, 2]]


def test_pick_query_splits_has_no_row_for_an_autoregressive_model():
    splits = nb02.pick_query_splits({"arm": AUTOREGRESSIVE}, {"arm": [build_trace([[0, 0]])]}, eps=3.0)
    assert splits.empty and list(splits.columns) == ["model", "step", "layer", "head"]
    result = nb02.report_query_splits(splits, {}, {"diff": DIFFUSION}, {"diff": []})
    assert result.shown == "diff: no step with masked and unmasked queries and two sinks in one head"


def test_pick_transient_finds_a_sink_that_lives_one_step():
    events = nb02.pick_transient({"toy": [build_trace([[None, 4, None, 0, 0]])]}, eps=3.0)
    assert events[["model", "trace", "step", "layer", "head", "position"]].values.tolist() == [["toy", 0, 1, 0, 0, 4]]


def test_pick_greatest_sinks_follows_the_busiest_head():
    # head 1 has a sink at 3 steps, head 0 at 1: Fig. 7 follows head 1
    frame = nb02.pick_greatest_sinks({"toy": [build_trace([[0, None, None], [5, 5, 6]])]}, eps=3.0)
    assert frame["head"].unique().tolist() == [1] and frame["position"].tolist() == [5, 5, 6]
    assert frame["frontier"].tolist() == [3, 4, 5]  # the first still-masked position at each step
    panels = nb02.head_panels(frame)
    assert list(panels) == ["toy — layer 0, head 1"] and "model" not in panels["toy — layer 0, head 1"]


def test_pick_stability_by_key_type_measures_moves_on_all_keys():
    stability = nb02.pick_stability_by_key_type({"toy": [build_trace([[0, 0, 5, 5]])]}, k=1, eps=3.0)
    everything = stability.set_index("key_type").loc["all"]
    # three step pairs, each with a sink at both steps; the sink moved in one; the top-1 key changed in the same one
    assert everything["pairs_with_sinks"] == 3 and everything["move_rate"] == pytest.approx(1 / 3)
    assert everything["jaccard_mean"] == pytest.approx(2 / 3)


def test_pick_threshold_sweep_shares_of_entries_eq3_selects():
    traces = {"diff": [build_trace([[0, 0], [None, 5]])]}
    sweep = nb03.pick_threshold_sweep({"diff": DIFFUSION}, traces, [0.0, 3.0, 10.0]).set_index("eps")
    # 32 entries; the 3 sinks pass 6 − 2/7 > 3 (not 10); at eps = 0 nothing else passes (uniform rows: margin 0)
    assert sweep["share"].to_dict() == pytest.approx({0.0: 3 / 32, 3.0: 3 / 32, 10.0: 0.0})
    assert sweep["tokens"].tolist() == [32, 32, 32]


def test_pick_uniform_sweep_is_uniform_causal_attention_at_each_autoregressive_length():
    traces = {"arm": [build_trace([[0, 0]])], "diff": [build_trace([[0, 0]])]}
    uniform = nb03.pick_uniform_sweep({"arm": AUTOREGRESSIVE, "diff": DIFFUSION}, traces, [0.0, 1.0, 1.5])
    # 8 keys under uniform causal attention: key j receives Σ_{i≥j} 1/(i+1) = H_8 − H_j
    received = np.array([sum(1 / (i + 1) for i in range(j, SEQ)) for j in range(SEQ)])
    margins = np.array([received[j] - np.delete(received, j).mean() for j in range(SEQ)])
    by_hand = {eps: float((margins > eps).mean()) for eps in (0.0, 1.0, 1.5)}
    assert uniform["model"].unique().tolist() == ["uniform causal attention (arm's lengths)"]
    assert uniform.set_index("eps")["share"].to_dict() == pytest.approx(by_hand)
    assert nb03.pick_uniform_sweep({"diff": DIFFUSION}, {"diff": traces["diff"]}, [1.0]).empty


@pytest.mark.parametrize("low, high, verdict", [(0.06, 0.2, "supports"), (0.001, 0.049, "contradicts"),
                                                (0.03, 0.09, "cannot decide"), (0.01, 0.05, "cannot decide"),
                                                (0.05, 0.09, "supports"), (float("nan"), float("nan"), "cannot decide")])
def test_judged_compares_an_interval_with_its_threshold(low, high, verdict):
    assert verdicts.judged(low, high, nb02.MOVES_OFTEN) == verdict


def test_generation_bootstrap_resamples_whole_generations():
    """The pooled share, and an interval from resampling generations: none with fewer than MIN_GENERATIONS, a
    degenerate one when every generation agrees, a wide one when they disagree however many pairs each holds."""
    same = verdicts.generation_bootstrap([(0, 500), (0, 500), (0, 500)], verdicts._share)
    assert same == (0.0, (0.0, 0.0))
    point, (low, high) = verdicts.generation_bootstrap([(500, 500), (0, 500), (0, 500)], verdicts._share)
    assert point == pytest.approx(1 / 3) and low == 0.0 and high == 1.0  # 3 generations: a draw of 0, 1, 2 or 3 movers
    assert np.isnan(verdicts.generation_bootstrap([(1, 1000), (900, 1000)], verdicts._share)[1]).all()
    assert np.isnan(verdicts.generation_bootstrap([(0, 0)] * 4, verdicts._share)[1]).all()  # nothing to share
    again = verdicts.generation_bootstrap([(5, 9), (1, 7), (3, 3), (0, 4)], verdicts._share)
    assert again == verdicts.generation_bootstrap([(5, 9), (1, 7), (3, 3), (0, 4)], verdicts._share)  # seeded


def test_do_sinks_move_judges_each_measure_over_generations_both_ways():
    stays, jumps = [[0] * 6], [[0, 5, 0, 5, 0, 5]]  # top-1 key kept in all 5 pairs / changed in all 5
    # each decided model's generations differ a little (identical ones are degenerate evidence: cannot decide, below)
    traces = {"stays": [build_trace(stays), build_trace(stays), build_trace([[0] * 21 + [5]])],  # 1 move in 21 pairs
              "jumps": [build_trace(jumps), build_trace(jumps), build_trace([[0, 5, 0, 5, 0, 0]])],  # 3 moves in 5
              "mixed": [build_trace(jumps), build_trace(stays), build_trace(stays)],  # one generation of three moves
              "two": [build_trace(jumps), build_trace(jumps)],  # moves, but two generations cannot decide
              "arm": [build_trace([[0, 4]])]}
    models = {name: DIFFUSION for name in traces} | {"arm": AUTOREGRESSIVE}
    layouts = {"rides": [build_trace([[7] * 3]), build_trace([[7] * 3]), build_trace([[7, 7, 0]])],  # position 7:
               # masked until the last step
               "stays put": [build_trace([[0] * 3]), build_trace([[0] * 3]), build_trace([[0, 0, 7]])],
               "one": [build_trace([[7] * 3])]}
    shown = nb02.do_sinks_move(models, traces, layouts, k=1, eps=3.0)
    assert isinstance(shown, Verdicts)
    table = shown.table.set_index(["model", "claim"])
    verdict = table["verdict"]
    paper, masked, stable = ("sinks move (paper's measure, all keys)", "sinks move (paper's measure, masked keys)",
                             "attention is stable (top-1 Jaccard, all keys)")
    assert [verdict[(name, paper)] for name in ("stays", "jumps", "mixed", "two")] == [
        "contradicts", "supports", "cannot decide", "cannot decide"]
    assert table.loc[("mixed", paper), "estimate"] == pytest.approx(5 / 15) and table.loc[("mixed", paper), "n"] == 3
    assert table.loc[("stays", paper), "estimate"] == pytest.approx(1 / 31)
    assert verdict[("stays", masked)] == "cannot decide"  # its sink is a prompt key: no masked pairs at all
    assert [verdict[(name, stable)] for name in ("stays", "jumps", "mixed")] == [
        "supports", "contradicts", "cannot decide"]
    assert "arm" not in shown.table["model"].tolist()  # a decoding row's greatest key is another quantity
    rides = "the greatest sink rides the rightmost masked token (paper's layout)"
    assert [verdict[(name, rides)] for name in ("rides", "stays put", "one")] == [
        "supports", "contradicts", "cannot decide"]
    assert "stays: sinks move (paper's measure, all keys): contradicts (0.032 [0.000, 0.048], n = 3" in shown.text()
    markdown = shown._repr_markdown_().splitlines()
    rows = [line for line in markdown[2:] if line.startswith("|")]
    assert [row.split("|")[1].strip() for row in rows].count("stays") == 3 and "**contradicts**" in rows[0]


def test_does_a_fast_sampler_lean_on_sinks_judges_each_difference_both_ways():
    differences = pd.DataFrame({"model": ["dlm"] * 3, "sampler": ["fast"] * 3, "column": ["top-1", "random-1", "top-5"],
                                "n": [200] * 3, "difference": [-0.17, 0.0, -0.02], "low": [-0.26, -0.02, -0.09],
                                "high": [-0.08, 0.02, 0.05], "p": [0.001, 1.0, 0.5]})
    rows = nb08.does_a_fast_sampler_lean_on_sinks(differences).table
    # below 0: costs more; [−0.02, 0.02] excludes a cost of 0.05; [−0.09, 0.05] holds both 0 and −0.05
    assert rows["verdict"].tolist() == ["supports", "contradicts", "cannot decide"]
    assert rows["model"].tolist() == ["dlm (fast)"] * 3 and rows["n"].tolist() == [200] * 3


def test_does_evicting_the_oldest_cost_reads_each_paired_change():
    frame = pd.DataFrame({"model": ["arm"] * 4, "sampler": ["KV cache"] * 4,
                          "column": ["unmasked", "oldest-1", "oldest-3", "oldest-5"], "n": [200] * 4,
                          "change": [np.nan, -0.005, -0.5, -0.04], "change_low": [np.nan, -0.03, -0.6, -0.10],
                          "change_high": [np.nan, 0.01, -0.4, 0.02]})
    rows = nb08.does_evicting_the_oldest_cost(frame).table
    assert rows["claim"].str.startswith("with its oldest").all() and len(rows) == 3  # not the unmasked row
    assert rows["verdict"].tolist() == ["contradicts", "supports", "cannot decide"]


def test_table_1s_result_saves_the_figure_the_notebook_drew():
    import matplotlib.pyplot as plt

    from sinklib.evaluation.table1 import ITEM_COLUMNS, MaskingTable, accuracy_rows

    items = pd.DataFrame([{"model": "toy", "condition": "sinks", "k": k, "id": str(i), "correct": i < right,
                           "output": "", "margin": 1.0} for k, right in ((0, 8), (1, 6)) for i in range(10)],
                         columns=ITEM_COLUMNS)
    table = MaskingTable(accuracy_rows(items), "arithmetic", items)
    drawn = plt.figure()
    assert table.result("table1_masking_arithmetic", drawn).figures == {"table1_masking_arithmetic": drawn}
    own = table.result("table1_masking_arithmetic").figures["table1_masking_arithmetic"]
    assert own is not drawn and own.axes[0].get_xlabel() == "keys masked per layer and head (k)"
    plt.close("all")


def test_does_a_sink_store_its_token_compares_first_correct_layers_over_generations_both_ways():
    def cases(model, generations):
        """generations: (sinks' first correct layers, other masked positions') per generation."""
        return pd.concat([pd.DataFrame({"model": model, "trace": index, "is_sink": [True] * len(sink) + [False] * len(other),
                                        "first_correct_layer": sink + other})
                          for index, (sink, other) in enumerate(generations)], ignore_index=True)

    frame = pd.concat([cases("early", [([20.0, 21], [28.0, 29]), ([22.0, np.nan], [30.0, 28]), ([21.0], [29.0, 30])]),
                       cases("same", [([28.0, 29], [28.0, 29]), ([28.0], [28.5]), ([29.0], [29.2])]),  # 0, 0.5, 0.2
                       # layers: below 1 layer
                       cases("unsure", [([20.0], [29.0]), ([29.0], [29.0]), ([30.0], [29.0])]),  # 9, 0 and −1
                       cases("two", [([20.0], [29.0])] * 2)], ignore_index=True)
    rows = nb07.does_a_sink_store_its_token(frame).table.set_index("model")
    assert rows["verdict"].to_dict() == {"early": "supports", "same": "contradicts", "unsure": "cannot decide",
                                             "two": "cannot decide"}
    # pooled over the cases that ever name it: others (28+29+30+28+29+30)/6 = 29, sinks (20+21+22+21)/4 = 21
    assert rows.loc["early", "n"] == 3 and rows.loc["early", "estimate"] == pytest.approx(8.0)
    assert rows.loc["unsure", "estimate"] == pytest.approx(29 - 79 / 3)
    assert "at least 1 layer earlier" in rows.loc["early", "claim"]


@pytest.fixture(scope="module")
def lens_run():
    """tiny-dream's two short generations (its lens reads position i for token i + 1: the shifted case)."""
    import sinklib

    loaded = sinklib.load("tiny-dream")
    settings = loaded.settings_for(steps=6, gen_length=6)
    traces = [sinklib.generate(loaded, prompt, settings, seed=seed, progress=False)
              for seed, prompt in enumerate(["Q: 3 + 4 = ? A:", "Q: 12 + 9 = ? A:"])]
    return {"tiny-dream": loaded}, {"tiny-dream": traces}


def test_the_lens_picks_agree_with_the_lens_modules_own_summary_and_with_shares_by_hand(lens_run):
    """Notebook 07's lens section: its groups table is lens.sink_vs_other_masked's (the independent reference, which
    pools the traces itself), and its by-layer curve is the share of each group's reads whose argmax is already the
    final token, counted here read by read."""
    from sinklib import lens

    models, traces = lens_run
    reads = nb07.pick_lens_reads(models, traces, 3.0, ["tiny-dream"], n_traces=2)
    cases = nb07.pick_lens_cases(models, traces, 3.0, ["tiny-dream"], n_traces=2)
    reference = lens.sink_vs_other_masked(models["tiny-dream"], traces["tiny-dream"], 3.0)
    pd.testing.assert_frame_equal(nb07.lens_groups(cases).drop(columns="model"), reference)
    curve = nb07.share_final_by_layer(reads)
    per_layer = curve.groupby("layer")["n"].sum()
    assert per_layer.nunique() == 1 and per_layer.sum() == len(reads) > 0  # each layer reads the same positions
    assert {"masked sink", "other masked"} <= set(curve["group"])
    for row in curve.itertuples():
        mine = reads[(reads["group"] == row.group) & (reads["layer"] == row.layer)]["top_is_final"].tolist()
        assert row.n == len(mine) and row.share_final == pytest.approx(sum(mine) / len(mine))
    result = nb07.report_lens(reads, cases, figure=None)
    assert set(result.tables) == {"what_sinks_store", "what_sinks_store_by_layer"}
    assert "tiny-dream: masked sinks name their final token" in str(result.shown)


def test_an_empty_lens_section_says_so():
    reads = nb07.pick_lens_reads({}, {}, 3.0, [])
    assert reads.empty and list(reads.columns) == nb07.LENS_READ_COLUMNS
    assert nb07.report_lens(reads, reads, None).shown == "lens_models is empty: no model was read by the logit lens."


def test_a_run_without_paper_layouts_says_so():
    """Notebook 02 on autoregressive models alone has no long canvas: its layout section picks empty frames."""
    heads = nb02.pick_paper_layout_heads({}, 3.0)
    assert heads.empty and "layout" in heads.columns and nb02.head_panels(heads, by="layout") == {}
    table = nb02.pick_paper_layout({}, 3.0)
    assert nb02.report_paper_layout(table, heads, None).shown == \
        "paper_layouts is empty: no long canvas was generated."


def test_degenerate_evidence_cannot_decide_and_a_reversed_interval_is_refused():
    """Issue 69: three identical generations gave a zero-width bootstrap interval, and that interval a "supports"; a
    reversed interval was judged; negative or NaN counts were resampled."""
    same = [build_trace([[0, 5, 0, 5, 0, 5]]) for _ in range(3)]  # every generation moves in every step pair
    shown = nb02.do_sinks_move({"same": DIFFUSION}, {"same": same}, {}, k=1, eps=3.0).table.set_index("claim")
    row = shown.loc["sinks move (paper's measure, all keys)"]
    assert (row["low"], row["high"], row["verdict"]) == (1.0, 1.0, "cannot decide")
    assert verdicts.judged(0.2, 0.2, nb02.MOVES_OFTEN) == "cannot decide"
    assert verdicts._cost_verdict("m", "costs", 200, 0.0, 0.0, 0.0)["verdict"] == "cannot decide"
    with pytest.raises(ValueError, match=r"\(low, high\)=\(0.3, 0.1\) is not allowed: an interval must have low <= high"):
        verdicts.judged(0.3, 0.1, nb02.MOVES_OFTEN)
    with pytest.raises(ValueError, match=r"\(low, high\)=\(-0.01, -0.2\) is not allowed"):
        verdicts._cost_verdict("m", "costs", 200, -0.1, -0.01, -0.2)
    for counts, shown_value in (([(1, 5), (-1, 5), (2, 5)], "[-1.0]"), ([(1, 5), (float("nan"), 5), (2, 5)], "[nan]")):
        with pytest.raises(ValueError, match=rf"sums={re.escape(shown_value)} is not allowed: sums must be additive "
                                             r"counts, finite numbers >= 0"):
            verdicts.generation_bootstrap(counts, verdicts._share)
    from sinklib import stats

    with pytest.raises(ValueError, match=r"resamples=0 is not allowed: resamples must be an integer >= 1"):
        stats.difference_of_changes([True], [False], [True], [True], resamples=0)
    for call, message in ((lambda: stats.wilson_interval(-1, 5), "successes=-1 is not allowed"),
                          (lambda: stats.wilson_interval(1, float("nan")), "n=nan is not allowed"),
                          (lambda: stats.paired_difference(1, -2, 0, 3), "lost=-2 is not allowed")):
        with pytest.raises(ValueError, match=message):
            call()
