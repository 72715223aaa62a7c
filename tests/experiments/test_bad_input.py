"""Bad input to the training programs (experiments/zoo/, run from a checkout): each case is refused before any
training starts, with a message that names the parameter that was wrong; the command `python -m experiments.zoo`
exits 2 naming it, in this process and once in its own."""
from __future__ import annotations

import dataclasses
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
import torch

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


def test_steps_past_the_recipe_end_the_command_as_a_usage_error_and_leave_no_folder(tmp_path, capsys):
    """A step count the recipe refuses (train's own check, after argparse's) ends as argparse's usage error naming
    it, not a traceback, and the refused run leaves no output folder behind."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        zoo_main(["train", "tiny-llada", "--steps", "99999", "--out", str(out)])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert exited.value.code == 2 and last.startswith("python -m experiments.zoo: error: steps=99999 is not allowed: "
                                                      "steps must be an integer >= 1 and <= "), last
    assert not out.exists()


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


def _damaged(path: Path, content: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if content == "pickled code":  # what weights_only refuses to unpickle: an object that would run code
        path.write_bytes(pickle.dumps(print))
    elif content == "cut":  # a state torch wrote, cut short
        torch.save({"spec": {"name": "tiny-arm"}, "step": 50}, path)
        path.write_bytes(path.read_bytes()[:60])
    else:
        path.write_bytes(content)


DAMAGED = [b"garbage, not a checkpoint", b"", "pickled code", "cut"]


@pytest.mark.parametrize("content", DAMAGED)
def test_a_damaged_training_state_is_refused_naming_it_never_with_advice_to_load_it_unsafely(content, tmp_path):
    path = tmp_path / "step-00050" / "state.pt"
    _damaged(path, content)
    with pytest.raises(ValueError) as caught:
        adapt.checked_state(tmp_path, "smollm2-135m-diffusion", 50)
    message = str(caught.value)
    assert message.startswith(f"checkpoint {str(path.parent)!r} is not allowed: its state.pt cannot be read")
    assert "it is damaged" in message and "resume from the checkpoint before it, or start over" in message
    assert "weights_only" not in message and type(caught.value) is sinklib.BadValue


@pytest.mark.parametrize("content", DAMAGED)
def test_a_damaged_zoo_training_state_is_refused_the_same_way(content, tmp_path):
    """Issue 69: the zoo's checkpoints (training_state.pt) were read with torch's own error, which advises
    weights_only=False for a damaged file; they are now refused as the twins' are, by every reader."""
    folder = tmp_path / "tiny-arm" / "step-00050"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    _damaged(folder / train.TRAINING_STATE, content)
    for read in (lambda: train.checked_checkpoint(folder, "tiny-arm", 50), lambda: train.training_state(folder)):
        with pytest.raises(ValueError) as caught:
            read()
        message = str(caught.value)
        assert message.startswith(f"checkpoint {str(folder)!r} is not allowed: its training_state.pt cannot be read")
        assert "it is damaged" in message and "resume from the checkpoint before it, or start over" in message
        assert "weights_only" not in message and type(caught.value) is sinklib.BadValue


ZOO_SPEC = {"name": "x", "family": "llada", "objective": "llada", "causal": False, "seed": 1, "steps": 4}


@pytest.mark.parametrize("change, message", [
    ({"objective": "bogus"}, r"objective='bogus' is not allowed: objective must be one of \['llada', 'arm', 'dream', 'udlm'\]"),
    ({"warmup": -5}, r"warmup=-5 is not allowed: warmup must be an integer >= 0"),
    ({"steps": 0}, r"steps=0 is not allowed: steps must be an integer >= 1"),
    ({"lr": float("nan")}, r"lr=nan is not allowed: lr must be a finite number"),
    ({"causal": "no"}, r"causal='no' is not allowed: causal must be True or False"),
    ({"family": "lada"}, r"family='lada' is not allowed: family must be one of .* \(did you mean 'llada'\?\)"),
    ({"objective": "arm", "causal": True, "family": "arm", "stratified_t": False, "mask_prompt": True},
     r"mask_prompt=True is not allowed: mask_prompt must be False when objective='arm'"),
    ({"heads": 3}, r"heads=3 is not allowed: heads must be a divisor of hidden_size=128"),
])
def test_a_zoo_recipe_is_checked_where_it_is_declared(change, message):
    """Issue 69: ZooSpec(objective="bogus") trained a diffusion loss, and warmup=-5 was taken; every field is now
    checked when a recipe is made (dataclasses.replace included), naming it."""
    from sinklib.zoo.recipes import ZOO, ZooSpec

    with pytest.raises(sinklib.BadValue, match=message):
        ZooSpec(**{**ZOO_SPEC, **change})
    with pytest.raises(sinklib.BadValue, match=message):
        dataclasses.replace(ZOO["tiny-llada"], **change)


