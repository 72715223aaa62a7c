"""The shipped tiny zoo: accuracy, attention direction, shipped config and card, where a model comes from (the
training is tested in tests/experiments/test_zoo_training.py)."""
import json

import pytest
import torch

import sinklib
from sinklib.zoo import NAMES, ZOO_DIR
from experiments.zoo.evaluate import accuracy, render_card

# the accuracy each was trained to reach (tiny-udlm and tiny-llada-gated, added later: 0.94 and 0.99 on 600 at their
# shipping, tiny-llada's bar set for both)
THRESHOLDS = {"tiny-llada": 0.85, "tiny-dream": 0.85, "tiny-arm": 0.95, "tiny-udlm": 0.85, "tiny-llada-gated": 0.85}


@pytest.fixture(scope="module", params=NAMES)
def zoo_model(request):
    return request.param, sinklib.load(request.param)


@pytest.fixture(scope="module")
def held_out_accuracy(zoo_model):
    name, loaded = zoo_model
    return name, accuracy(loaded, 100, progress=False)


def test_held_out_accuracy_meets_the_bar(held_out_accuracy):
    name, result = held_out_accuracy
    assert result["accuracy"] >= THRESHOLDS[name], result["outputs"][:5]


def test_attention_direction_matches_the_objective(zoo_model):
    name, loaded = zoo_model
    tokenizer = loaded.tokenizer
    ids = torch.tensor([tokenizer("Q: tom has 5 apples . how many apples does tom have ? A:")["input_ids"]])
    changed = ids.clone()
    changed[0, -3] = tokenizer.convert_tokens_to_ids("ana")
    with torch.no_grad():
        before, after = loaded.model(input_ids=ids).logits, loaded.model(input_ids=changed).logits
    earlier_changed = not torch.allclose(before[0, :5], after[0, :5])
    assert earlier_changed == (name != "tiny-arm")


def test_family_and_mask_token_come_from_the_shipped_config(zoo_model):
    name, loaded = zoo_model
    assert loaded.family.name == name.split("-")[1]
    if loaded.family.is_diffusion and loaded.family.has_mask_token:
        assert loaded.mask_id == loaded.tokenizer.mask_token_id == 3
    assert loaded.family.has_mask_token == (name != "tiny-udlm")


@pytest.mark.parametrize("name", NAMES)
def test_checkpoints_are_small_and_carry_a_card(name):
    folder = ZOO_DIR / name
    assert (folder / "model.safetensors").stat().st_size <= 8 * 2**20
    card = (folder / "README.md").read_text()
    assert "held-out exact-answer accuracy" in card and "most frequent sink tokens" in card
    assert card == render_card(json.loads((folder / "card.json").read_text())), "the README is its card.json's"


def test_where_a_model_comes_from_is_told_by_its_name_and_its_prompt_style_by_its_config(tmp_path):
    """model_names.model_source: a zoo name, the same checkpoint as a folder, a model object, a named model and a hub
    id; the default models are exactly the zoo and the named ones; a zoo model is prompted in the zoo's format however
    it was loaded (LoadedModel.prompt_style)."""
    from sinklib.model_names import is_default_model, model_source

    by_name = sinklib.load("tiny-arm")
    by_folder = sinklib.load(str(ZOO_DIR / "tiny-arm"))
    by_object = sinklib.load(by_name.model, tokenizer=by_name.tokenizer)
    assert [model_source(n) for n in ("tiny-arm", str(ZOO_DIR / "tiny-arm"), by_name.model)] == ["zoo", "folder", "module"]
    assert {by_name.prompt_style, by_folder.prompt_style, by_object.prompt_style} == {"zoo"}
    assert torch.equal(by_name.logits(torch.tensor([[1, 2, 3]])), by_folder.logits(torch.tensor([[1, 2, 3]])))
    assert [model_source(n) for n in ("smollm2-135m-diffusion", "org/model", str(tmp_path))] == ["named", "hub", "folder"]
    assert [is_default_model(n) for n in ("tiny-arm", "smollm2-135m-instruct", str(ZOO_DIR / "tiny-arm"), "org/m")] == \
        [True, True, False, False]
