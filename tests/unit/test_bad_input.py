"""Bad input across every public entry point and both CLIs (issue 13): each case must raise the stated
exception type, before any heavy work, with a message that names the parameter that was wrong."""
from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pytest
import torch

import sinklib
from sinklib import dynamics, experiments
from sinklib.evaluation import evaluate, get_task
from sinklib.evaluation.sandbox import SandboxLimits, run_python
from sinklib.evaluation.table1 import masking_table

ROOT = Path(__file__).resolve().parents[2]
SCORES = torch.tensor([[8.0, 1.0, 1.0, 1.0]])


@functools.lru_cache(maxsize=None)
def model(name: str) -> sinklib.LoadedModel:
    return sinklib.load(name)


@functools.lru_cache(maxsize=None)
def trace() -> sinklib.Trace:
    return sinklib.generate(model("tiny-llada"), "1+2=", steps=4, gen_length=4, progress=False)


def saved_trace(tmp: Path, edit: Callable[[Path], None]) -> Path:
    folder = tmp / "trace"
    trace().save(folder)
    edit(folder)
    return folder


def flip_byte(path: Path, offset: int = 200) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def edit_meta(folder: Path, change: Callable[[dict], None]) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    change(meta)
    (folder / "meta.json").write_text(json.dumps(meta))


def gen(**kwargs):
    base = dict(steps=4, gen_length=4, progress=False)
    prompt = kwargs.pop("prompt", "1+2=")
    return sinklib.generate(kwargs.pop("model", model("tiny-llada")), prompt, **{**base, **kwargs})


def capture_forward(policy=None, **kwargs):
    loaded = model("tiny-llada")
    with sinklib.capture(loaded, intervention=policy, **kwargs):
        loaded.logits(torch.tensor([[1, 2, 3, 4]]))


class Case(NamedTuple):
    name: str
    call: Callable[[Path], object]
    error: type
    param: str


