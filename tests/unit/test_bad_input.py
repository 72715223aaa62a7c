"""Bad input across every public entry point and both CLIs: each case must raise the stated exception type,
before any heavy work, with a message that names the parameter that was wrong."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pytest
import torch

import sinklib
from sinklib import dynamics, sinks
from sinklib.trace_store import collect_traces
from sinklib.evaluation import evaluate, get_task
from sinklib.evaluation.sandbox import SandboxLimits, run_python
from sinklib.evaluation.conditions import CONDITIONS
from sinklib.evaluation.table1 import masking_table
from sinklib.zoo import ZOO_DIR, over_training

ROOT = Path(__file__).resolve().parents[2]
SCORES = torch.tensor([[8.0, 1.0, 1.0, 1.0]])


@functools.lru_cache(maxsize=None)
def model(name: str) -> sinklib.LoadedModel:
    return sinklib.load(name)


@functools.lru_cache(maxsize=None)
def trace() -> sinklib.Trace:
    return sinklib.generate(model("tiny-llada"), "1+2=", model("tiny-llada").settings_for(steps=4, gen_length=4), progress=False)


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
    """sinklib.generate with its own keyword arguments; every other one is a sampler option, laid over the model's
    settings by settings_for (where a bad one is refused, before generate starts)."""
    loaded = kwargs.pop("model", model("tiny-llada"))
    prompt = kwargs.pop("prompt", "1+2=")
    own = {"progress": False, **{key: kwargs.pop(key) for key in ("seed", "maps", "intervention", "chat", "progress",
                                                                   "keep_scores") if key in kwargs}}
    settings = loaded.settings_for(**{"steps": 4, "gen_length": 4, **kwargs})
    return sinklib.generate(loaded, prompt, settings, **own)


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
    Case("find_sinks valid shape", lambda t: sinklib.find_sinks(SCORES, valid=torch.ones(3, dtype=torch.bool)),
         ValueError, "valid"),
    Case("top_sinks k too big", lambda t: sinklib.top_sinks(SCORES, k=9), ValueError, "k"),
    Case("top_sinks k negative", lambda t: sinklib.top_sinks(SCORES, k=-1), ValueError, "k"),
    Case("top_sinks k float", lambda t: sinklib.top_sinks(SCORES, k=1.5), ValueError, "k"),
    Case("top_sinks scores dict", lambda t: sinklib.top_sinks({"a": 1}, k=1), ValueError, "scores"),
    Case("sink_margin scores None", lambda t: sinks.sink_margin(None), ValueError, "scores"),
    Case("in_units units", lambda t: sinks.in_units(SCORES, units="sums"), ValueError, "units"),
    Case("threshold_sweep empty eps", lambda t: sinklib.threshold_sweep(SCORES, []), ValueError, "eps_values"),
    Case("threshold_sweep bad eps", lambda t: sinklib.threshold_sweep(SCORES, [1, -2]), ValueError, "eps_values"),
    Case("threshold_sweep valid with list", lambda t: sinklib.threshold_sweep([SCORES, SCORES], [1], valid=SCORES > 0),
         ValueError, "valid"),
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
    Case("MaskRandomKeys start after run", lambda t: gen(intervention=sinklib.MaskRandomKeys(k=1, start_step=50)),
         ValueError, "start_step"),
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
    # flags are real bools: chat="no" applied the chat template (a non-empty string is truthy), keep_scores="no" kept
    Case("generate chat as text", lambda t: gen(chat="no"), ValueError, "chat"),
    Case("generate keep_scores as text", lambda t: gen(keep_scores="no"), ValueError, "keep_scores"),
    Case("generate progress as a number", lambda t: gen(progress=0), ValueError, "progress"),
    Case("generate prompt int", lambda t: gen(prompt=7), ValueError, "prompt"),
    Case("generate prompt empty", lambda t: gen(prompt="   "), ValueError, "prompt"),
    Case("generate prompt ids outside vocab", lambda t: gen(prompt=[1, 2, 10**6]), ValueError, "prompt"),
    Case("generate prompt negative id", lambda t: gen(prompt=[-1, 2]), ValueError, "prompt"),
    Case("generate prompt float tensor", lambda t: gen(prompt=torch.tensor([1.0, 2.0])), ValueError, "prompt"),
    Case("generate prompt floats", lambda t: gen(prompt=[1.5, 2.0]), ValueError, "prompt"),
    Case("generate empty list", lambda t: gen(prompt=[]), ValueError, "prompt"),
    Case("settings steps missing", lambda t: __import__("sinklib.families.llada").families.llada.LLaDASettings(
        steps=None, gen_length=4), ValueError, "steps"),
    Case("generate seed", lambda t: gen(seed=-3), ValueError, "seed"),
    Case("generate alg for llada", lambda t: gen(alg="entropy"), ValueError, "alg"),
    Case("generate block_length for arm", lambda t: gen(model=model("tiny-arm"), block_length=4), ValueError, "block_length"),
    Case("generate maps step beyond run", lambda t: gen(maps=[(9, 0, 0)]), ValueError, "maps"),
    Case("generate intervention str", lambda t: gen(intervention="MaskSinks"), TypeError, "intervention"),
    Case("generate gen_length too long", lambda t: gen(gen_length=10**6, steps=10**6), ValueError, "gen_length"),
    # -- sinks over training ---------------------------------------------------------------------------
    Case("measurement n_traces", lambda t: over_training.Measurement(n_traces=0), ValueError, "n_traces"),
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
    Case("Trace.load flipped byte", lambda t: sinklib.Trace.load(saved_trace(t, lambda f: flip_byte(f / "scores.parquet"))),
         ValueError, "path"),
    Case("Trace.load cut file",
         lambda t: sinklib.Trace.load(saved_trace(t, lambda f: (f / "canvas.parquet").write_bytes(
             (f / "canvas.parquet").read_bytes()[:-10]))),
         ValueError, "path"),
    Case("Trace.load edited shape",
         lambda t: sinklib.Trace.load(saved_trace(t, lambda f: edit_meta(f, lambda m: m.update(shape=m["shape"][::-1])))),
         ValueError, "path"),
    Case("Trace.load broken meta", lambda t: sinklib.Trace.load(saved_trace(t, lambda f: (f / "meta.json").write_text("{"))),
         ValueError, "path"),
    Case("Trace.to_frame steps", lambda t: trace().to_frame(steps=[99]), ValueError, "steps"),
    Case("sink_mask eps", lambda t: dynamics.sink_mask(trace(), eps=-1), ValueError, "eps"),
    # -- evaluation --------------------------------------------------------------------------------------
    Case("evaluate task typo", lambda t: evaluate(model("tiny-arm"), "gsm8j"), ValueError, "task"),
    Case("evaluate limit", lambda t: evaluate(model("tiny-arm"), get_task("arithmetic", limit=0)), ValueError, "limit"),
    Case("evaluate batch_size", lambda t: evaluate(model("tiny-arm"), "arithmetic", batch_size=0), ValueError, "batch_size"),
    Case("evaluate seed", lambda t: evaluate(model("tiny-arm"), "arithmetic", seed=-1), ValueError, "seed"),
    Case("evaluate model object", lambda t: evaluate(object(), "arithmetic"), TypeError, "model"),
    Case("evaluate model typo", lambda t: evaluate("tiny-lada", "arithmetic"), ValueError, "name_or_model"),
    Case("evaluate intervention", lambda t: evaluate(model("tiny-arm"), "arithmetic", intervention=3), TypeError, "intervention"),
    Case("evaluate unknown setting", lambda t: evaluate(model("tiny-arm"), "arithmetic", gen_lenght=8), TypeError, "gen_lenght"),
    Case("settings_for unknown setting", lambda t: model("tiny-arm").settings_for(gen_lenght=8), TypeError, "gen_lenght"),
    Case("evaluate settings of another family", lambda t: evaluate(model("tiny-arm"), "arithmetic",
                                                                   model("tiny-llada").settings_for()),
         TypeError, "settings"),
    Case("evaluate llada option on arm",
         lambda t: evaluate(model("tiny-arm"), "arithmetic", model("tiny-arm").settings_for(remasking="random")),
         ValueError, "remasking"),
    Case("evaluate humaneval without opt-in", lambda t: evaluate(model("tiny-arm"), "humaneval"),
         ValueError, "allow_code_execution"),
    Case("get_task typo", lambda t: get_task("humaneva"), ValueError, "task"),
    Case("masking_table ks", lambda t: masking_table([model("tiny-arm")], ks=[-1]), ValueError, "ks"),
    Case("masking_table ks empty", lambda t: masking_table([model("tiny-arm")], ks=[]), ValueError, "ks"),
    Case("masking_table models", lambda t: masking_table([3.5]), ValueError, "models"),
    Case("masking_table conditions typo", lambda t: masking_table([model("tiny-arm")], conditions=["sink"]), ValueError,
         "conditions"),
    Case("masking_table settings for an unknown model",
         lambda t: masking_table([model("tiny-arm")], settings={"tiny-lada": model("tiny-arm").settings_for()}),
         ValueError, "settings"),
    Case("replaced settings", lambda t: __import__("dataclasses").replace(model("tiny-llada").settings_for(), steps=5),
         ValueError, "steps"),
    Case("condition eps", lambda t: CONDITIONS.get("sinks").at(float("inf")), ValueError, "eps"),
    Case("masking_table condition edited beyond its eps",
         lambda t: masking_table([model("tiny-arm")], conditions=[__import__("dataclasses").replace(
             CONDITIONS.get("sinks"), column="mine")]), ValueError, "conditions"),
    Case("run_python bytes", lambda t: run_python(b"print(1)"), ValueError, "program"),
    Case("run_python limits", lambda t: run_python("print(1)", {"timeout": 1}), ValueError, "limits"),
    Case("SandboxLimits timeout", lambda t: SandboxLimits(timeout=0), ValueError, "timeout"),
    Case("SandboxLimits memory", lambda t: SandboxLimits(memory_mb=-5), ValueError, "memory_mb"),
    # -- trace collection -------------------------------------------------------------------------------------
    Case("collect_traces one text for a list", lambda t: collect_traces(model("tiny-llada"), "Q: 1 + 2 ? A:", out=t),
         ValueError, "texts"),
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


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_naming_the_parameter(case, tmp_path):
    with pytest.raises(case.error) as caught:
        case.call(tmp_path)
    assert re.search(rf"(?<![\w]){re.escape(case.param)}(?![\w])", str(caught.value)), str(caught.value)
    # one error type for a bad value (the sandbox, a standard-library script, raises plain ValueErrors)
    sandboxed = case.name.startswith(("run_python", "SandboxLimits"))
    assert case.error is not ValueError or sandboxed or type(caught.value) is sinklib.BadValue, type(caught.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


_ENTRY_POINTS = {"sinklib.reproduce": "sinklib.reproduce"}  # the zoo's command: tests/experiments/test_bad_input.py


def _cli_in_process(capsys, module: str, *argv: str) -> tuple[int, str]:
    """(exit code, stderr) of `python -m module argv` run as the module's main(argv) in this process: the same
    parser and checks as the command (each command's own process is tested once, below) without paying a Python
    start and torch import per case. Any exception other than the parser's exit fails the test, as a traceback
    would."""
    main = importlib.import_module(_ENTRY_POINTS[module]).main
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    return exited.value.code, capsys.readouterr().err


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
]


@pytest.mark.parametrize("name, argv, param", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input_exits_2_naming_the_parameter(name, argv, param, tmp_path, capsys):
    if name.startswith("reproduce") and importlib.util.find_spec("papermill") is None:
        pytest.skip("sinklib.reproduce runs the notebooks: it needs the notebooks extra")
    code, stderr = _cli_in_process(capsys, *argv(tmp_path))
    assert code == 2, (code, stderr[-500:])
    last = stderr.strip().splitlines()[-1]
    assert "error:" in last and param in last, last


@pytest.mark.process
@pytest.mark.parametrize("name", ["reproduce model typo"])
def test_each_command_exits_2_naming_the_parameter_in_its_own_process(name, tmp_path):
    """The commands as a user types them: `python -m ...` reaches the same main and exits 2 without a traceback."""
    if name.startswith("reproduce") and importlib.util.find_spec("papermill") is None:
        pytest.skip("sinklib.reproduce runs the notebooks: it needs the notebooks extra")
    _, argv, param = next(case for case in CLI_CASES if case[0] == name)
    done = _cli(*argv(tmp_path))
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    last = done.stderr.strip().splitlines()[-1]
    assert "error:" in last and param in last, last
    assert "Traceback" not in done.stderr


def test_there_are_at_least_sixty_cases():
    assert len(CASES) + len(CLI_CASES) >= 60


# -- further classes of bad input: silent results, late or deep errors, consent ----------------------------------
def _checkpoint(tmp: Path, config: dict | list, files: dict[str, bytes] | None = None) -> str:
    folder = tmp / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)
    return str(folder)


def _truncated_zoo(tmp: Path) -> str:
    import shutil

    folder = tmp / "cut"
    shutil.copytree(ROOT / "data" / "models" / "tiny-llada", folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    return str(folder)


def _page(tmp: Path, **kwargs):
    pytest.importorskip("matplotlib", reason="the explorer needs the notebooks extra")
    from sinklib.explorer.page import to_html

    return to_html(trace(), tmp / "p.html", **kwargs)


def _export_clash(tmp: Path):
    pytest.importorskip("matplotlib", reason="the explorer needs the notebooks extra")
    from sinklib.explorer import export_pages

    return export_pages(["/a/m", "/b/m"], tmp, "1+2=")


def _explore(tmp: Path):
    pytest.importorskip("anywidget", reason="the explorer widget needs the notebooks extra")
    from sinklib.explorer import Explorer

    return Explorer(trace(), model("tiny-dream"))


def _cache_file(tmp: Path):
    import os

    (tmp / "cache").write_text("")
    os.environ["SINKLIB_CACHE"] = str(tmp / "cache")
    try:
        return sinklib.load("smollm2-135m-instruct")
    finally:
        del os.environ["SINKLIB_CACHE"]


DREAM_AUTO_MAP = {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"}

CASES_26 = [
    Case("load trust_remote_code 'no'", lambda t: sinklib.load("tiny-llada", trust_remote_code="no"),
         ValueError, "trust_remote_code"),
    Case("load trust_remote_code 'false'", lambda t: sinklib.load("tiny-llada", trust_remote_code="false"),
         ValueError, "trust_remote_code"),
    Case("load trust_remote_code 1", lambda t: sinklib.load("tiny-llada", trust_remote_code=1), ValueError, "trust_remote_code"),
    Case("load trust_remote_code numpy bool", lambda t: sinklib.load("tiny-llada", trust_remote_code=np.bool_(True)),
         ValueError, "trust_remote_code"),
    Case("load mask_id negative", lambda t: sinklib.load("tiny-llada", mask_id=-1), ValueError, "mask_id"),
    Case("load list-shaped config", lambda t: sinklib.load(_checkpoint(t, [1, 2])), ValueError, "name_or_model"),
    Case("load unknown model_type", lambda t: sinklib.load(_checkpoint(t, {"model_type": "no-such-arch"})),
         ValueError, "name_or_model"),
    Case("load llada type with dream code",
         lambda t: sinklib.load(_checkpoint(t, {"model_type": "llada", "auto_map": DREAM_AUTO_MAP}), trust_remote_code=True),
         ValueError, "name_or_model"),
    Case("load missing modelling file",
         lambda t: sinklib.load(_checkpoint(t, {"model_type": "llada", "auto_map": {"AutoModel": "modeling_llada.LLaDAModelLM"}}),
                                trust_remote_code=True),
         ValueError, "name_or_model"),
    Case("load truncated weights", lambda t: sinklib.load(_truncated_zoo(t)), ValueError, "name_or_model"),
    Case("SINKLIB_CACHE a file", lambda t: _cache_file(t), ValueError, "SINKLIB_CACHE"),
    Case("generate temperature inf", lambda t: gen(temperature=float("inf")), ValueError, "temperature"),
    Case("generate temperature True", lambda t: gen(temperature=True), ValueError, "temperature"),
    Case("generate cfg_scale inf", lambda t: gen(cfg_scale=float("inf")), ValueError, "cfg_scale"),
    Case("generate steps numpy negative", lambda t: gen(steps=np.int64(-4)), ValueError, "steps"),
    Case("generate dream alg_temp negative", lambda t: gen(model=model("tiny-dream"), alg_temp=-1.0), ValueError, "alg_temp"),
    Case("generate dream alg_temp text", lambda t: gen(model=model("tiny-dream"), alg_temp="hot"), ValueError, "alg_temp"),
    Case("generate dream top_k zero", lambda t: gen(model=model("tiny-dream"), top_k=0), ValueError, "top_k"),
    Case("capture layer named twice", lambda t: capture_forward(layer_names=["model.layers.0.self_attn"] * 2),
         ValueError, "layer_names"),
    Case("capture layer_names a string", lambda t: capture_forward(layer_names="model.layers.0.self_attn"),
         ValueError, "layer_names"),
    Case("find_sinks +inf key", lambda t: sinklib.find_sinks(torch.tensor([[1.0, float("inf"), 1.0]])), ValueError, "scores"),
    Case("find_sinks -inf key", lambda t: sinklib.find_sinks(torch.tensor([[1.0, float("-inf"), 1.0]])), ValueError, "scores"),
    Case("SinkRule find inf", lambda t: sinklib.SinkRule(3.0).find(torch.tensor([[1.0, float("inf")]])), ValueError, "scores"),
    Case("SandboxLimits processes 1.5", lambda t: SandboxLimits(max_processes=1.5), ValueError, "max_processes"),
    Case("SandboxLimits memory True", lambda t: SandboxLimits(memory_mb=True), ValueError, "memory_mb"),
    Case("SandboxLimits disk 0", lambda t: SandboxLimits(max_disk_mb=0), ValueError, "max_disk_mb"),
    Case("SandboxLimits timeout inf", lambda t: SandboxLimits(timeout=float("inf")), ValueError, "timeout"),
    Case("evaluate allow_code_execution 'yes'", lambda t: evaluate(model("tiny-arm"), "humaneval", allow_code_execution="yes"),
         ValueError, "allow_code_execution"),
    Case("evaluate out empty", lambda t: evaluate(model("tiny-arm"), "arithmetic", out=""), ValueError, "out"),
    Case("evaluate out a folder", lambda t: evaluate(model("tiny-arm"), "arithmetic", out=str(t)), ValueError, "out"),
    Case("evaluate limit numpy zero", lambda t: evaluate(model("tiny-arm"), get_task("arithmetic", limit=np.int64(0))),
         ValueError, "limit"),
    Case("evaluate batch_size 2.5", lambda t: evaluate(model("tiny-arm"), "arithmetic", batch_size=2.5),
         ValueError, "batch_size"),
    Case("masking_table allow_code_execution 1",
         lambda t: masking_table([model("tiny-arm")], task="humaneval", allow_code_execution=1),
         ValueError, "allow_code_execution"),
    Case("condition eps nan", lambda t: CONDITIONS.get("sinks").at(float("nan")), ValueError, "eps"),
    Case("settings_for steps negative", lambda t: model("tiny-arm").settings_for(steps=-2), ValueError, "steps"),
    Case("TracesRun n_prompts -1", lambda t: _runs().TracesRun(n_prompts=-1), ValueError, "n_prompts"),
    Case("TracesRun n_prompts 2.5", lambda t: _runs().TracesRun(n_prompts=2.5), ValueError, "n_prompts"),
    Case("TracesRun models a string", lambda t: _runs().TracesRun(models="tiny-llada"),
         ValueError, "models"),
    Case("TracesRun models empty", lambda t: _runs().TracesRun(models=[]), ValueError, "models"),
    Case("TracesRun gen_length not a multiple",
         lambda t: _runs().TracesRun(gen_length=10, block_length=4),
         ValueError, "gen_length"),
    Case("TracesRun steps negative", lambda t: _runs().TracesRun(steps=-1), ValueError, "steps"),
    Case("TracesRun trust_remote_code 'no'", lambda t: _runs().TracesRun(trust_remote_code="no"),
         ValueError, "trust_remote_code"),
    Case("MaskingRun ks float", lambda t: _runs().MaskingRun(ks=[0, 1.5]), ValueError, "ks"),
    Case("MaskingRun ks empty", lambda t: _runs().MaskingRun(ks=[]), ValueError, "ks"),
    Case("MaskingRun batch_size 0", lambda t: _runs().MaskingRun(batch_size=0), ValueError, "batch_size"),
    Case("MaskingRun allow_code_execution 'true'",
         lambda t: _runs().MaskingRun(allow_code_execution="true"),
         ValueError, "allow_code_execution"),
    Case("ThresholdSweepRun eps_values empty", lambda t: _runs().ThresholdSweepRun(eps_values=[]),
         ValueError, "eps_values"),
    Case("ThresholdSweepRun eps_values negative",
         lambda t: _runs().ThresholdSweepRun(eps_values=[1.0, -1.0]),
         ValueError, "eps_values"),
    Case("ExplorerRun prompt empty", lambda t: _runs().ExplorerRun(prompt=" "), ValueError, "prompt"),
    Case("page max_mb nan", lambda t: _page(t, max_mb=float("nan")), ValueError, "max_mb"),
    Case("page max_mb inf", lambda t: _page(t, max_mb=float("inf")), ValueError, "max_mb"),
    Case("page max_mb text", lambda t: _page(t, max_mb="25"), ValueError, "max_mb"),
    Case("page eps negative", lambda t: _page(t, eps=-1), ValueError, "eps"),
    Case("explorer with another model", lambda t: _explore(t), ValueError, "loaded"),
    Case("export_pages same page name", lambda t: _export_clash(t), ValueError, "models"),
    Case("read_record no record", lambda t: _no_record(t), ValueError, "path"),
    Case("read_record truncated pdf", lambda t: _cut_pdf(t), ValueError, "path"),
    Case("Trace.save over other files", lambda t: _save_over(t), ValueError, "path"),
]


def _no_record(tmp: Path):
    import pandas as pd

    from sinklib import provenance

    pd.DataFrame({"a": [1]}).to_parquet(tmp / "plain.parquet")
    return provenance.read_record(tmp / "plain.parquet")


def _cut_pdf(tmp: Path):
    from sinklib import provenance

    (tmp / "cut.pdf").write_bytes(b"%PDF-1.4 /Subject (" + b"x" * 50)
    return provenance.read_record(tmp / "cut.pdf")


def _save_over(tmp: Path):
    (tmp / "folder").mkdir()
    (tmp / "folder" / "notes.txt").write_text("mine")
    return trace().save(tmp / "folder")


@pytest.mark.parametrize("case", CASES_26, ids=[c.name for c in CASES_26])
def test_issue_26_bad_input_is_refused_naming_the_parameter(case, tmp_path):
    if case.name.split()[0].endswith("Run") and importlib.util.find_spec("matplotlib") is None:
        pytest.skip("the notebooks' run configs need the notebooks extra")
    with pytest.raises(case.error) as caught:
        case.call(tmp_path)
    assert re.search(rf"(?<![\w]){re.escape(case.param)}(?![\w])", str(caught.value)), str(caught.value)


CLI_CASES_26 = [
    ("reproduce duplicated key", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "n_prompts: 2\nn_prompts: 3\n")],
     "--params"),
    ("reproduce non-utf8", lambda t: ["sinklib.reproduce", "--params", _bytes(t, b"n_prompts: \xff\xfe\n")], "--params"),
    ("reproduce negative steps", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "steps: -4\n")], "steps"),
    ("reproduce n_prompts 2.5", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "n_prompts: 2.5\n")], "n_prompts"),
    ("reproduce gen_length vs block", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "gen_length: 10\nblock_length: 4\n")],
     "gen_length"),
    ("reproduce trust 'no'", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "trust_remote_code: 'no'\n")],
     "trust_remote_code"),
    ("reproduce check with out", lambda t: ["sinklib.reproduce", "--check", "--out", str(t)], "--out"),
    # issue 40: values that used to fail only inside a notebook, after its traces were generated
    ("reproduce device gpu", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "device: gpu\n")], "device='gpu'"),
    ("reproduce device cuda:9", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "device: cuda:9\n")], "device='cuda:9'"),
    ("reproduce dtype", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "dtype: float13\n")], "dtype='float13'"),
    ("reproduce task", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "task: gsm9k\n")], "task='gsm9k'"),
    ("reproduce task per model", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "tasks: {tiny-arm: nope}\n")], "tasks="),
    ("reproduce results_dir a file", lambda t: ["sinklib.reproduce", "--params", _yaml(t, f"results_dir: {t / 'params.yaml'}\n")],
     "results_dir="),
]


def _bytes(tmp: Path, data: bytes) -> str:
    path = tmp / "params.yaml"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("name, argv, param", CLI_CASES_26, ids=[c[0] for c in CLI_CASES_26])
def test_issue_26_cli_bad_input_exits_2_naming_the_parameter(name, argv, param, tmp_path, capsys):
    test_cli_bad_input_exits_2_naming_the_parameter(name, argv, param, tmp_path, capsys)


def test_issue_26_added_at_least_sixty_cases():
    assert len(CASES_26) + len(CLI_CASES_26) >= 60


def test_numbers_are_accepted_in_every_numeric_form_users_pass():
    """numpy scalars are numbers wherever numbers are meant (and come back as Python numbers)."""
    plain = sinklib.find_sinks(SCORES, eps=3.0)
    assert torch.equal(sinklib.find_sinks(SCORES, eps=np.float32(3.0)), plain)
    assert torch.equal(sinklib.top_sinks(SCORES, k=np.int64(1)), sinklib.top_sinks(SCORES, k=1))
    assert repr(sinklib.MaskSinks(top_k=np.int64(2))) == repr(sinklib.MaskSinks(top_k=2))  # hashed by resumable runs
    traced = gen(steps=np.int64(4), gen_length=np.int64(4))
    assert traced.n_steps == 4


def test_the_notebooks_run_configs_take_numpy_numbers_as_python_numbers():
    pytest.importorskip("matplotlib")  # the run configs belong to the notebooks (their extra)
    from sinklib.lab import nb04_masking_ablation as nb04

    config = nb04.MaskingRun(ks=[np.int64(0), np.int64(1)], n_problems=np.int32(5), eps=np.float64(2.5))
    assert config.ks == [0, 1] and type(config.n_problems) is int and type(config.eps) is float


# -- refusals added for the surfaces of issue 40 -----------------------------------------------------------------
@pytest.mark.parametrize("given, message", [
    (dict(random_control="no"), "random_control='no' is not allowed: random_control must be True or False"),
    (dict(progress=1), "progress=1 is not allowed: progress must be True or False"),
    (dict(results_dir=""), "results_dir='' is not allowed: results_dir must be a non-empty str"),
    (dict(n_problems_by_task={"arith": 3}), "\\['arith'\\] are not tasks"),
])
def test_masking_run_settings_are_refused_where_the_config_is_made(given, message):
    pytest.importorskip("papermill")  # run configs read their notebooks' parameters with it (the notebooks extra)
    from sinklib.lab import nb04_masking_ablation as nb04

    with pytest.raises(ValueError, match=message):
        nb04.MaskingRun(**given)


@pytest.mark.parametrize("call, message", [
    (lambda: __import__("sinklib.evaluation.table1").evaluation.table1.masking_table(["no-such-model"], ks=[1, 1]),
     r"ks=\[1, 1\] is not allowed: ks must be a non-empty list of distinct integers >= 0"),
    (lambda: __import__("sinklib.evaluation.table1").evaluation.table1.masking_table(["no-such", "no-such"]),
     r"models=\['no-such', 'no-such'\] is not allowed: models must be distinct models \(each once\)"),
    (lambda: _runs().MaskingRun(ks=[1, 1]), r"ks=\[1, 1\] is not allowed: ks must be a non-empty list of distinct"),
    (lambda: _runs().MaskingRun(models=["tiny-arm", "tiny-arm"]),
     r"models=\['tiny-arm', 'tiny-arm'\] is not allowed: models must be a non-empty list of distinct model names"),
    (lambda: _runs().TracesRun(models=[]), r"models=\[\] is not allowed: models must be a non-empty list of distinct"),
    (lambda: _runs().MaskingRun(task="humaneval"),
     r"allow_code_execution=False is not allowed with task='humaneval': scoring it runs the model-written code"),
    (lambda: _runs().TrainingDynamicsRun(checkpoint_count=2**40),
     r"checkpoint_count=1099511627776 is not allowed: recipe tiny-llada trains 5000 steps \(count=.* count <= total"),
    (lambda: _runs().MaskingRun(task_path="no/such/file.jsonl"),
     r"task_path='no/such/file.jsonl' is not allowed: task_path must be an existing file"),
])
def test_run_settings_are_refused_before_any_model_loads(call, message):
    """Each of these used to run the models first, then fail in every view (a k or a model twice) or after the first
    model's generations (HumanEval without consent, a missing task file)."""
    with pytest.raises(ValueError, match=message):
        call()


def test_an_output_folder_under_a_file_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match=r"figures_dir='.*a-file/sub' is not allowed: figures_dir must be a folder "
                                         r"\(this is a file: .*a-file\)"):
        _runs().TracesRun(figures_dir=str(tmp_path / "a-file" / "sub"))


