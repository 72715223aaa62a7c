"""Bad input to the training programs (experiments/zoo/, run from a checkout): each case is refused before any
training starts, with a message that names the parameter that was wrong; the command `python -m experiments.zoo`
exits 2 naming it, in this process and once in its own."""
from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

import sinklib
from sinklib.paths import ZOO_DIR
from experiments.zoo import adapt, retrain, train
from experiments.zoo.__main__ import main as zoo_main

ROOT = Path(__file__).resolve().parents[2]


class Case(NamedTuple):
    name: str
    call: Callable[[Path], object]
    param: str


CASES = [
    Case("retrain unknown recipe", lambda t: retrain.retrain("tiny-lada", t), "name"),
    Case("retrain into a shipped model", lambda t: retrain.retrain("tiny-arm", ZOO_DIR), "folder"),
    Case("retrain one checkpoint", lambda t: retrain.retrain("tiny-arm", t, count=1), "count"),
    Case("measure_all without checkpoints",
         lambda t: retrain.measure_all(["tiny-arm"], folder=t, results=t / "rows.parquet"), "names"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_naming_the_parameter(case, tmp_path):
    with pytest.raises(ValueError) as caught:
        case.call(tmp_path)
    assert re.search(rf"(?<![\w]){re.escape(case.param)}(?![\w])", str(caught.value)), str(caught.value)
    assert type(caught.value) is sinklib.BadValue, type(caught.value)


CLI_CASES = [
    ("zoo unknown model", ["train", "tiny-lada"], "name"),
    ("zoo steps", ["train", "tiny-llada", "--steps", "-3"], "--steps"),
    ("zoo eval-n", ["train", "tiny-llada", "--eval-n", "zero"], "--eval-n"),
    ("zoo no command", [], "command"),
    ("zoo over-training name", ["over-training", "tiny-lada"], "NAME"),
    ("zoo over-training count", ["over-training", "--checkpoint-count", "1"], "--checkpoint-count"),
]


@pytest.mark.parametrize("name, argv, param", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input_exits_2_naming_the_parameter(name, argv, param, capsys):
    """`python -m experiments.zoo argv` as its main(argv) in this process: the same parser and checks as the command
    without paying a Python start and torch import per case."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        zoo_main(list(argv))
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, (exited.value.code, stderr[-500:])
    last = stderr.strip().splitlines()[-1]
    assert "error:" in last and param in last, last


@pytest.mark.process
def test_the_command_exits_2_naming_the_parameter_in_its_own_process():
    """The command as a user types it from a checkout: `python -m experiments.zoo ...` exits 2 without a traceback."""
    done = subprocess.run([sys.executable, "-m", "experiments.zoo", "train", "tiny-llada", "--steps", "-3"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    last = done.stderr.strip().splitlines()[-1]
    assert "error:" in last and "--steps" in last, last
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("call, message", [
    (lambda: train.train("tiny-arm", ".", threads=True), r"threads=True is not allowed: threads must be an integer"),
    (lambda: adapt.train("smollm2-135m-diffusion", spec=adapt.AdaptSpec("x", "dream", precision="float8")),
     r"precision='float8' is not allowed: precision must be one of \['float32', 'bfloat16'\]"),
    (lambda: adapt.train("smollm2-135m-diffusion", spec=adapt.AdaptSpec("x", "dream", weighting="elbo2")),
     r"weighting='elbo2' is not allowed: weighting must be one of \['elbo', 'elbo-forced', 'flat'\] \(did you mean"),
    (lambda: adapt.AdaptSpec("x", "bogus"), r"objective='bogus' is not allowed: objective must be one of \['dream', 'arm'\]"),
    (lambda: adapt.AdaptSpec("x", "dream", anneal_steps=-5),
     r"anneal_steps=-5 is not allowed: anneal_steps must be an integer >= 0"),
    (lambda: adapt.AdaptSpec("x", "dream", checkpoint_every=0),
     r"checkpoint_every=0 is not allowed: checkpoint_every must be an integer >= 1"),
    (lambda: adapt.AdaptSpec("x", "arm", complementary=True),
     r"complementary=True is not allowed: complementary must be False unless objective='dream', batch_size is even"),
])
def test_training_settings_are_refused_before_any_model_loads(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_retraining_into_a_shipped_models_folder_is_refused():
    with pytest.raises(ValueError, match="shipped model's folder"):
        retrain.retrain("tiny-arm", folder=ZOO_DIR / "tiny-arm")
    with pytest.raises(ValueError, match="threads=True is not allowed"):
        retrain.retrain("tiny-arm", threads=True)


def test_a_recipe_that_starts_from_a_model_without_an_adapter_is_refused_before_the_base_loads(monkeypatch):
    monkeypatch.setattr(adapt, "base_model", lambda: pytest.fail("the base was loaded"))
    with pytest.raises(ValueError, match=r"init_from='tiny-llada' is not allowed: init_from must be None or one of the "
                                         r"twins \['smollm2-135m-autoregressive'"):
        adapt.build(adapt.AdaptSpec("trial", "dream", init_from="tiny-llada"))


@pytest.mark.parametrize("content", [b"garbage, not a checkpoint", b"", "pickled code"])
def test_a_damaged_training_state_is_refused_naming_it_never_with_advice_to_load_it_unsafely(content, tmp_path):
    path = tmp_path / "step-00050" / "state.pt"
    path.parent.mkdir()
    if content == "pickled code":  # what weights_only refuses to unpickle: an object that would run code
        path.write_bytes(pickle.dumps(print))
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        adapt.checked_state(tmp_path, "smollm2-135m-diffusion", 50)
    message = str(caught.value)
    assert message.startswith(f"checkpoint {str(path.parent)!r} is not allowed: its state.pt cannot be read")
    assert "remove it and train again" in message and "weights_only" not in message