@pytest.mark.parametrize("call, message", [
    # past the recipe's steps the cosine schedule turns back up: the learning rate climbed again
    (lambda t: train.train("tiny-arm", t, steps=1201), r"steps=1201 is not allowed: steps must be an integer >= 1 and "
                                                       r"<= 1200"),
    (lambda t: train.train("tiny-arm", t, steps=3, checkpoints=t, checkpoint_at=(0, 3, 5)),
     r"checkpoint_at=\(0, 3, 5\) is not allowed: checkpoint_at must be steps this run reaches, 0 to 3 \(\[5\] would "
     r"never be saved"),
    (lambda t: train.train("tiny-arm", t, steps=3, checkpoint_at=(0, 3)),
     r"checkpoint_at=\(0, 3\) is not allowed: checkpoint_at must be \(\) when checkpoints is None"),
    (lambda t: train.train("tiny-arm", t, steps=3, checkpoints=t, checkpoint_at=(-1,)),
     r"checkpoint_at=-1 is not allowed: checkpoint_at must be an integer >= 0"),
])
def test_a_zoo_run_that_is_not_what_was_asked_is_refused_before_any_model_is_built(call, message, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.setattr(train, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(sinklib.BadValue, match=message):
        call(tmp_path)


def test_a_twin_run_asked_for_fewer_steps_than_its_checkpoints_hold_is_refused(tmp_path, monkeypatch):
    """Issue 69: adapt.train(steps=2) after checkpoints to step 5 resumed at step 5, trained nothing and returned the
    5-step model; it is refused, before the base loads, saying which steps are saved."""
    monkeypatch.setattr(adapt, "base_model", lambda: pytest.fail("the base was loaded"))
    for step in (0, 5):
        (tmp_path / f"step-{step:05d}").mkdir()
        (tmp_path / f"step-{step:05d}" / "state.pt").write_bytes(b"a state")
    with pytest.raises(sinklib.BadValue, match=r"steps=2 is not allowed: steps must be at least 5: .* already holds "
                                               r"this run after step 5, and a run never goes back .*saved steps \[0, 5\]"):
        adapt.train("smollm2-135m-diffusion", checkpoints=tmp_path, steps=2, progress=False)


@pytest.mark.parametrize("names", [["step-2", "step-00002"], ["step-002"], ["step-1x"], ["step-٠٠٠٠٢"]])
def test_a_checkpoint_folder_is_read_under_its_one_name(names, tmp_path, monkeypatch):
    """Issue 69: step-2 and step-00002 were both read as step 2 (one of them silently ignored); a step-… name other
    than the one a run writes is refused naming it, by the zoo's training and the twins' before anything loads."""
    from experiments.zoo.loop import checkpoint_step, saved_checkpoints

    assert [checkpoint_step(n) for n in ("step-00002", "step-123456", "step-2", "step-002", "step-1x")] == \
        [2, 123456, None, None, None]
    (tmp_path / "step-00003.partial").mkdir()  # a killed run's scratch: not a checkpoint, not refused
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.pt").write_bytes(b"a state")
    foreign = [n for n in names if n != "step-00002"]
    message = rf"checkpoints='{tmp_path}' is not allowed: it holds {foreign!r}, not named as a run names"
    with pytest.raises(sinklib.BadValue, match=re.escape(message[:-len(", not named as a run names")])):
        saved_checkpoints(tmp_path, "state.pt")
    monkeypatch.setattr(adapt, "base_model", lambda: pytest.fail("the base was loaded"))
    monkeypatch.setattr(train, "build_model", lambda *a, **k: pytest.fail("a model was built"))
    for run in (lambda: adapt.train("smollm2-135m-diffusion", checkpoints=tmp_path, progress=False),
                lambda: train.train("tiny-arm", tmp_path, checkpoints=tmp_path, checkpoint_at=(0,), progress=False)):
        with pytest.raises(sinklib.BadValue, match="not named as a run names its checkpoints"):
            run()