def test_a_huge_checkpoint_count_is_refused_at_once():
    from sinklib.zoo.recipes import checkpoint_steps

    with pytest.raises(ValueError, match="count=1099511627776 is not allowed"):
        checkpoint_steps(5000, 2**40)


def test_a_numpy_seed_is_taken_as_its_integer():
    import numpy as np

    import sinklib

    model = sinklib.load("tiny-arm")
    assert sinklib.generate(model, "Q: a A:", model.settings_for(gen_length=3), seed=np.int64(3),
                            progress=False).tokens.shape[0] >= 2


# --- issue 52: values that were silently taken for something else ----------------------------------------------------
NOTEBOOKS_WITH_CONFIGS = ("01_attention_distributions", "03_threshold_sweep", "04_masking_ablation", "05_explorer",
                          "06_sinks_over_training", "07_what_sinks_carry")


def _runs() -> types.SimpleNamespace:
    """sinklib.lab.runs' names and the run configs of the notebooks above, by class name (the notebooks extra: the
    transformers-4.56 tier has none)."""
    runs = importlib.import_module("sinklib.lab.runs")
    configs = {config.__name__: config for config in map(runs.run_for, NOTEBOOKS_WITH_CONFIGS)}
    return types.SimpleNamespace(**vars(runs), **configs)


