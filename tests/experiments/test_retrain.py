"""Sinks over training, the retraining (experiments/zoo/retrain.py, from a checkout): checkpoints that resume with
the same bits, the prompt-masking variant's masks, and measurements that are written as they go and never redone."""
import dataclasses
import hashlib
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

import sinklib
from sinklib import dynamics
from sinklib.generation import generate
from sinklib.zoo import over_training
from sinklib.zoo.recipes import ZOO
from experiments.zoo import retrain
from experiments.zoo.data import held_out
from experiments.zoo.tokenizer import build_tokenizer
from experiments.zoo.train import build_model, make_batch, masked_diffusion_loss, train

# A recipe small enough for a test: the tiny-llada objective on one layer of width 32, 6 steps of 8 problems.
SMALL = dataclasses.replace(ZOO["tiny-llada"], steps=6, warmup=2, batch_size=8, hidden_size=32, intermediate_size=64,
                            layers=1, heads=2)


def _weights(model) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in model.state_dict().items()}


def test_a_resumed_run_has_the_bits_of_an_uninterrupted_one(tmp_path):
    whole, whole_curve = train("tiny-llada", tmp_path, spec=SMALL, progress=False, checkpoints=tmp_path / "whole",
                               checkpoint_at=(0, 3, 6))
    train("tiny-llada", tmp_path, spec=SMALL, steps=5, progress=False, checkpoints=tmp_path / "cut",
          checkpoint_at=(0, 3), curve_path=tmp_path / "curve.csv")  # stops after step 5, as a killed run would
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["step-00000", "step-00003"]
    assert pd.read_csv(tmp_path / "curve.csv")["step"].tolist() == list(range(5))
    with pytest.raises(ValueError, match="threads=1 is not allowed: .* was trained with threads=2"):
        train("tiny-llada", tmp_path, spec=SMALL, progress=False, checkpoints=tmp_path / "cut", checkpoint_at=(0, 3, 6),
              threads=1)
    resumed, resumed_curve = train("tiny-llada", tmp_path, spec=SMALL, progress=False, checkpoints=tmp_path / "cut",
                                   checkpoint_at=(0, 3, 6), curve_path=tmp_path / "curve.csv")
    expected, got = _weights(whole), _weights(resumed)
    assert all(torch.equal(expected[name], got[name]) for name in expected)
    assert [row["loss"] for row in resumed_curve] == [row["loss"] for row in whole_curve]
    assert pd.read_csv(tmp_path / "curve.csv")["step"].tolist() == list(range(6))  # each step once
    saved = sinklib.load(str(tmp_path / "cut" / "step-00006"))
    assert saved.prompt_style == "zoo"
    assert all(torch.equal(expected[name], value) for name, value in saved.model.state_dict().items())


def test_checkpoints_of_another_recipe_are_refused(tmp_path):
    train("tiny-llada", tmp_path, spec=SMALL, steps=3, progress=False, checkpoints=tmp_path, checkpoint_at=(3,))
    other = dataclasses.replace(SMALL, lr=1e-3)
    with pytest.raises(ValueError, match=r"checkpoints=.* is not allowed: step-00003 was saved by another recipe"):
        train("tiny-llada", tmp_path, spec=other, progress=False, checkpoints=tmp_path, checkpoint_at=(3, 6))


def _noisy_inputs(mask_prompt: bool) -> tuple[torch.Tensor, object, int]:
    """The input ids the model sees in one loss call, and the batch they were made from."""
    tokenizer = build_tokenizer()
    model = build_model(SMALL, tokenizer, Path("."))
    batch = make_batch(held_out()[:64], tokenizer)
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"]), with_kwargs=True)
    masked_diffusion_loss(model, batch, tokenizer.mask_token_id, torch.Generator().manual_seed(0), shifted=False,
                          stratified=True, mask_prompt=mask_prompt)
    return seen[0], batch, tokenizer.mask_token_id


