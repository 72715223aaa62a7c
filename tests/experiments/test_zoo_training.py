"""The tiny zoo's training (experiments/zoo/train.py, from a checkout): retraining reproduces the shipped loss curve,
the held-out set is disjoint from training, the word-level tokenizer keeps numbers whole."""
import csv
import json
from pathlib import Path

import pytest
import torch

from sinklib.zoo import NAMES, ZOO_DIR
from experiments.zoo.data import held_out, problems, read_jsonl
from experiments.zoo.tokenizer import build_tokenizer
from experiments.zoo.train import make_batch, train, uniform_noise_loss


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
    trained_on = json.loads((ZOO_DIR / name / "card.json").read_text()).get("threads", 2)  # the thread count it was
    _, curve = train(name, ZOO_DIR, steps=3, progress=False, threads=trained_on)
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


def test_the_uniform_noise_loss_replaces_response_tokens_only_and_scores_every_response_position():
    """tiny-udlm's objective: the model sees its prompts intact and each response with some tokens replaced by ids
    from the whole vocabulary (at t near 1 most, at t near 0 almost none); the loss is the clean token's
    cross-entropy at every response position, replaced or not, recomputed here from what the model saw."""
    import transformers

    tokenizer = build_tokenizer()
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, is_causal=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    stream = problems(14, set())
    batch = make_batch([next(stream) for _ in range(64)], tokenizer)
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"]), with_kwargs=True)
    with torch.no_grad():
        loss = uniform_noise_loss(model, batch, len(tokenizer), torch.Generator().manual_seed(0), stratified=True)
        logits = model(input_ids=seen[0], attention_mask=batch.attention_mask, position_ids=batch.position_ids).logits
    noisy = seen[0]
    assert torch.equal(noisy[~batch.response], batch.ids[~batch.response])  # the prompt and its padding intact
    replaced = (noisy != batch.ids) & batch.response
    per_row = replaced.sum(1).float() / batch.response.sum(1)
    assert per_row[:8].mean() < 0.2 < 0.8 < per_row[-8:].mean()  # stratified t: rows in rising noise
    assert int(noisy[replaced].max()) > tokenizer.mask_token_id  # ids from the whole vocabulary, not one mask
    expected = torch.nn.functional.cross_entropy(logits[batch.response], batch.ids[batch.response])
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=0)