def _task(**changes):
    from sinklib.evaluation.tasks import Task, score_final_number

    return Task(**{"name": "x", "load": lambda path: [], "chat": False, "scorer": score_final_number, **changes})


CASES_52 = [
    Case("CarryRun masking_skip typo", lambda t: _runs().CarryRun(masking_skip=["tiny-lada"]), ValueError, "masking_skip"),
    Case("MaskingRun tasks typo", lambda t: _runs().MaskingRun(tasks={"tiny-lada": "capitals"}), ValueError, "tasks"),
    Case("CarryRun tasks typo", lambda t: _runs().CarryRun(tasks={"smollm2-135m-instrukt": "capitals"}), ValueError, "tasks"),
    Case("Task chat 'no'", lambda t: _task(chat="no"), ValueError, "chat"),
    Case("Task chat 1", lambda t: _task(chat=1), ValueError, "chat"),
    Case("Task executes_code 'yes'", lambda t: _task(executes_code="yes"), ValueError, "executes_code"),
]

CLI_CASES_52 = [
    ("reproduce masking_skip typo", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "masking_skip: [tiny-lada]\n")],
     "masking_skip"),
    ("reproduce tasks key typo", lambda t: ["sinklib.reproduce", "--params", _yaml(t, "tasks: {tiny-lada: capitals}\n")],
     "tasks"),
]