def test_prompt_masking_masks_prompts_of_odd_rows_only_and_never_bos_or_padding():
    plain, batch, mask_id = _noisy_inputs(False)
    variant, _, _ = _noisy_inputs(True)
    prompt = ~batch.response
    assert torch.equal(plain[prompt], batch.ids[prompt])  # the shipped recipe never masks a prompt
    assert torch.equal(plain[batch.response], variant[batch.response])  # same draws on the answers
    changed = variant != batch.ids
    assert not changed[0::2][prompt[0::2]].any()
    odd_prompt = prompt[1::2] & (batch.attention_mask[1::2] == 1) & (batch.position_ids[1::2] > 0)
    assert changed[1::2][odd_prompt].float().mean() > 0.2  # t ~ U(0, 1): about half of them
    assert not changed[1::2][prompt[1::2] & ~odd_prompt].any()  # [BOS] and left padding stay
    assert (variant[changed] == mask_id).all()


@pytest.fixture(scope="module")
def arm():
    return sinklib.load("tiny-arm")


def test_measure_counts_sink_tokens_and_accuracy_as_an_independent_loop_does(arm):
    how = over_training.Measurement(n_problems=6, n_traces=2)
    row = retrain.measure(arm, how, progress=False)
    # accuracy: generate each problem and read "#### N", written here without the evaluation runner
    answers = []
    for problem in held_out()[:6]:
        text = generate(arm, problem.question, arm.settings_for(), chat=False, progress=False, keep_scores=False).text
        found = re.search(r"#### (-?\d+)", text)
        answers.append(found is not None and int(found.group(1)) == problem.answer)
    assert row["accuracy"] == pytest.approx(sum(answers) / 6)
    # token groups: every detection of Eq. 3 over the traces, counted one by one
    counts = dict.fromkeys(dynamics.TOKEN_GROUPS, 0)
    for index, problem in enumerate(held_out()[:2]):
        trace = generate(arm, problem.question, arm.settings_for(), chat=False, seed=index, progress=False)
        for step, _layer, _head, position in dynamics.sink_mask(trace, 3.0).nonzero().tolist():
            text = arm.tokenizer.convert_ids_to_tokens(int(trace.tokens[step, position]))
            group = ("special" if text in arm.tokenizer.all_special_tokens else
                     "punctuation" if text in {".", "?", "+", "-", "*", "=", "Q:", "A:", "####"} else "content")
            counts[group] += 1
    total = sum(counts.values())
    assert total > 0
    for group, count in counts.items():
        assert row[f"share_{group}"] == pytest.approx(count / total)


def test_measurements_are_written_as_they_go_and_never_redone(tmp_path, monkeypatch, arm):
    small_arm = dataclasses.replace(SMALL, objective="arm", causal=True, family="arm", name="tiny-arm", stratified_t=False)
    train("tiny-arm", tmp_path, spec=small_arm, progress=False, checkpoints=tmp_path / "tiny-arm", checkpoint_at=(0, 6))
    monkeypatch.setattr(retrain, "checkpoint_steps", lambda total, count: [0, 6])  # this small run's
    measured = []

    def fake_measure(loaded, how, scratch=None, progress=True):
        measured.append(loaded.name)
        if len(measured) == 2:
            raise KeyboardInterrupt  # the run is stopped after its first row was written
        return {column: 0.5 for column in over_training.COLUMNS if column.startswith(("accuracy", "share_", "top_k",
                                                                                       "move", "share"))}

    monkeypatch.setattr(retrain, "measure", fake_measure)
    results = tmp_path / "rows.parquet"
    with pytest.raises(KeyboardInterrupt):
        retrain.measure_all(["tiny-arm"], folder=tmp_path, results=results, progress=False)
    assert over_training.read_rows(results)["checkpoint"].tolist() == ["step-00000"]
    rows = retrain.measure_all(["tiny-arm"], folder=tmp_path, results=results, progress=False)
    assert measured == ["tiny-arm@step-00000", "tiny-arm@step-00006", "tiny-arm@step-00006", "tiny-arm@shipped"]
    assert rows["checkpoint"].tolist() == ["step-00000", "step-00006", "shipped"]
    assert rows["step"].tolist() == [0, 6, 1200] and rows["train_steps"].tolist() == [6, 6, 1200]
    assert rows.equals(over_training.read_rows(results))
    again = retrain.measure_all(["tiny-arm"], folder=tmp_path, results=results, progress=False)
    assert len(measured) == 4 and again.equals(rows)
    # retrained weights at one checkpoint: that row is measured again and replaces the old one
    retrained = sinklib.load(str(tmp_path / "tiny-arm" / "step-00006")).model
    with torch.no_grad():
        retrained.model.norm.weight.add_(1.0)
    retrained.save_pretrained(tmp_path / "tiny-arm" / "step-00006")
    _record_weights(tmp_path / "tiny-arm" / "step-00006")  # as the retraining that saved them would
    replaced = retrain.measure_all(["tiny-arm"], folder=tmp_path, results=results, progress=False)
    assert measured[4:] == ["tiny-arm@step-00006"] and replaced["checkpoint"].tolist() == rows["checkpoint"].tolist()
    assert (replaced["weights"] != rows["weights"]).tolist() == [False, True, False]
    assert not list(tmp_path.glob(".rows.parquet.*"))  # no scratch file left behind