CASES = [
    # -- sink statistics ---------------------------------------------------------------------------------
    Case("find_sinks eps negative", lambda t: sinklib.find_sinks(SCORES, eps=-1), ValueError, "eps"),
    Case("find_sinks eps nan", lambda t: sinklib.find_sinks(SCORES, eps=float("nan")), ValueError, "eps"),
    Case("find_sinks eps str", lambda t: sinklib.find_sinks(SCORES, eps="3"), ValueError, "eps"),
    Case("find_sinks units", lambda t: sinklib.find_sinks(SCORES, units="avg"), ValueError, "units"),
    Case("find_sinks scores str", lambda t: sinklib.find_sinks("1 2 3"), ValueError, "scores"),
    Case("find_sinks scores ragged", lambda t: sinklib.find_sinks([[1.0, 2.0], [3.0]]), ValueError, "scores"),
    Case("find_sinks scores scalar", lambda t: sinklib.find_sinks(torch.tensor(3.0)), ValueError, "scores"),
    Case("find_sinks scores empty", lambda t: sinklib.find_sinks(torch.zeros(2, 0)), ValueError, "scores"),
    Case("find_sinks valid shape", lambda t: sinklib.find_sinks(SCORES, valid=torch.ones(3, dtype=torch.bool)), ValueError, "valid"),
    Case("top_sinks k too big", lambda t: sinklib.top_sinks(SCORES, k=9), ValueError, "k"),
    Case("top_sinks k negative", lambda t: sinklib.top_sinks(SCORES, k=-1), ValueError, "k"),
    Case("top_sinks k float", lambda t: sinklib.top_sinks(SCORES, k=1.5), ValueError, "k"),
    Case("top_sinks scores dict", lambda t: sinklib.top_sinks({"a": 1}, k=1), ValueError, "scores"),
    Case("sink_margin scores None", lambda t: sinklib.sink_margin(None), ValueError, "scores"),
    Case("in_units units", lambda t: sinklib.in_units(SCORES, units="sums"), ValueError, "units"),
    Case("threshold_sweep empty eps", lambda t: sinklib.threshold_sweep(SCORES, []), ValueError, "eps_values"),
    Case("threshold_sweep bad eps", lambda t: sinklib.threshold_sweep(SCORES, [1, -2]), ValueError, "eps_values"),
    Case("threshold_sweep valid with list", lambda t: sinklib.threshold_sweep([SCORES, SCORES], [1], valid=SCORES > 0), ValueError, "valid"),
    Case("causal_uniform_scores n", lambda t: sinklib.causal_uniform_scores(0), ValueError, "n"),
    # -- interventions -----------------------------------------------------------------------------------
    Case("MaskSinks top_k", lambda t: sinklib.MaskSinks(top_k=-1), ValueError, "top_k"),
    Case("MaskSinks source", lambda t: sinklib.MaskSinks(top_k=1, source="previous"), ValueError, "source"),
    Case("MaskSinks rows", lambda t: sinklib.MaskSinks(top_k=1, rows="first"), ValueError, "rows"),
    Case("MaskSinks eps", lambda t: sinklib.MaskSinks(top_k=1, eps=-0.5), ValueError, "eps"),
    Case("MaskRandomKeys k", lambda t: sinklib.MaskRandomKeys(k=-2), ValueError, "k"),
    Case("MaskRandomKeys seed", lambda t: sinklib.MaskRandomKeys(k=1, seed=-1), ValueError, "seed"),
    Case("MaskKeys positions", lambda t: sinklib.MaskKeys([-1]), ValueError, "positions"),
    Case("MaskKeys layers beyond model", lambda t: gen(intervention=sinklib.MaskKeys([0], layers=[9])), ValueError, "layers"),
    Case("MaskKeys heads beyond model", lambda t: gen(intervention=sinklib.MaskKeys([0], heads=[40])), ValueError, "heads"),
    Case("MaskKeys steps beyond run", lambda t: gen(intervention=sinklib.MaskKeys([0], steps=[99])), ValueError, "steps"),
    Case("MaskKeys positions beyond keys", lambda t: gen(intervention=sinklib.MaskKeys([500])), ValueError, "positions"),
    Case("MaskRandomKeys start after run", lambda t: gen(intervention=sinklib.MaskRandomKeys(k=1, start_step=50)), ValueError, "start_step"),
    Case("MaskRandomKeys every key", lambda t: gen(intervention=sinklib.MaskRandomKeys(k=10_000)), ValueError, "intervention"),
    # -- capture -----------------------------------------------------------------------------------------
    Case("capture a string", lambda t: sinklib.capture("tiny-llada").__enter__(), TypeError, "model"),
    Case("capture intervention str", lambda t: capture_forward("mask"), TypeError, "intervention"),
    Case("capture chunk_size", lambda t: capture_forward(chunk_size=0), ValueError, "chunk_size"),
    Case("capture maps not triple", lambda t: capture_forward(maps=[(0, 0)]), ValueError, "maps"),
    Case("capture maps head", lambda t: capture_forward(maps=[(0, 0, 99)]), ValueError, "maps head"),
    Case("capture maps layer name", lambda t: capture_forward(maps=[(0, "model.layers.9.self_attn", 0)]), ValueError, "layer"),
    Case("capture output_attentions", lambda t: _output_attentions(), sinklib.CaptureError, "output_attentions"),
    # -- generate ----------------------------------------------------------------------------------------
    Case("generate prompt None", lambda t: gen(prompt=None), ValueError, "prompt"),
    Case("generate prompt int", lambda t: gen(prompt=7), ValueError, "prompt"),
    Case("generate prompt empty", lambda t: gen(prompt="   "), ValueError, "prompt"),
    Case("generate prompt ids outside vocab", lambda t: gen(prompt=[1, 2, 10**6]), ValueError, "prompt"),
    Case("generate prompt negative id", lambda t: gen(prompt=[-1, 2]), ValueError, "prompt"),
    Case("generate prompt float tensor", lambda t: gen(prompt=torch.tensor([1.0, 2.0])), ValueError, "prompt"),
    Case("generate prompt floats", lambda t: gen(prompt=[1.5, 2.0]), ValueError, "prompt"),
    Case("generate empty list", lambda t: gen(prompt=[]), ValueError, "prompt"),
    Case("generate steps missing", lambda t: gen(steps=None), ValueError, "steps"),
    Case("generate seed", lambda t: gen(seed=-3), ValueError, "seed"),
    Case("generate alg for llada", lambda t: gen(alg="entropy"), ValueError, "alg"),
    Case("generate block_length for arm", lambda t: gen(model=model("tiny-arm"), block_length=4), ValueError, "block_length"),
    Case("generate maps step beyond run", lambda t: gen(maps=[(9, 0, 0)]), ValueError, "maps"),
    Case("generate intervention str", lambda t: gen(intervention="MaskSinks"), TypeError, "intervention"),
    Case("generate gen_length too long", lambda t: gen(gen_length=10**6, steps=4), ValueError, "gen_length"),
    # -- load --------------------------------------------------------------------------------------------
    Case("load zoo typo", lambda t: sinklib.load("tiny-lada"), ValueError, "name_or_model"),
    Case("load missing folder", lambda t: sinklib.load(str(t / "nowhere" / "model")), ValueError, "name_or_model"),
    Case("load folder without config", lambda t: sinklib.load(str(_folder(t, None))), ValueError, "name_or_model"),
    Case("load broken config", lambda t: sinklib.load(str(_folder(t, "{not json"))), ValueError, "name_or_model"),
    Case("load a file", lambda t: sinklib.load(str(_file(t))), ValueError, "name_or_model"),
    Case("load empty name", lambda t: sinklib.load(""), ValueError, "name_or_model"),
    Case("load family typo", lambda t: sinklib.load("tiny-llada", family="lada"), ValueError, "family"),
    Case("load arm family on llada", lambda t: sinklib.load("tiny-llada", family="arm"), ValueError, "family"),
    Case("load dtype", lambda t: sinklib.load("tiny-llada", dtype="fp8"), ValueError, "dtype"),
    Case("load mask_id", lambda t: sinklib.load("tiny-llada", mask_id=10**6), ValueError, "mask_id"),
    # -- Trace -------------------------------------------------------------------------------------------
    Case("Trace.load nothing there", lambda t: sinklib.Trace.load(t / "none"), FileNotFoundError, "path"),
    Case("Trace.load flipped byte", lambda t: sinklib.Trace.load(saved_trace(t, lambda f: flip_byte(f / "scores.parquet"))), ValueError, "path"),
    Case("Trace.load cut file", lambda t: sinklib.Trace.load(saved_trace(t, lambda f: (f / "canvas.parquet").write_bytes((f / "canvas.parquet").read_bytes()[:-10]))), ValueError, "path"),
    Case("Trace.load edited shape", lambda t: sinklib.Trace.load(saved_trace(t, lambda f: edit_meta(f, lambda m: m.update(shape=m["shape"][::-1])))), ValueError, "path"),
    Case("Trace.load broken meta", lambda t: sinklib.Trace.load(saved_trace(t, lambda f: (f / "meta.json").write_text("{"))), ValueError, "path"),
    Case("Trace.to_frame steps", lambda t: trace().to_frame(steps=[99]), ValueError, "steps"),
    Case("sink_mask eps", lambda t: dynamics.sink_mask(trace(), eps=-1), ValueError, "eps"),
    # -- evaluation --------------------------------------------------------------------------------------
    Case("evaluate task typo", lambda t: evaluate(model("tiny-arm"), "gsm8j"), ValueError, "task"),
    Case("evaluate limit", lambda t: evaluate(model("tiny-arm"), "arithmetic", limit=0), ValueError, "limit"),
    Case("evaluate batch_size", lambda t: evaluate(model("tiny-arm"), "arithmetic", batch_size=0), ValueError, "batch_size"),
    Case("evaluate seed", lambda t: evaluate(model("tiny-arm"), "arithmetic", seed=-1), ValueError, "seed"),
    Case("evaluate model object", lambda t: evaluate(object(), "arithmetic"), TypeError, "model"),
    Case("evaluate model typo", lambda t: evaluate("tiny-lada", "arithmetic"), ValueError, "name_or_model"),
    Case("evaluate intervention", lambda t: evaluate(model("tiny-arm"), "arithmetic", intervention=3), TypeError, "intervention"),
    Case("evaluate unknown setting", lambda t: evaluate(model("tiny-arm"), "arithmetic", gen_lenght=8), TypeError, "gen_lenght"),
    Case("evaluate llada option on arm", lambda t: evaluate(model("tiny-arm"), "arithmetic", remasking="random"), ValueError, "remasking"),
    Case("evaluate humaneval without opt-in", lambda t: evaluate(model("tiny-arm"), "humaneval"), ValueError, "allow_code_execution"),
    Case("get_task typo", lambda t: get_task("humaneva"), ValueError, "task"),
    Case("masking_table ks", lambda t: masking_table([model("tiny-arm")], ks=[-1]), ValueError, "ks"),
    Case("masking_table ks empty", lambda t: masking_table([model("tiny-arm")], ks=[]), ValueError, "ks"),
    Case("masking_table models", lambda t: masking_table([3.5]), ValueError, "models"),
    Case("masking_table source", lambda t: masking_table([model("tiny-arm")], source="now"), ValueError, "source"),
    Case("masking_table eps", lambda t: masking_table([model("tiny-arm")], eps=float("inf")), ValueError, "eps"),
    Case("run_python bytes", lambda t: run_python(b"print(1)"), ValueError, "program"),
    Case("run_python limits", lambda t: run_python("print(1)", {"timeout": 1}), ValueError, "limits"),
    Case("SandboxLimits timeout", lambda t: SandboxLimits(timeout=0), ValueError, "timeout"),
    Case("SandboxLimits memory", lambda t: SandboxLimits(memory_mb=-5), ValueError, "memory_mb"),
    # -- experiments -------------------------------------------------------------------------------------
    Case("collect_traces stale folder", lambda t: _stale_traces(t), ValueError, "out"),
]