@pytest.mark.parametrize("case", CASES_52, ids=[c.name for c in CASES_52])
def test_issue_52_bad_input_is_refused_naming_the_parameter(case, tmp_path):
    test_issue_26_bad_input_is_refused_naming_the_parameter(case, tmp_path)


@pytest.mark.parametrize("name, argv, param", CLI_CASES_52, ids=[c[0] for c in CLI_CASES_52])
def test_issue_52_cli_bad_input_exits_2_naming_the_parameter(name, argv, param, tmp_path, capsys):
    test_cli_bad_input_exits_2_naming_the_parameter(name, argv, param, tmp_path, capsys)


def test_a_run_of_fewer_models_keeps_the_default_tasks_of_the_others_without_complaint():
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("the notebooks' run configs need the notebooks extra")
    assert _runs().MaskingRun(models=["tiny-llada"]).tasks == _runs().TASK_PER_MODEL


@pytest.mark.parametrize("target, output, correct", [
    ("12.0", "5 + 7 = 12 #### 12", True), ("12", "#### 12.0", True), ("12", "#### 13", False),
    ("12345678901234567891", "#### 12345678901234567891", True),
    ("12345678901234567891", "#### 12345678901234567890", False),  # through a float these two were one number
])
def test_numbers_are_compared_as_exact_decimals(target, output, correct):
    from sinklib.evaluation.tasks import Sample, score_final_number

    assert score_final_number(output, Sample("1", "q", target))["correct"] is correct


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-Infinity", "#", ""])
def test_what_is_not_a_finite_number_extracts_to_nothing(text):
    from sinklib.evaluation.extract import normalise_number

    assert normalise_number(text) is None