def _record_weights(path: Path) -> None:
    state = torch.load(path / "training_state.pt", weights_only=True)
    state["weights_sha256"] = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    torch.save(state, path / "training_state.pt")


def test_a_checkpoint_is_read_only_as_what_it_says_it_is(tmp_path, monkeypatch):
    """Checkpoints name their recipe, step and weights inside: another recipe's folder under this name, a folder
    linked under another step's name and a cut weights file are each refused by measure_all before anything is
    measured, and by retrain instead of counting as done."""
    small_arm = dataclasses.replace(SMALL, objective="arm", causal=True, family="arm", name="tiny-arm", stratified_t=False)
    train("tiny-arm", tmp_path, spec=small_arm, progress=False, checkpoints=tmp_path / "tiny-arm", checkpoint_at=(0, 3, 6))
    monkeypatch.setattr(retrain, "checkpoint_steps", lambda total, count: [0, 3, 6])  # this small run's
    monkeypatch.setattr(retrain, "measure", lambda *a, **k: pytest.fail("a checkpoint was measured"))
    results = tmp_path / "rows.parquet"
    with pytest.raises(ValueError, match=r"names=\['tiny-arm', 'tiny-arm'\] is not allowed"):
        retrain.measure_all(["tiny-arm", "tiny-arm"], folder=tmp_path, results=results, progress=False)

    def refused(message: str) -> None:
        with pytest.raises(ValueError, match=message):
            retrain.measure_all(["tiny-arm"], folder=tmp_path, results=results, progress=False)
        assert not results.exists()

    other = tmp_path / "other"
    other.mkdir()
    (other / "tiny-dream").symlink_to(tmp_path / "tiny-arm")  # tiny-arm's checkpoints where tiny-dream's belong
    with pytest.raises(ValueError, match=r"step-00000' is not allowed: recipe 'tiny-arm' saved it, not 'tiny-dream'"):
        retrain.measure_all(["tiny-dream"], folder=other, results=results, progress=False)
    step3 = tmp_path / "tiny-arm" / "step-00003"
    step3.rename(tmp_path / "kept-step-00003")
    step3.symlink_to(tmp_path / "tiny-arm" / "step-00006")
    refused(r"step-00003' is not allowed: it holds the weights after step 6, not 3 \(a folder copied or linked")
    step3.unlink()
    (tmp_path / "kept-step-00003").rename(step3)
    weights = step3 / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    refused(r"step-00003' is not allowed: its model.safetensors is not the file it was saved with \(cut or edited\); "
            r"remove .*step-00003 and retrain it")
    monkeypatch.setattr(retrain, "train", lambda *a, **k: pytest.fail("retrain trained over a damaged checkpoint"))
    monkeypatch.setattr(retrain, "recipe", lambda name: small_arm)
    with pytest.raises(ValueError, match=r"step-00003' is not allowed: its model.safetensors is not the file"):
        retrain.retrain("tiny-arm", tmp_path, count=2)
