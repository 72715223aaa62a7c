"""Derived tables: a notebook's pick is kept under the key of what it was derived from and read back without the
traces' scores; other inputs or other code are another key; what cannot be named is computed and not kept."""
import os
import time

import pandas as pd
import pytest

import sinklib
from sinklib import derived, trace_store
from sinklib.trace_store import collect_traces
from sinklib.summary import Verdicts

nb01 = pytest.importorskip("sinklib.lab.nb01_attention_distributions",
                           reason="the notebooks extra (its figures) is not installed")
nb02 = pytest.importorskip("sinklib.lab.nb02_moving_sinks", reason="the notebooks extra (its figures) is not installed")
PROMPTS = ["Q: tom has 5 apples . tom gets 7 more apples . how many apples does tom have now ? A:", "Q: 3 + 4 = ? A:"]


@pytest.fixture(scope="module")
def llada():
    return sinklib.load("tiny-llada")


@pytest.fixture
def stored(llada, tmp_path):
    def read():
        return {"tiny-llada": trace_store.stored_traces(llada, PROMPTS, tmp_path / "traces", progress=False)}
    return read


def test_a_pick_is_read_back_equal_without_the_traces_scores(stored, tmp_path):
    made = derived.derived(tmp_path / "picks", nb01.pick_layer_heads, stored())
    traces = stored()
    read = derived.derived(tmp_path / "picks", nb01.pick_layer_heads, traces)
    pd.testing.assert_frame_equal(made, read)
    assert all(trace._whole is None for trace in traces["tiny-llada"]), "the scores were read, not the pick"
    pd.testing.assert_frame_equal(read, nb01.pick_layer_heads(traces))


def test_other_arguments_or_other_code_are_another_key(stored, tmp_path, monkeypatch):
    traces = stored()
    derived.derived(tmp_path / "picks", nb02.pick_sink_tokens, traces, 3.0)
    derived.derived(tmp_path / "picks", nb02.pick_sink_tokens, traces, 2.0)
    assert len(list((tmp_path / "picks").glob("pick_sink_tokens-*.parquet"))) == 2
    key = derived.derivation_key(nb02.pick_sink_tokens, (traces, 3.0), {})
    monkeypatch.setattr(derived, "function_code", lambda function: "edited")
    assert derived.derivation_key(nb02.pick_sink_tokens, (traces, 3.0), {}) != key
    monkeypatch.undo()
    reordered = {"b": traces["tiny-llada"][1:], "a": traces["tiny-llada"][:1]}
    assert derived.derivation_key(nb01.pick_layer_heads, (reordered,), {}) != \
        derived.derivation_key(nb01.pick_layer_heads, ({"a": reordered["a"], "b": reordered["b"]},), {}), \
        "a pick's rows follow its mapping's order"


def test_a_store_argument_is_not_part_of_the_key(stored, tmp_path):
    traces = stored()
    assert derived.derivation_key(nb01.pick_layer_heads, (traces,), {"store": tmp_path / "a"}) == \
        derived.derivation_key(nb01.pick_layer_heads, (traces,), {"store": tmp_path / "b"})


def test_a_trace_from_no_store_is_computed_and_nothing_is_kept(llada, tmp_path):
    fresh = {"tiny-llada": collect_traces(llada, PROMPTS[:1], progress=False)}
    frame = derived.derived(tmp_path / "picks", nb01.pick_layer_heads, fresh)
    assert len(frame) and not (tmp_path / "picks").exists()


def test_verdicts_come_back_with_their_near_ties_and_notes(llada, stored, tmp_path):
    traces = stored()
    args = ({"tiny-llada": llada}, traces, {}, 5, 3.0)
    made = derived.derived(tmp_path / "picks", nb02.do_sinks_move, *args)
    read = derived.derived(tmp_path / "picks", nb02.do_sinks_move, *args)
    assert isinstance(read, Verdicts) and read.text() == made.text() and read.near_tie == made.near_tie


def test_stale_files_are_those_no_read_touched(stored, tmp_path):
    traces = stored()
    derived.derived(tmp_path / "picks", nb01.pick_layer_heads, traces)
    derived.derived(tmp_path / "picks", nb02.pick_sink_tokens, traces, 3.0)
    for path in (tmp_path / "picks").iterdir():
        os.utime(path, (time.time() - 100, time.time() - 100))
    since = time.time() - 10
    derived.derived(tmp_path / "picks", nb01.pick_layer_heads, traces)  # read: touched
    [stale] = derived.stale_files(tmp_path / "picks", since)
    assert stale.name.startswith("pick_sink_tokens-")


def test_a_picks_key_follows_the_helpers_it_calls_and_not_where_they_live(monkeypatch):
    """Editing a helper a pick calls (or a threshold it reads) re-keys the pick; moving the pick and its helpers to
    another module (issue 68's lab) does not."""
    import types

    from sinklib import keys

    before = keys.function_code(nb02.do_sinks_move)
    monkeypatch.setattr(nb02, "MOVES_OFTEN", nb02.MOVES_OFTEN / 2)
    assert keys.function_code(nb02.do_sinks_move) != before
    monkeypatch.undo()
    moved = types.FunctionType(nb02.do_sinks_move.__code__, dict(vars(nb02), __name__="sinklib.lab.moving"))
    moved.__module__, moved.__qualname__ = "sinklib.lab.moving", nb02.do_sinks_move.__qualname__
    assert keys.function_code(moved) == before


@pytest.mark.process  # the carry's forwards: torch looks a library up (ldconfig) on first use
def test_a_pick_taking_a_store_keyword_is_kept_under_the_picks_folder(llada, stored, tmp_path):
    """Notebook 07's carry pick takes store= (where its measurements are kept): the picks' folder is positional."""
    traces = stored()
    nb07 = pytest.importorskip("sinklib.lab.nb07_what_sinks_carry")
    made = derived.derived(tmp_path / "picks", nb07.pick_carry, {"tiny-llada": llada}, traces, 3.0,
                           store=tmp_path / "traces")
    assert len(made) and len(list((tmp_path / "picks").glob("pick_carry-*.parquet"))) == 1


def test_two_functions_outside_sinklib_have_different_fingerprints():
    """A user's function (a notebook's own pick, a task's scorer) is keyed by its own code too."""
    from sinklib import keys

    def one(frame):
        return frame.head(1)

    def two(frame):
        return frame.head(2)

    assert keys.function_code(one) != keys.function_code(two)
    assert keys.function_code(one) == keys.function_code(one)