def _output_attentions():
    loaded = model("tiny-llada")
    with sinklib.capture(loaded):
        loaded.model(torch.tensor([[1, 2, 3]]), output_attentions=True)


def _folder(tmp: Path, config: str | None) -> Path:
    folder = tmp / "checkpoint"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    return folder


def _file(tmp: Path) -> Path:
    path = tmp / "weights.bin"
    path.write_bytes(b"0")
    return path


def _stale_traces(tmp: Path):
    loaded = model("tiny-llada")
    experiments.collect_traces(loaded, ["1+2="], out=tmp / "traces", steps=4, gen_length=4, progress=False)
    experiments.collect_traces(loaded, ["1+2="], out=tmp / "traces", steps=8, gen_length=4, progress=False)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_naming_the_parameter(case, tmp_path):
    with pytest.raises(case.error) as caught:
        case.call(tmp_path)
    assert re.search(rf"(?<![\w]){re.escape(case.param)}(?![\w])", str(caught.value)), str(caught.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def _yaml(tmp: Path, text: str) -> str:
    path = tmp / "params.yaml"
    path.write_text(text)
    return str(path)


CLI_CASES = [
    ("reproduce params missing", lambda t: ["sinklib.reproduce", "--params", str(t / "none.yaml")], "--params"),
    ("reproduce params list", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "- models\n- n_prompts\n")], "--params"),
    ("reproduce params bad yaml", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "models: [a\n")], "--params"),
    ("reproduce unknown key", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "n_promts: 1\n")], "n_promts"),
    ("reproduce wrong type", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "n_prompts: many\n")], "n_prompts"),
    ("reproduce model typo", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "models: [tiny-lada]\n")], "name_or_model"),
    ("reproduce only", lambda t: ["sinklib.reproduce", "--only", "99"], "only"),
    ("zoo unknown model", lambda t: ["sinklib.zoo", "train", "tiny-lada"], "name"),
    ("zoo steps", lambda t: ["sinklib.zoo", "train", "tiny-llada", "--steps", "-3"], "--steps"),
    ("zoo eval-n", lambda t: ["sinklib.zoo", "train", "tiny-llada", "--eval-n", "zero"], "--eval-n"),
    ("zoo no command", lambda t: ["sinklib.zoo"], "command"),
]


@pytest.mark.parametrize("name, argv, param", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input_exits_2_naming_the_parameter(name, argv, param, tmp_path):
    if name.startswith("reproduce") and "--params" != param and importlib.util.find_spec("papermill") is None:
        pytest.skip("reading the notebooks' parameters needs papermill (the notebooks extra)")
    done = _cli(*argv(tmp_path))
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    last = done.stderr.strip().splitlines()[-1]
    assert "error:" in last and param in last, last
    assert "Traceback" not in done.stderr


def test_there_are_at_least_sixty_cases():
    assert len(CASES) + len(CLI_CASES) >= 60
