"""The shipped tiny zoo: accuracy, attention direction, reproducible training, data hygiene."""
import csv
from pathlib import Path

import pytest
import torch

import sinklib
from sinklib.zoo import NAMES, ZOO_DIR
from sinklib.zoo.data import held_out, problems, read_jsonl
from sinklib.zoo.evaluate import accuracy
from sinklib.zoo.tokenizer import build_tokenizer
from sinklib.zoo.train import train

THRESHOLDS = {"tiny-llada": 0.85, "tiny-dream": 0.85, "tiny-arm": 0.95}  # the accuracy each was trained to reach


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
    if name != "tiny-arm":
        assert loaded.mask_id == loaded.tokenizer.mask_token_id == 3


# The shipped curve was written on one CPU; another rounds float32 sums differently in the last bits (seen: one
# ulp, 1.1e-7 relative, at the second step on an Intel Xeon against the AMD EPYC that trained the zoo; 9e-8 with
# torch's portable kernels). Three Adam steps compound a few ulps each, so the curve must agree to 1e-5
# relative (about 80 float32 ulps), while any change of seed, data order or learning rate moves it by > 1e-3.
LOSS_RTOL = 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_retraining_reproduces_the_shipped_loss_curve_first_steps(name, tmp_path):
    """...on the recipe's two threads, then gives the process back its own thread count (`make test`'s workers run
    one): what the process computes after training must compute as before it."""
    threads = torch.get_num_threads()
    _, curve = train(name, ZOO_DIR, steps=3, progress=False)
    assert torch.get_num_threads() == threads
    with (ZOO_DIR / name / "loss_curve.csv").open() as handle:
        shipped = [float(row["loss"]) for row in csv.DictReader(handle)][:3]
    assert [row["loss"] for row in curve] == pytest.approx(shipped, rel=LOSS_RTOL, abs=0)


@pytest.mark.parametrize("name", NAMES)
def test_checkpoints_are_small_and_carry_a_card(name):
    folder = ZOO_DIR / name
    assert (folder / "model.safetensors").stat().st_size <= 8 * 2**20
    card = (folder / "README.md").read_text()
    assert "held-out exact-answer accuracy" in card and "most frequent sink tokens" in card


def test_held_out_set_is_shipped_disjoint_from_training_and_large_enough():
    shipped = read_jsonl(Path(ZOO_DIR).parent / "arithmetic_test.jsonl")
    assert len(shipped) >= 500 and [p.question for p in shipped] == [p.question for p in held_out()]
    exclude = {p.question for p in shipped}
    stream = problems(11, exclude)
    assert not any(next(stream).question in exclude for _ in range(5000))


def test_tokenizer_keeps_numbers_whole_and_round_trips():
    tokenizer = build_tokenizer()
    text = "Q: tom has 57 apples . A: 57 + 3 = 60 #### 60"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.unk_token_id not in ids and ids[0] == tokenizer.bos_token_id
    assert tokenizer.convert_ids_to_tokens(ids).count("57") == 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == text




def test_where_a_model_comes_from_is_decided_once_in_load(tmp_path):
    """LoadedModel.source (loading.model_source): a zoo name, the same checkpoint as a folder, a model object, a named
    model and a hub id; the default models are exactly the zoo and the named ones."""
    from sinklib.loading import is_default_model, model_source

    by_name = sinklib.load("tiny-arm")
    by_folder = sinklib.load(str(ZOO_DIR / "tiny-arm"))
    by_object = sinklib.load(by_name.model, tokenizer=by_name.tokenizer)
    assert (by_name.source, by_folder.source, by_object.source) == ("zoo", "folder", "module")
    assert torch.equal(by_name.logits(torch.tensor([[1, 2, 3]])), by_folder.logits(torch.tensor([[1, 2, 3]])))
    assert [model_source(n) for n in ("smollm2-135m-diffusion", "org/model", str(tmp_path))] == ["named", "hub", "folder"]
    assert [is_default_model(n) for n in ("tiny-arm", "smollm2-135m-instruct", str(ZOO_DIR / "tiny-arm"), "org/m")] == \
        [True, True, False, False]