@pytest.fixture
def odd_conditions():
    """Conditions a user might register that cannot make a table: each is refused before any run."""
    from sinklib.evaluation.conditions import CONDITIONS, Condition

    added = {"unmasking": Condition("unmasking", "unmasking", "with {k} nothing masked", lambda **options: None),
             "mislabelled": Condition("another label", "other", "with {k} keys masked", lambda **options: None),
             "bad words": Condition("bad words", "bad", "with {kk} keys masked", lambda **options: None)}
    for name, condition in added.items():
        CONDITIONS.register(name, condition)
    yield
    for name in added:
        CONDITIONS.unregister(name)


@pytest.mark.parametrize("conditions, message", [
    ("sinks", "conditions='sinks' is not allowed: conditions must be a list of condition names, e.g. ['sinks']"),
    (["sinks", "sinks"], "must be distinct condition names (each once)"),
    (["sinks", "sink values (zero)", "sink values (mean)"],
     "names whose columns differ ('sink values (mean)' and 'sink values (zero)' both write 'values')"),
    (["mislabelled"], "names registered under their own label ('mislabelled' is registered with label 'another label')"),
    (["bad words"], "names whose words take only {k} and {s} ('bad words' says 'with {kk} keys masked'"),
    (["unmasking"], "the policy of 'unmasking' builds no intervention for a llada model at k=1; a masked column must mask"),
])
def test_conditions_that_cannot_make_a_table_are_refused_before_any_run(conditions, message, odd_conditions, tmp_path):
    from sinklib.evaluation.table1 import masking_table

    with pytest.raises(ValueError) as caught:
        masking_table([model("tiny-llada")], task=get_task("arithmetic", limit=2), ks=[0, 1], conditions=conditions,
                      out_dir=tmp_path, progress=False)
    assert message in str(caught.value)
    assert list(tmp_path.iterdir()) == [], "nothing ran"


