"""Golden numbers: what the committed stores hold, made again with this checkout's code and compared.

A stored result is found again only under its key (sinklib.keys), which holds the code of the numeric modules but
not the package versions (the lock pins them) nor the rest of sinklib. A change of numbers that no key sees — a
module outside keys.NUMERIC_MODULES, a library release, a numeric module edited without the stores made again —
would serve stale numbers in silence. Here one committed trace per model is generated again from its key's inputs
(its canvases and decision margins against its light record), and the tiny zoo's traces give the picks notebook 01
and 03 draw from (the main sink per layer and head, the threshold sweep) against the committed ones. Floats agree
within agreement.FLOAT_TOLERANCE of 1 + |committed|; a generation that parts from the committed one at a decision
within float rounding (ties.NEAR_TIE, which another CPU may take the other way) is named and not failed."""
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

from sinklib import derived, trace_store
from sinklib.paths import DATA_DIR
from sinklib.ties import is_near_tie

nb01 = pytest.importorskip("sinklib.lab.nb01_attention_distributions",
                           reason="the picks are the notebooks' (their extra, matplotlib, is not installed)")
runs = pytest.importorskip("sinklib.lab.runs")
FLOAT_TOLERANCE = pytest.importorskip("sinklib.lab.agreement_rows").FLOAT_TOLERANCE
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                                 reason="the committed stores were made on transformers 5 (a named model's conversion "
                                        "differs on 4.x, so its keys do: nothing committed to compare with)")]
ZOO = ("tiny-llada", "tiny-dream", "tiny-arm")
PICKS = (nb01.pick_layer_heads, nb01.pick_score_summary)


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """(run, loaded models, their traces): notebook 01's default run over a copy of the committed light records."""
    results = tmp_path_factory.mktemp("golden")
    shutil.copytree(DATA_DIR / "results" / "traces", results / "traces")
    run = nb01.TracesRun(results_dir=str(results), figures_dir=str(results), progress=False)
    loaded, traces = run.collect()
    return run, loaded, traces


def parting(light, whole) -> tuple[int | None, float | None]:
    """(the first step whose canvas differs, the committed margin of the decision before it); (None, None) if none."""
    differs = (light.tokens != whole.tokens).any(-1).nonzero()
    if not len(differs):
        return None, None
    step = int(differs[0])
    return step, float(light.margins[step - 1]) if light.margins is not None and step else None


def trace_differences(traces, patched_sampler=None) -> tuple[list[str], list[str]]:
    """(what differs beyond tolerance, the near-ties named): each model's first committed trace made again."""
    failures, near = [], []
    for name, model_traces in traces.items():
        stored = model_traces[0]
        light = trace_store.Trace.load_light(stored.folder)
        whole = stored.whole()
        step, margin = parting(light, whole)
        if step is not None and is_near_tie(margin):
            near.append(f"{name}: parts at step {step}, decided by a margin of {margin:.2g}")
        elif step is not None:
            failures.append(f"{name}: the canvas differs from step {step} on, after a decision by {margin!r}")
        elif light.margins is not None and not torch.allclose(light.margins, whole.margins, rtol=FLOAT_TOLERANCE,
                                                              atol=FLOAT_TOLERANCE, equal_nan=True):
            failures.append(f"{name}: the decision margins differ beyond tolerance")
    return failures, near


def pick_differences(run, traces, near_models) -> list[str]:
    """Each pick of PICKS on the zoo's traces, made again, against the committed pick's rows of those models."""
    failures = []
    for pick in PICKS:
        key = derived.derivation_key(pick, (traces,), {})
        path = next((DATA_DIR / "results" / runs.PICKS).glob(f"{pick.__name__}-{derived.digest(key)}.parquet"), None)
        if path is None:
            failures.append(f"{pick.__name__}: no committed pick under this checkout's key (run `make figures`)")
            continue
        stored = pd.read_parquet(path)
        again = pick({name: traces[name] for name in ZOO if name not in near_models})
        column = "model" if "model" in stored.columns else None
        stored = stored[stored[column].isin(again[column])] if column else stored.loc[again.index]
        numbers = again.select_dtypes("number").columns
        a, b = again[numbers].to_numpy(float), stored[numbers].to_numpy(float)
        if a.shape != b.shape or not np.allclose(a, b, rtol=FLOAT_TOLERANCE, atol=FLOAT_TOLERANCE, equal_nan=True):
            failures.append(f"{pick.__name__}: the zoo's rows differ beyond tolerance")
    return failures


def zoo_partings(traces) -> tuple[list[str], list[str]]:
    """Every zoo trace the picks read, made again: (those that part from their light record beyond a near-tie, those
    that part at a near-tie)."""
    failures, near = [], []
    for name in ZOO:
        for index, stored in enumerate(traces[name]):
            step, margin = parting(trace_store.Trace.load_light(stored.folder), stored.whole())
            if step is not None:
                (near if is_near_tie(margin) else failures).append(
                    f"{name}: trace {index} parts at step {step}, decided by a margin of {margin!r}")
    return failures, near


def test_the_committed_traces_and_picks_are_what_this_code_makes(committed):
    run, loaded, traces = committed
    failures, near = trace_differences(traces)
    parted, near_zoo = zoo_partings(traces)
    failures += parted
    near += near_zoo
    near_models = {line.split(":")[0] for line in near}
    failures += pick_differences(run, traces, near_models)
    print("near-ties (another CPU may decide these otherwise):", near or "none")
    assert failures == [], "numbers changed where their key did not: " + "; ".join(failures)


def test_the_golden_test_fails_when_the_sampler_changes_and_the_key_does_not(committed, monkeypatch, tmp_path):
    """The check above can fail: the LLaDA sampler taking the least likely token instead of the most (a change its
    key cannot see, made at run time) parts from the committed canvases at once."""
    from sinklib.families import llada

    run, loaded, traces = committed
    monkeypatch.setattr(llada, "gumbel_argmax", lambda logits, temperature, generator: logits.argmin(-1))
    model, first = loaded["tiny-llada"], traces["tiny-llada"][0]
    for name in ("meta.json", "canvas.parquet"):  # the committed light record, in a store of its own
        target = trace_store.trace_folder(tmp_path, first.store_key) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(first.folder / name, target)
    [again] = trace_store.stored_traces(model, [first.store_key["prompt"]], tmp_path, progress=False,
                                       settings=run.settings_for(model))
    failures, _ = trace_differences({"tiny-llada": [again]})
    assert failures and failures[0].startswith("tiny-llada: the canvas differs")
