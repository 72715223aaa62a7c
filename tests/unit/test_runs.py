"""Run configs, thin notebooks and provenance: each notebook's parameters are exactly its run config's fields
(defaults included), unknown keys are refused with a hint, notebooks hold no analysis, and every artifact says
how it was made — the same bytes for the same run, no timestamps."""
import ast
import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

papermill = pytest.importorskip("papermill")  # the run configs belong to the notebooks (their extra)

from sinklib import keys, provenance  # noqa: E402
from sinklib.lab import nb01_attention_distributions as nb01  # noqa: E402
from sinklib.lab import nb02_moving_sinks as nb02  # noqa: E402
from sinklib.lab import nb04_masking_ablation as nb04  # noqa: E402
from sinklib.lab import nb05_explorer as nb05  # noqa: E402
from sinklib.lab import nb07_what_sinks_carry as nb07  # noqa: E402
from sinklib.lab import nb08_sinks_for_speed as nb08  # noqa: E402
from sinklib.lab import runs  # noqa: E402
from sinklib.summary import Layout, Result  # noqa: E402
from sinklib.lab.reproduce import NOTEBOOKS, notebook_paths  # noqa: E402


def _code_lines_per_section(path: Path) -> dict[str, int]:
    """Code lines outside the parameters cell (blank lines and comments not counted), per section: a section starts
    at each markdown cell that opens with a heading."""
    section, counts = "(before the first heading)", {}
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and source.lstrip().startswith("#"):
            section = source.strip().splitlines()[0]
        elif cell["cell_type"] == "code" and "parameters" not in cell.get("metadata", {}).get("tags", []):
            lines = [line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
            counts[section] = counts.get(section, 0) + len(lines)
    return counts


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_a_notebooks_parameters_cell_shows_its_run_configs_fields_and_defaults(path):
    """The config declares the defaults; the notebook's parameters cell must show exactly those (papermill reads the
    cell independently), and the defaults pass the config's own rules (making the config runs them)."""
    config = runs.run_for(path)
    declared = papermill.inspect_notebook(str(path))
    assert sorted(declared) == sorted(config.parameter_names())
    defaults = config()
    for name, info in declared.items():
        assert ast.literal_eval(info["default"]) == getattr(defaults, name), name
    assert runs.agreement_with_notebook(config, path) == []


def _notebook_with_parameters(folder: Path, stem: str, source: str) -> Path:
    notebook = json.loads((NOTEBOOKS / "02_moving_sinks.ipynb").read_text())
    cell = next(c for c in notebook["cells"] if "parameters" in c["metadata"].get("tags", []))
    cell["source"] = source
    (folder / f"{stem}.ipynb").write_text(json.dumps(notebook))
    return folder / f"{stem}.ipynb"


def test_a_notebook_that_disagrees_with_its_config_is_named_line_by_line(tmp_path):
    """An edited default, a parameter without a field and a field without a parameter are each reported."""
    source = (NOTEBOOKS / "02_moving_sinks.ipynb").read_text()
    cell = next(c for c in json.loads(source)["cells"] if "parameters" in c["metadata"].get("tags", []))
    changed = "".join(cell["source"]).replace("n_prompts = 6", "n_prompts = 9").replace("seed = 0\n", "")
    path = _notebook_with_parameters(tmp_path, "edited", changed + "\nsurprise = 1\n")
    assert runs.agreement_with_notebook(nb02.MovingSinksRun, path) == [
        "parameter 'surprise' has no field in MovingSinksRun",
        "field 'seed' of MovingSinksRun is not a parameter of edited.ipynb",
        "n_prompts: edited.ipynb says 9, MovingSinksRun 6"]


@pytest.mark.process
def test_the_run_configs_import_without_the_notebooks(tmp_path):
    """A config declares its defaults: sinklib.lab imports (and a config is made) where no notebooks/ exists."""
    import subprocess
    import sys
    script = ("import sinklib.paths as p, pathlib; p.NOTEBOOKS = pathlib.Path('/nonexistent');"
              "from sinklib.lab import nb04_masking_ablation as nb04, nb07_what_sinks_carry as nb07;"
              "print(nb07.CarryRun().n_prompts, nb04.MaskingRun().ks)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.split() == ["4", "[0,", "1,", "5,", "10]"]


@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.stem)
def test_each_notebook_section_shows_at_most_eight_lines_of_calls(path):
    """A section may show the few essential calls that make its figure (logic stays in sinklib, where it is tested):
    at most 8 code lines a section."""
    too_long = {section: lines for section, lines in _code_lines_per_section(path).items() if lines > 8}
    assert not too_long, too_long


def test_unknown_keys_are_refused_with_a_hint_and_a_namespace_gives_the_config():
    with pytest.raises(ValueError, match=r"parameter 'n_prompt' is not allowed: TracesRun has no such field "
                                         r"\(did you mean 'n_prompts'\?\)"):
        nb01.TracesRun.check_keys({"n_prompt": 3})
    namespace = {f.name: getattr(nb02.MovingSinksRun(), f.name) for f in dataclasses.fields(nb02.MovingSinksRun)}
    namespace.update(eps=1.5, unrelated=object())
    assert nb02.MovingSinksRun.from_namespace(namespace) == nb02.MovingSinksRun(eps=1.5)
    with pytest.raises(ValueError, match=r"notebook='06_nope' is not allowed"):
        runs.run_for("06_nope.ipynb")


def test_saved_artifacts_carry_the_resolved_config_and_the_same_bytes_every_time(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    def save(folder: Path) -> dict[str, bytes]:
        run = nb02.MovingSinksRun(models=["tiny-llada"], eps=1.5, figures_dir=str(folder), results_dir=str(folder))
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        run.save(Result(figures={"fig": fig}, tables={"table": pd.DataFrame({"k": [1, 2]})},
                             layouts={"table": Layout(("k",))}, texts={"t.md": "x"}))
        plt.close(fig)
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}

    first, second = save(tmp_path / "a"), save(tmp_path / "b")
    assert sorted(first) == ["PROVENANCE.json", "fig.pdf", "fig.png", "t.md", "table.parquet"] and first == second
    manifest = provenance.read_manifest(tmp_path / "a")
    assert sorted(manifest) == ["fig.pdf", "fig.png", "t.md", "table.parquet"]
    for name in ("fig.pdf", "fig.png", "table.parquet"):
        inside = provenance.read_record(tmp_path / "a" / name)
        assert inside == {"config": inside["config"], "seed": 0, "notebook": "02_moving_sinks"}, "nothing volatile inside"
        assert inside["config"]["eps"] == 1.5 and inside["config"]["models"] == ["tiny-llada"]
        assert "figures_dir" not in inside["config"] and "progress" not in inside["config"]
    for name, entry in manifest.items():
        assert entry["sha256"] == hashlib.sha256((tmp_path / "a" / name).read_bytes()).hexdigest()
        assert entry["config"]["eps"] == 1.5 and entry["notebook"] == "02_moving_sinks"
        assert entry["code"] == {"sinklib_sources_sha256": provenance.code_identity(), "numerics": keys.numerics_code()}
        assert entry["versions"]["torch"] == torch.__version__
        assert entry["machine"]["threads"] == torch.get_num_threads()
        assert entry["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert pd.read_parquet(tmp_path / "a" / "table.parquet")["k"].tolist() == [1, 2]
    assert provenance.read_layout(tmp_path / "a" / "table.parquet") == {"keys": ["k"], "scope": "model", "index": False,
                                                                          "threshold": None, "outcome": None}


def test_a_table_without_a_layout_is_refused_before_anything_is_written(tmp_path):
    import pandas as pd

    run = nb02.MovingSinksRun(models=["tiny-llada"], figures_dir=str(tmp_path), results_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"result.tables=\['table'\] is not allowed: every table needs a summary.Layout"):
        run.save(Result(tables={"table": pd.DataFrame({"k": [1]})}))
    assert list(tmp_path.iterdir()) == []


def test_the_same_bytes_made_again_elsewhere_change_nothing_not_even_the_manifest(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    import pandas as pd

    def save(folder: Path) -> dict[str, bytes]:
        run = nb01.TracesRun(models=["tiny-arm"], figures_dir=str(folder), results_dir=str(folder))
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        run.save(Result(figures={"fig": fig}, tables={"table": pd.DataFrame({"k": [1.5]})},
                             layouts={"table": Layout(("k",))}))
        plt.close(fig)
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}

    before = save(tmp_path / "a")
    monkeypatch.setattr(provenance, "code_identity", lambda: "0" * 16)  # as after an edit of the code
    monkeypatch.setattr(provenance, "machine", lambda: {"cpu": "another"})  # and on another machine
    again = save(tmp_path / "a")
    assert again == before, "the same bytes keep the entry that says who made them: nothing changes"
    after = save(tmp_path / "b")
    assert {k: v for k, v in before.items() if k != "PROVENANCE.json"} == \
        {k: v for k, v in after.items() if k != "PROVENANCE.json"}
    assert '"sinklib_sources_sha256": "0000000000000000"' in after["PROVENANCE.json"].decode()


def test_the_manifest_writes_each_environment_once_and_refuses_an_old_format(tmp_path):
    import matplotlib.pyplot as plt

    run = nb01.TracesRun(models=["tiny-arm"], figures_dir=str(tmp_path), results_dir=str(tmp_path))
    figures = {}
    for name in ("one", "two", "three"):
        figures[name], ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
    run.save(Result(figures=figures))
    for fig in figures.values():
        plt.close(fig)
    raw = json.loads((tmp_path / "PROVENANCE.json").read_text())
    assert len(raw["artifacts"]) == 6 and len(raw["environments"]) == 1
    assert {a["environment"] for a in raw["artifacts"].values()} == set(raw["environments"])
    (tmp_path / "PROVENANCE.json").write_text(json.dumps({"fig.png": {"config": {}}}))  # the per-artifact format
    with pytest.raises(ValueError, match=r"PROVENANCE.json is not allowed: it is not a manifest of this sinklib"):
        provenance.read_manifest(tmp_path)


def test_a_truncated_pdf_is_refused_not_read_forever(tmp_path):
    path = tmp_path / "cut.pdf"
    path.write_bytes(b"%PDF-1.4 /Subject (" + b"{\"config\": {" * 10)
    with pytest.raises(ValueError, match=r"record is cut off"):
        provenance.read_record(path)


def test_the_code_identity_is_a_hash_of_the_sources_not_a_commit_or_a_time(tmp_path):
    folder = tmp_path / "pkg"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.py").write_text("x = 1\n")
    (folder / "sub" / "b.js").write_text("export default {};\n")
    (folder / "sub" / "__pycache__").mkdir()
    (folder / "sub" / "__pycache__" / "c.py").write_text("ignored")
    first = provenance.source_hash(folder)
    assert provenance.source_hash(folder) == first and len(first) == 16
    (folder / "sub" / "__pycache__" / "c.py").write_text("still ignored")
    assert provenance.source_hash(folder) == first
    (folder / "a.py").write_text("x = 2\n")
    assert provenance.source_hash(folder) != first
    assert provenance.code_identity() == provenance.source_hash(provenance.PACKAGE)


@pytest.mark.parametrize("config", [nb02.MovingSinksRun, nb05.ExplorerRun])
def test_a_run_with_a_bad_eps_is_refused_before_any_model_loads(config):
    with pytest.raises(ValueError, match=r"eps=-2.0 is not allowed: eps must be a finite number >= 0"):
        config(models=["no-such-model"], eps=-2.0)
    assert config(eps=1.0).eps == 1.0


@pytest.mark.parametrize("params_file", sorted((NOTEBOOKS / "params").glob("paper-*.yaml")), ids=lambda p: p.stem)
@pytest.mark.parametrize("only", [["01"], ["03"], ["04"], ["05"]])
def test_the_paper_parameter_files_run_with_only(params_file, only, tmp_path):
    """Every key of the paper's parameter files is some notebook's parameter: with --only, the keys of the notebooks
    left out are accepted (and not passed on); the run gets as far as resolving the model names."""
    import yaml

    from sinklib.lab import reproduce

    params = yaml.safe_load(params_file.read_text())
    if not torch.cuda.is_available():  # their device is a GPU: refused, naming it, on a machine without one
        with pytest.raises(ValueError, match=r"device='cuda' is not allowed: device must be 'cpu' or a device this "):
            reproduce.check_parameters(params, reproduce.notebook_paths())
        params["device"] = "cpu"
    reproduce.check_parameters(params, reproduce.notebook_paths())
    selected = reproduce.notebook_paths(only)[0]
    assert set(reproduce.parameters_for(selected, params)) <= set(runs.run_for(selected).parameter_names())
    with pytest.raises((ValueError, OSError)) as error:  # offline: the name cannot be resolved
        reproduce.run({**params, "models": ["no-such-model-anywhere"]}, out=tmp_path, only=only)
    assert "no-such-model-anywhere" in str(error.value) and "is not allowed: no notebook declares it" not in str(error.value)


def test_a_key_no_notebook_declares_is_still_refused_with_only(tmp_path):
    from sinklib.lab import reproduce

    with pytest.raises(ValueError, match=r"parameter 'n_problemz' is not allowed: no notebook declares it "
                                         r"\(did you mean 'n_problems'\?\)"):
        reproduce.run({"n_problemz": 3}, out=tmp_path, only=["01"])


def test_a_key_the_selected_notebooks_do_not_declare_is_named_as_changing_nothing(capsys):
    """`--params {eps: 2.0} --only 03` used to pass silently: notebook 03 sweeps eps_values, not eps."""
    from sinklib.lab import reproduce

    reproduce.check_parameters({"eps": 2.0}, reproduce.notebook_paths(["03"]))
    assert ("note: eps (notebooks 02 04 05 06 07 08): not a parameter of notebooks 03, so it changes nothing in this run"
            in capsys.readouterr().err)


def test_notebook_04_evaluates_one_model_as_its_table_does():
    """run.evaluation_of(name): the keyword arguments collect() evaluates a model with — its own task, and the run's
    task file only where that is the run's task."""
    from sinklib.paths import DATA_DIR

    task_file = str(DATA_DIR / "arithmetic_test.jsonl")
    run = nb04.MaskingRun(models=["tiny-llada", "smollm2-135m-instruct"], task_path=task_file, steps=32, seed=3,
                          tasks={"smollm2-135m-instruct": "capitals"})
    loaded = run.load()
    own, other = run.evaluation_of(loaded["tiny-llada"]), run.evaluation_of(loaded["smollm2-135m-instruct"])
    assert (own["task"].name, own["task"].path) == ("arithmetic", task_file)
    assert (other["task"].name, other["task"].path) == ("capitals", None)
    assert own["settings"] == loaded["tiny-llada"].settings_for(steps=32) and own["settings"].steps == 32
    assert own["seed"] == 3 and own["batch_size"] == run.batch_size


@pytest.mark.transformers
def test_notebook_07s_dose_response_samples_with_the_runs_layout_as_notebook_04s_table_does(tmp_path):
    """steps / gen_length / block_length reach the dose-response's evaluations (a paper parameter file sets them: 04's
    Table 1 and 07's dose-response must then run the same generation)."""
    import sinklib
    from sinklib.evaluation.records import read_run

    run = nb07.CarryRun(models=["tiny-llada"], gen_length=8, steps=4, block_length=4, n_problems=2, ks=[0, 1],
                        results_dir=str(tmp_path), figures_dir=str(tmp_path), progress=False)
    run.dose_response({"tiny-llada": sinklib.load("tiny-llada")})
    [config] = [read_run(p)[0]["config"] for p in (tmp_path / "table1-arithmetic").glob("tiny-llada-arithmetic-unmasked-*.jsonl")]
    assert {key: config["settings"][key] for key in ("steps", "gen_length", "block_length")} == \
        {"steps": 4, "gen_length": 8, "block_length": 4}


@pytest.mark.transformers
def test_notebook_08s_masking_sections_run_each_model_under_its_samplers_where_they_keep_their_runs(tmp_path):
    """collect_masking: a diffusion model under its plain sampler (notebook 04's folder) and masking_policy
    (fast-sampling/table1), an autoregressive one with its KV cache; collect_eviction: eviction_policy; each run
    samples with what its sampler says."""
    import sinklib
    from sinklib.evaluation.records import read_run

    run = nb08.SpeedRun(models=["tiny-llada", "tiny-arm"], n_problems=2, masking_batch_size=2, evicted=[1],
                        results_dir=str(tmp_path), figures_dir=str(tmp_path), progress=False)
    loaded = {name: sinklib.load(name) for name in run.models}
    masking, eviction = run.collect_masking(loaded), run.collect_eviction(loaded)
    assert set(masking) == {("tiny-llada", "plain"), ("tiny-llada", "threshold + dual cache"), ("tiny-arm", "KV cache")}
    assert set(eviction) == {("tiny-llada", "threshold + dual cache"), ("tiny-arm", "KV cache")}
    assert sorted(zip(eviction["tiny-arm", "KV cache"].frame["condition"], eviction["tiny-arm", "KV cache"].frame["k"])) \
        == [("oldest keys", 1), ("sinks", 0)]

    def settings(folder, model, column):
        [path] = (tmp_path / folder).glob(f"{model}-arithmetic-{column}-*.jsonl")
        return read_run(path)[0]["config"]["settings"]

    assert settings("table1-arithmetic", "tiny-llada", "top-1").get("cache") is None
    fast = settings("fast-sampling/table1", "tiny-llada", "oldest-1")
    assert (fast["cache"], fast["threshold"]) == ("dual", 0.9)
    assert settings("table1-arithmetic", "tiny-arm", "oldest-1")["gen_length"] == loaded["tiny-arm"].settings_for().gen_length


def _stand_in(name: str):
    """A tiny model of the family a paper parameter file's checkpoint belongs to, under that checkpoint's name (the
    8B checkpoints cannot be loaded here; the settings depend only on the family, the name and the task)."""
    import sinklib
    from tests.models import MASK_ID, diffusion_llama, llama

    family = next(f for word, f in (("llada", "llada"), ("mmada", "mmada"), ("dream", "dream"), ("llama", "arm"),
                                    ("diffusiongemma", "diffusion_gemma")) if word in name.lower())
    if family == "diffusion_gemma":  # transformers' own class, at the release's canvas of 256 (no mask token)
        from tests.parity.test_diffusion_gemma import tiny_config  # skips where transformers < 5.25

        config = tiny_config()
        config.canvas_length = 256
        from transformers import DiffusionGemmaForBlockDiffusion

        module, mask_id = DiffusionGemmaForBlockDiffusion(config).eval(), None
    else:
        module, mask_id = (llama(causal=True), None) if family == "arm" else (diffusion_llama(family), MASK_ID)
    loaded = sinklib.load(module, family=family, mask_id=mask_id)
    module.config.sinklib_family = None  # a real checkpoint's config declares no zoo family: the paper's settings
    assert loaded.prompt_style == "chat"
    return dataclasses.replace(loaded, name=name)


@pytest.mark.parametrize("params", sorted((NOTEBOOKS / "params").glob("*.yaml")), ids=lambda p: p.stem)
def test_notebooks_04_and_07_resolve_the_same_settings_from_every_parameter_file(params, monkeypatch):
    """Notebook 04's Table 1 and notebook 07's dose-response run the same generation of each model on each task: both
    ask SamplingPart.settings_for, whose settings reach masking_table (the issue: 07 once ran the paper's GSM8K at 256
    tokens while 04 ran it at 128). Each run's real collect path, with masking_table recording what it is given."""
    import yaml

    given = {**yaml.safe_load(params.read_text()), "device": "cpu"}  # no GPU here; the settings do not depend on it
    loaded = {name: _stand_in(name) for name in given["models"]}
    asked: dict[str, dict] = {"04": {}, "07": {}}

    def recording(notebook):
        def masking_table(models, task, conditions, ks, settings, **kwargs):
            asked[notebook].update({(model.name, str(getattr(task, "name", task))): settings[model.name]
                                    for model in models})
        return masking_table

    masking = nb04.MaskingRun(**{k: v for k, v in given.items() if k in nb04.MaskingRun.parameter_names()})
    carry = nb07.CarryRun(**{k: v for k, v in given.items() if k in nb07.CarryRun.parameter_names()})
    monkeypatch.setattr(runs, "load_models", lambda names, **kw: {name: loaded[name] for name in names})
    monkeypatch.setattr(nb04, "masking_table", recording("04"))
    masking.collect()
    monkeypatch.setattr(nb07, "masking_table", recording("07"))
    carry.dose_response(loaded)
    assert asked["04"] and asked["04"] == asked["07"]
    for settings in asked["04"].values():  # the parameter file's layout, fitted to the family
        assert settings.gen_length == given.get("gen_length", settings.gen_length)
        assert settings.steps in (None, given.get("steps", settings.steps))


def test_steps_walks_from_a_notebooks_parameters_to_the_sampler_in_six_hops_and_is_built_once(tmp_path):
    """Notebook 01's `steps` on its way to LLaDA's sampler, measured on the running code: the sinklib functions it
    crosses from the run's collect() — as a number to where the settings are built, then inside the one settings object
    to the sampler — are at most 6, and the settings are made once (they were made 5 times and validated 6 times in
    one notebook-01 run, through about 13 hops)."""
    import sys

    from sinklib.families import llada

    run = nb01.TracesRun(models=["tiny-llada"], n_prompts=1, steps=8, gen_length=8, block_length=4, progress=False,
                         results_dir=str(tmp_path), figures_dir=str(tmp_path))
    built, sampled = [], []

    def chain(frame) -> list[str]:  # the sinklib functions on the stack, innermost last, from collect() on
        names = []
        while frame is not None and frame.f_code.co_name != "collect":
            code = frame.f_code  # a comprehension's frame is no hop; validation's checks are the dataclass's own
            if "sinklib" in code.co_filename and "validation.py" not in code.co_filename and code.co_name[0] != "<":
                names.append(frame.f_code.co_qualname)
            frame = frame.f_back
        return names[::-1]

    def watch(frame, event, arg):
        if event == "call" and frame.f_code is llada.sample.__code__:
            sampled.append(chain(frame))
        elif event == "call" and frame.f_code.co_name == "__init__" and frame.f_locals.get("self").__class__ is \
                llada.LLaDASettings and frame.f_locals.get("steps") == 8:
            built.append(chain(frame.f_back))

    sys.setprofile(watch)
    try:
        run.collect()
    finally:
        sys.setprofile(None)
    assert len(built) == 1 and len(sampled) == 1, (built, sampled)
    assert built[0] == ["SamplingPart.settings_for", "LoadedModel.settings_for"]
    assert sampled[0] == ["stored_traces", "generate", "_sample", "sample"]
    assert len(built[0]) + len(sampled[0]) <= 6