@pytest.mark.parametrize("models", [["tiny-llada", "tiny-arm"], ["tiny-llada", str(ZOO_DIR / "tiny-arm")],
                                    ["tiny-llada", "smollm2-135m-autoregressive"]])
def test_a_condition_no_later_models_family_can_build_is_refused_before_the_first_model_runs(models, tmp_path):
    """A policy that builds nothing for the autoregressive family only: refused before tiny-llada's runs (it was
    refused at the autoregressive model's turn, after tiny-llada's runs were written)."""
    from sinklib.evaluation.conditions import CONDITIONS, Condition
    from sinklib.evaluation.table1 import masking_table
    from sinklib.interventions import MaskRandomKeys

    CONDITIONS.register("diffusion only", Condition(
        "diffusion only", "diffusion", "with {k} random key{s} masked (diffusion models only)",
        lambda family, k, eps, seed: MaskRandomKeys(k=k, seed=seed) if family.name != "arm" else None))
    try:
        with pytest.raises(ValueError, match=r"the policy of 'diffusion only' builds no intervention for a arm model"):
            masking_table(models, task=get_task("arithmetic", limit=2), ks=[0, 1], conditions=["diffusion only"],
                          out_dir=tmp_path, progress=False)
    finally:
        CONDITIONS.unregister("diffusion only")
    assert list(tmp_path.iterdir()) == [], "nothing ran"


