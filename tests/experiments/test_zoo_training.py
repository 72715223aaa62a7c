"""The tiny zoo's training (experiments/zoo/train.py, from a checkout): retraining reproduces the shipped loss curve,
the held-out set is disjoint from training, the word-level tokenizer keeps numbers whole."""
import csv
from pathlib import Path

import pytest
import torch

from sinklib.zoo import NAMES, ZOO_DIR
from experiments.zoo.data import held_out, problems, read_jsonl
from experiments.zoo.tokenizer import build_tokenizer
from experiments.zoo.train import train


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
