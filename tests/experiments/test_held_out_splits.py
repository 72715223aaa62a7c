"""The held-out splits and what a twin's card reports of them: the split held out by arithmetic, the sound-work check
and the per-template table, against answers worked out by hand."""
import pytest

from experiments.zoo.data import Problem, held_out, held_out_by_work, problems, work_is_sound
from experiments.zoo.evaluate import by_template


@pytest.mark.parametrize("output,sound", [
    ("17 + 4 = 21 #### 21", True),
    ("17 + 4 = 11 #### 21", False),  # scored right by "#### N", but the equation is wrong
    ("2 + 8 = 10 . 10 - 5 = 5 #### 5", True),
    ("2 + 8 = 10 . 10 - 5 = 5 #### 6", False),  # the last result is not the final answer
    ("3 * 4 = 12 #### 12<|im_end|>", True),
    ("6 + 6 = 1 #### 1", False),
    ("the answer is 5", None),
    ("5 - 3 = 2 ####", None),
    ("5 - 3 = two #### 2", None),
])
def test_work_is_sound_checks_every_equation_and_the_final_answer(output, sound):
    assert work_is_sound(output) is sound


@pytest.mark.slow  # replays every twin's training draws: seconds, not the unit tier's sub-second
def test_the_work_split_shares_no_work_string_with_what_was_seen_and_none_among_itself():
    stream = problems(11)
    seen = frozenset(next(stream).work for _ in range(3000))
    split = held_out_by_work(seen, n=50, seed=3)
    works = [p.work for p in split]
    assert len(set(works)) == 50 and not set(works) & seen
    assert not {p.question for p in split} & {p.question for p in held_out()}
    with pytest.raises(ValueError, match=r"n=100000 is not allowed: only \d+ unseen work strings exist"):
        held_out_by_work(seen, n=100000, seed=3)


def test_by_template_counts_accuracy_and_unsound_work_per_template():
    items = [Problem("Q1", "1 + 2 = 3", 3, "add"), Problem("Q2", "5 - 3 = 2", 2, "subtract"),
             Problem("Q3", "4 + 4 = 8", 8, "add")]
    records = [{"id": "arith-0000", "output": "1 + 2 = 3 #### 3", "correct": True},
               {"id": "arith-0001", "output": "5 - 3 = 1 #### 2", "correct": True},  # right on unsound work
               {"id": "arith-0002", "output": "4 + 4 = 9 #### 9", "correct": False}]
    table = by_template(records, items).set_index("template")
    assert table.loc["all", ["n", "right_on_unsound_work"]].tolist() == [3, 1]
    assert table.loc["all", "accuracy"] == pytest.approx(2 / 3)
    assert table.loc["add", "sound_work"] == pytest.approx(0.5) and table.loc["subtract", "sound_work"] == 0.0
    assert table.loc["add", "ci_low"] < 0.5 < table.loc["add", "ci_high"]


def test_a_learning_curve_pairs_each_checkpoint_with_the_shipped_adapter_problem_by_problem():
    """curve_rows pairs by problem id (not by position): worked out by hand on four problems, and a checkpoint
    measured on other problems is refused rather than compared."""
    from scipy.stats import binomtest

    from experiments.zoo.adapt import curve_rows

    items = [Problem("q", "1 + 1 = 2", 2, "add")] * 4

    def right(ids):
        return [{"id": f"arith-{i:04d}", "correct": i in ids, "output": "1 + 1 = 2 #### 2"} for i in range(4)]

    early = right({0, 1})[::-1]  # the same problems in another order
    shipped = right({1, 2, 3})
    rows = curve_rows([({"step": 0}, early), ({"step": "shipped"}, shipped)], items, against_last=True)
    first = rows.iloc[0]
    assert (first["accuracy"], first["lost"], first["gained"]) == (0.5, 1, 2)  # 0 lost; 2 and 3 gained
    assert first["shipped_gain"] == pytest.approx(0.25) and first["shipped_gain_low"] < 0.25 < first["shipped_gain_high"]
    assert first["mcnemar_p"] == pytest.approx(binomtest(1, 3, 0.5).pvalue)
    assert rows.iloc[1]["accuracy"] == 0.75 and "lost" not in rows.columns[rows.iloc[1].notna()]
    with pytest.raises(ValueError, match="holds other problems than the last entry"):
        curve_rows([({"step": 0}, right({0})[:3]), ({"step": "shipped"}, shipped)], items, against_last=True)


def test_a_story_leaves_out_the_distractor_sentences_only():
    from experiments.zoo.data import story

    assert story("Q: tom is 87 years old . raj has 19 apples . the sky is blue . raj gets 2 more apples . leo likes "
                 "cards . how many apples does raj have now ? A:") == \
        ("raj has 19 apples .", "raj gets 2 more apples .", "how many apples does raj have now ?")
    assert story("Q: ben buys 3 boxes . ben lives on street 4 . each box holds 5 pens . how many pens does ben buy ? A:") == \
        ("ben buys 3 boxes .", "each box holds 5 pens .", "how many pens does ben buy ?")


@pytest.mark.slow  # replays the three twins' training draws: about 20 s
def test_the_twins_cards_say_how_held_out_the_new_text_split_is():
    """Issue 69: "held out" said less than it could. Of the 200 new-text problems behind the twins' Table 1, none is a
    trained question, but the diffusion twin's lineage (the autoregressive twin, the first diffusion twin, its own 1,600
    steps) trained on the same story without distractors for 34 and on the same template and operands for 181; each
    twin's card records its own counts, and its README says them (rendered from the card)."""
    import json

    from experiments.zoo import adapt
    from sinklib.paths import ZOO_DIR

    assert adapt.text_split_overlap("smollm2-135m-diffusion", 200) == {
        "n": 200, "lineage": ["smollm2-135m-diffusion", "smollm2-135m-diffusion-v1", "smollm2-135m-autoregressive"],
        "same_question": 0, "same_story": 34, "same_template_and_work": 181}
    for name in adapt.TWINS:
        card = json.loads((ZOO_DIR / name / "card.json").read_text())
        assert card["held_out_overlap"] == adapt.text_split_overlap(name, card["accuracy_n"]), name
        readme = (ZOO_DIR / name / "README.md").read_text()
        assert readme == adapt.render_card(card)
        assert f"same story, without its distractor sentences, for {card['held_out_overlap']['same_story']} of them" \
            in readme.replace("\n", " ")