def test_one_familys_settings_for_several_models_are_refused_before_any_run(tmp_path):
    from sinklib.evaluation.table1 import masking_table
    from sinklib.families.llada import LLaDASettings

    with pytest.raises(ValueError, match=r"settings=LLaDASettings\(.*\) is not allowed: settings must be one family's "
                                         r"settings for a table of one model"):
        masking_table(["tiny-llada", "tiny-arm"], task=get_task("arithmetic", limit=2),
                      settings=LLaDASettings(steps=4, gen_length=4), out_dir=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_family_is_read_before_loading_only_from_what_declares_it(tmp_path, monkeypatch):
    """Table 1's early condition build reads a family from a zoo model's, a twin's or a folder's own declaration; a
    named model converted on first use and a hub id are left to loading, whatever folder of that name the current
    directory holds (it is not the model)."""
    from sinklib.evaluation.table1 import family_before_loading

    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m-instruct").mkdir()
    (tmp_path / "smollm2-135m-instruct" / "config.json").write_text('{"sinklib_family": "llada"}')
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"sinklib_family": 5}')
    assert family_before_loading("smollm2-135m-instruct") is None
    assert family_before_loading("org/never-downloaded") is None
    assert family_before_loading(str(tmp_path / "odd")) is None
    assert family_before_loading("tiny-dream").name == "dream"
    assert family_before_loading("smollm2-135m-diffusion").name == "dream"


# --- issue 69: nothing silent, nothing unclear -------------------------------------------------------------------------
def _long_prompt() -> list[int]:
    loaded = model("tiny-llada")
    return [5] * (loaded.max_length + 3)


CASES_69 = [
    # a Table 1 condition whose policy masks nothing ran unmasked and was reported as a masked column
    (lambda t: sinklib.EvictOldest(0), ["k=0 is not allowed: k must be an integer >= 1"]),
    (lambda t: sinklib.EvictOldest(k=-1), ["k=-1 is not allowed: k must be an integer >= 1"]),
    (lambda t: sinklib.MaskSinks(top_k=1, layers=()),
     ["layers=() is not allowed: layers must be a non-empty sequence of integers >= 0, or None for every one (an "
      "empty layers masks nothing)"]),
    (lambda t: sinklib.MaskSinks(top_k=1, steps=[]), ["steps=[] is not allowed: steps must be a non-empty sequence"]),
    (lambda t: sinklib.MaskKeys(positions=()),
     ["positions=() is not allowed: positions must be a non-empty sequence of integers >= 0 (an empty positions masks "
      "nothing)"]),
    (lambda t: sinklib.MaskKeys(positions=torch.tensor([], dtype=torch.long)),
     ["positions=tensor([], dtype=torch.int64) is not allowed"]),
    (lambda t: sinklib.MaskKeys([1], heads=[]), ["heads=[] is not allowed: heads must be a non-empty sequence"]),
    # get_task(path="") read the built-in data
    (lambda t: get_task("arithmetic", path=""),
     ["path='' is not allowed: path must be a non-empty path to a local file (a str or os.PathLike)"]),
    # load(None) advised downloading "None"; load(device="cuda:0") without CUDA raised torch's AssertionError
    (lambda t: sinklib.load(None),
     ["name_or_model=None is not allowed: name_or_model must be a zoo name, a named model, a local folder or a hub id "
      "(a non-empty str or os.PathLike), or an nn.Module"]),
    (lambda t: sinklib.load("tiny-llada", device="cuda:99"),
     ["device='cuda:99' is not allowed: device must be 'cpu' or a device this machine has (CUDA devices: "]),
    (lambda t: sinklib.load("tiny-llada", device=torch.device("cuda", 99)),
     ["device=device(type='cuda', index=99) is not allowed: device must be 'cpu' or a device this machine has"]),
    # a prompt longer than the context said "gen_length must be at most -277"
    (lambda t: gen(prompt=_long_prompt()),
     ["prompt is not allowed: the longest prompt has ", " tokens and tiny-llada's context is ",
      " positions, the prompt's tokens and the answer's together, so no answer fits; prompt must be at most ",
      "tokens for gen_length=4: shorten the prompt"]),
    (lambda t: gen(prompt=_long_prompt()[:-6]),
     ["gen_length=4 is not allowed: gen_length must be at most 3: the longest prompt has ",
      "lower gen_length or shorten the prompt to "]),
]


@pytest.mark.parametrize("index", range(len(CASES_69)))
def test_issue_69_bad_input_is_refused_clearly(index, tmp_path):
    call, parts = CASES_69[index]
    with pytest.raises(sinklib.BadValue) as caught:
        call(tmp_path)
    for part in parts:
        assert part in str(caught.value)


def test_a_long_value_is_shown_cut_in_a_message():
    """A YAML alias bomb of a few hundred bytes expanded into a value whose repr is megabytes, echoed whole."""
    bomb = ["x"] * 9
    for _ in range(6):
        bomb = [bomb] * 9
    with pytest.raises(sinklib.BadValue) as caught:
        sinklib.validation.check_value(bomb, sinklib.validation.ModelNames, "models")
    assert str(caught.value).startswith("models=[[[[") and len(str(caught.value)) < 1_000


# one parameter's value, 9 levels of 9 aliases each: about 500 bytes of YAML, a repr of hundreds of megabytes
_BOMB = "\n  - &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  - &{name} [{', '.join([f'*{before}'] * 9)}]\n" for before, name in zip("abcdefgh", "bcdefghi"))


@pytest.mark.process
@pytest.mark.parametrize("key", ["models", "n_promts"])
def test_a_yaml_alias_bomb_in_params_is_refused_without_echoing_its_expansion(key, tmp_path, capsys):
    if importlib.util.find_spec("papermill") is None:
        pytest.skip("sinklib.reproduce runs the notebooks: it needs the notebooks extra")
    text = f"{key}:{_BOMB}"
    assert len(text) < 600
    code, stderr = _cli_in_process(capsys, "sinklib.reproduce", "--params", _yaml(tmp_path, text))
    last = stderr.strip().splitlines()[-1]
    assert code == 2 and f"{key}=[" in last or f"parameter {key!r} is not allowed" in last, last[:500]
    assert len(stderr) < 5_000, len(stderr)
