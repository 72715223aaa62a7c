"""The trace store: a trace is read back only under the inputs that made it, and reads what generation makes
(make figures remaking the stores: tests/unit/test_reproduce_check.py)."""
import json

import pandas as pd
import pytest
import torch

import sinklib
from sinklib import carry, digest, keys, lens, trace_store
from sinklib.trace_store import collect_traces

PROMPTS = ["Q: tom has 5 apples . tom gets 7 more apples . how many apples does tom have now ? A:",
           "Q: 3 + 4 = ? A:"]


@pytest.fixture(scope="module")
def llada():
    return sinklib.load("tiny-llada")


def _folders(store):
    return sorted(p.relative_to(store) for p in store.glob("*/*") if p.is_dir())


def test_stored_traces_equal_a_fresh_generation_and_are_read_back_without_generating(llada, tmp_path, monkeypatch):
    settings = llada.settings_for()
    made = trace_store.stored_traces(llada, PROMPTS, tmp_path, seed=3, progress=False, settings=settings)
    reference = collect_traces(llada, PROMPTS, seed=3, progress=False, settings=settings)
    assert len(_folders(tmp_path)) == 2

    def no_generation(*args, **kwargs):
        raise AssertionError("a stored trace was generated again")

    monkeypatch.setattr(trace_store, "generate", no_generation)
    read = trace_store.stored_traces(llada, PROMPTS, tmp_path, seed=3, progress=False, settings=settings)
    for fresh, saved, again in zip(reference, made, read):
        assert torch.equal(fresh.tokens, again.tokens) and torch.equal(saved.tokens, again.tokens)
        assert torch.equal(fresh.scores, again.scores) and torch.equal(fresh.is_masked, again.is_masked)
        assert fresh.text == again.text and again.prompt_len == fresh.prompt_len


@pytest.mark.parametrize("change", ["seed", "steps", "prompt", "intervention"])
def test_a_trace_of_other_inputs_is_never_read(llada, tmp_path, change):
    base = dict(seed=0, settings=llada.settings_for(), intervention=None)
    trace_store.stored_traces(llada, PROMPTS[:1], tmp_path, progress=False, **base)
    other = {**base, "seed": 1} if change == "seed" else \
        {**base, "settings": llada.settings_for(steps=8)} if change == "steps" else \
        {**base, "intervention": sinklib.MaskSinks(top_k=1)} if change == "intervention" else base
    prompts = PROMPTS[1:] if change == "prompt" else PROMPTS[:1]
    trace = trace_store.stored_traces(llada, prompts, tmp_path, progress=False, **other)[0]
    assert len(_folders(tmp_path)) == 2, "the other inputs got a folder of their own"
    assert trace.meta["store_key"] != json.loads((tmp_path / _folders(tmp_path)[0] / "meta.json").read_text())


def test_the_key_holds_what_shapes_the_numbers_and_no_version(llada):
    key = trace_store.trace_key(llada, PROMPTS[0], llada.settings_for(), 0, chat=False)
    assert key["weights"] and key["files"] and key["dtype"] == "float32" and key["code"] == keys.numerics_code("llada")
    assert not {"sinklib", "transformers", "torch"} & set(key), "versions are the lock's and the provenance's"
    assert "sinklib.families.dream" in keys.module_files(keys.NUMERIC_MODULES)
    assert not {"sinklib.validation", "sinklib.loading", "sinklib.cache_manifest", "sinklib.named", "sinklib.trace_store",
                "sinklib.plots", "sinklib.lab.runs"} & set(keys.module_files(keys.NUMERIC_MODULES))


@pytest.mark.parametrize("edit, rekeys", [("function in validation, cache_manifest and named", False),
                                          ("operator in sinks", True)])
def test_a_refactor_outside_the_numeric_modules_keys_nothing_anew(llada, monkeypatch, edit, rekeys):
    """A function that computes nothing added to validation, cache_manifest and named (the issue's probe) leaves every
    trace key as it was; an operator changed in the sink rule makes a new one."""
    before = trace_store.trace_key(llada, PROMPTS[0], llada.settings_for(), 0, chat=False)
    real_read = type(keys.PACKAGE).read_text

    def edited(path, *args, **kwargs):
        text = real_read(path, *args, **kwargs)
        if path.name in ("validation.py", "cache_manifest.py", "named.py"):
            return text + "\n\ndef _computes_nothing():\n    return None\n"
        return text.replace("margin = scores - mean_others", "margin = scores + mean_others") if rekeys else text

    monkeypatch.setattr(type(keys.PACKAGE), "read_text", edited)
    keys.code_of.cache_clear()
    keys.numerics_code.cache_clear()
    try:
        after = trace_store.trace_key(llada, PROMPTS[0], llada.settings_for(), 0, chat=False)
    finally:
        monkeypatch.undo()
        keys.code_of.cache_clear()
        keys.numerics_code.cache_clear()
    assert (after != before) is rekeys


@pytest.mark.parametrize("edited", [False, True], ids=["moved as it was", "moved and edited"])
def test_moving_code_between_numeric_modules_keys_nothing_anew(monkeypatch, edited):
    """Issue 68: a numeric module split in two (a function and a constant moved to another numeric module, an import
    between them added) keeps every trace's key; the key follows the definitions, not the files that hold them. The
    same move with one operator changed makes a new key."""
    import ast

    files = keys.module_files(keys.NUMERIC_MODULES)
    source, target = files["sinklib.sinks"], files["sinklib.ties"]
    text = source.read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and not node.decorator_list)
    constant = next(node for node in tree.body if isinstance(node, ast.Assign))
    moved = ["".join(lines[node.lineno - 1:node.end_lineno]) for node in (constant, function)]
    assert all(text.count(part) == 1 for part in moved)
    rest = text
    for part in moved:
        rest = rest.replace(part, "")
    names = f"{constant.targets[0].id}, {function.name}"
    added = "\n\n" + "\n\n".join(moved)
    if edited:
        added = added.replace("return ", "return -", 1)
    texts = {source: f"from sinklib.ties import {names}\n" + rest, target: target.read_text() + added}
    before = keys.numerics_code()
    real_read = type(keys.PACKAGE).read_text
    monkeypatch.setattr(type(keys.PACKAGE), "read_text",
                        lambda path, *args, **kwargs: texts[path] if path in texts else real_read(path, *args, **kwargs))
    keys.numerics_code.cache_clear()
    try:
        after = keys.numerics_code()
    finally:
        monkeypatch.undo()
        keys.numerics_code.cache_clear()
    assert (after != before) is edited


def test_the_dtype_and_a_config_edit_of_a_folder_model_are_other_keys(llada, tmp_path, monkeypatch):
    """A bfloat16 model, or a folder whose config.json says another rope_theta (given by a relative path), is never
    served another's traces."""
    import shutil

    from sinklib.paths import ZOO_DIR

    folder = tmp_path / "copy"
    shutil.copytree(ZOO_DIR / "tiny-llada", folder)
    monkeypatch.chdir(tmp_path)
    same = trace_store.trace_key(sinklib.load("copy"), PROMPTS[0], llada.settings_for(), 0, chat=False)
    halved = sinklib.load("copy", dtype="bfloat16")
    assert trace_store.trace_key(halved, PROMPTS[0], llada.settings_for(), 0, chat=False)["dtype"] == "bfloat16"
    assert trace_store.trace_key(halved, PROMPTS[0], llada.settings_for(), 0, chat=False) != same
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = 2 * float(config.get("rope_theta") or 10000.0)
    (folder / "config.json").write_text(json.dumps(config))
    edited = trace_store.trace_key(sinklib.load("copy"), PROMPTS[0], llada.settings_for(), 0, chat=False)
    assert edited["files"] != same["files"] and edited["weights"] == same["weights"]


def test_a_light_record_is_read_without_its_scores_which_are_made_again_when_asked(llada, tmp_path, monkeypatch):
    """A fresh clone holds the traces' light records, not their scores: reading them generates nothing; the first
    use of the scores generates the trace again from its key's inputs, equal to the one that was saved."""
    settings = llada.settings_for()
    [made] = trace_store.stored_traces(llada, PROMPTS[:1], tmp_path, progress=False, settings=settings)
    whole = made.whole()
    for name in ("scores.parquet", "maps.parquet", "scores.json"):
        next(tmp_path.rglob(name)).unlink()
    calls = []
    real = trace_store.generate
    monkeypatch.setattr(trace_store, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    [light] = trace_store.stored_traces(llada, PROMPTS[:1], tmp_path, progress=False, settings=settings)
    assert torch.equal(light.tokens, whole.tokens) and light.text == whole.text and calls == []
    assert torch.equal(light.scores, whole.scores) and calls == [1]
    assert next(tmp_path.rglob("scores.json")).is_file(), "the scores made again are kept in the store"


def test_a_folder_holding_a_trace_of_other_inputs_is_refused(llada, tmp_path):
    settings = llada.settings_for()
    [trace] = trace_store.stored_traces(llada, PROMPTS[:1], tmp_path, progress=False, settings=settings)
    wanted = trace_store.trace_key(llada, PROMPTS[1], settings, 0, chat=False)
    trace.save(trace_store.trace_folder(tmp_path, wanted))  # prompt 0's trace (and key) under prompt 1's name
    with pytest.raises(ValueError, match=r"store=.* is not allowed: .* holds a trace of other inputs"):
        trace_store.stored_traces(llada, PROMPTS[1:], tmp_path, progress=False, settings=settings)


def test_a_measurement_of_a_stored_trace_is_kept_beside_it_and_read_back(llada, tmp_path, monkeypatch):
    [trace] = trace_store.stored_traces(llada, PROMPTS[:1], tmp_path, progress=False, settings=llada.settings_for())
    measured = trace_store.stored_measurement(tmp_path, trace, "logit_lens", {"top": 1}, "sinklib.lens",
                                              lambda: lens.logit_lens(llada, trace))
    [kept] = (tmp_path / _folders(tmp_path)[0] / "measured").glob("logit_lens-*.parquet")
    read = trace_store.stored_measurement(tmp_path, trace, "logit_lens", {"top": 1}, "sinklib.lens",
                                          lambda: pytest.fail("a kept measurement was measured again"))
    pd.testing.assert_frame_equal(measured, read)
    other = trace_store.stored_measurement(tmp_path, trace, "logit_lens", {"top": 2}, "sinklib.lens",
                                           lambda: lens.logit_lens(llada, trace, top=2))
    assert "top_ids" in other and len(list(kept.parent.glob("*.parquet"))) == 2, "other parameters, another file"
    fresh = collect_traces(llada, PROMPTS[:1], progress=False, settings=llada.settings_for())[0]  # not from a store
    assert trace_store.stored_measurement(tmp_path, fresh, "logit_lens", {"top": 1}, "sinklib.lens",
                                          lambda: measured.head(3)).shape[0] == 3


def test_pick_carry_keeps_its_forwards_beside_the_stored_traces_and_reads_them_back(llada, tmp_path):
    """Notebook 07's carry costs one forward per step: with the store, a second run reads what the first measured
    (equal to measuring afresh), and another ε is another measurement."""
    nb07 = pytest.importorskip("sinklib.lab.nb07_what_sinks_carry",
                               reason="the notebooks extra (its figures) is not installed")
    traces = {"tiny-llada": trace_store.stored_traces(llada, PROMPTS[:1], tmp_path, progress=False,
                                                     settings=llada.settings_for())}
    first = nb07.pick_carry({"tiny-llada": llada}, traces, 3.0, store=tmp_path)
    [kept] = (tmp_path / _folders(tmp_path)[0] / "measured").glob("sink_carry-*.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(kept), carry.sink_carry(llada, traces["tiny-llada"][0], 3.0))
    again = nb07.pick_carry({"tiny-llada": None}, traces, 3.0, store=tmp_path)  # no model: read only
    pd.testing.assert_frame_equal(first, again)
    nb07.pick_carry({"tiny-llada": llada}, traces, 2.0, store=tmp_path)
    assert len(list(kept.parent.glob("sink_carry-*.parquet"))) == 2


@pytest.mark.parametrize("family", ["llada", "dream", "arm"])
def test_a_trace_is_keyed_by_its_own_familys_sampler_not_anothers(family, monkeypatch):
    """Editing Dream's sampler re-keys Dream's traces only; registering a new family re-keys none (its module and its
    line in the families' registry shape no other family's numbers); an edit of shared code re-keys them all (the
    refactor test above)."""
    files = keys.module_files(keys.NUMERIC_MODULES)
    dream = files["sinklib.families.dream"].read_text()
    texts = {files["sinklib.families.dream"]: dream.replace("torch.log(probs + 1e-10)", "torch.log(probs + 1e-9)", 1),
             files["sinklib.families.base"]: files["sinklib.families.base"].read_text().replace(
                 '"arm": "sinklib.families.arm:ARM",', '"arm": "sinklib.families.arm:ARM", "new": "sinklib.families.new:NEW",')}
    assert all(text != path.read_text() for path, text in texts.items()), "the edits apply"
    before = keys.numerics_code(family)
    real_read = type(keys.PACKAGE).read_text
    monkeypatch.setattr(type(keys.PACKAGE), "read_text",
                        lambda path, *args, **kwargs: texts[path] if path in texts else real_read(path, *args, **kwargs))
    keys.numerics_code.cache_clear()
    try:
        after = keys.numerics_code(family)
    finally:
        monkeypatch.undo()
        keys.numerics_code.cache_clear()
    assert (after != before) is (family == "dream")


def test_every_committed_trace_is_keyed_by_this_checkouts_numeric_code():
    """An edit of a numeric module (keys.NUMERIC_MODULES) re-keys what the committed stores hold, so nbval and a reader
    would make it all again (minutes): caught here in seconds, naming the store. (Run `make figures` after such an
    edit, as the committed outputs need it anyway.) An edit anywhere else keys nothing anew."""
    from sinklib.paths import DATA_DIR

    stale = [str(meta.parent.relative_to(DATA_DIR)) for store in ("traces", "long-traces")
             for meta in sorted((DATA_DIR / "results" / store).glob("*/*/meta.json"))
             if (key := trace_store.Trace.load_light(meta.parent).meta["store_key"])["code"] != keys.numerics_code(key["family"])]
    assert stale == [], f"made by other code than this checkout's: {stale[:5]} ({len(stale)} in all)"


def test_every_committed_evaluation_is_keyed_as_this_checkout_keys_its_settings():
    """A settings field added to a family re-keys every committed evaluation unless its default leaves the key as it
    was (families.base.record, KEYED_WHEN_SET): the notebooks would then rerun Table 1 at n = 200 (hours). Each
    committed run's recorded settings, rebuilt into its family's settings class, must record as they were."""
    from sinklib.evaluation.records import read_run
    from sinklib.families.base import get_family, record
    from sinklib.paths import DATA_DIR

    mismatched = []
    for path in sorted((DATA_DIR / "results").rglob("*.jsonl")):
        header, _ = read_run(path)
        if header is None:
            continue
        config = header["config"]
        settings = get_family(config["model"]["family"]).settings(**config["settings"])
        if record(settings) != config["settings"]:
            mismatched.append(path.name)
    assert mismatched == [], f"keyed otherwise by this checkout: {mismatched[:5]} ({len(mismatched)} in all)"


def test_a_docstring_or_comment_leaves_the_code_key_a_code_edit_changes_it():
    """The key holds code, not prose: editing what cannot change a computation (a docstring, a comment, a blank line,
    trailing spaces) keeps every committed trace's key; editing anything else makes a new one."""
    source = (keys.PACKAGE / "sinks.py").read_text(encoding="utf-8")
    kept = digest.code_only(source)
    assert '"""' not in kept and "\n\n" not in kept and "# " not in kept
    function = "def causal_uniform_scores("
    docstring_start = source.index('"""', source.index(function)) + 3
    prose_edits = [
        source[:docstring_start] + "Reworded, é and all. " + source[docstring_start:],  # a function's docstring
        source.replace('"""', '"""Module prose.\n\n', 1),  # the module's docstring
        source.replace("\n\n\n", "\n\n\n# a new comment  \n\n   \n", 1),  # a comment, blank lines, trailing spaces
    ]
    for edited in prose_edits:
        assert edited != source and digest.code_only(edited) == kept
    code_edits = [
        source.replace(function, "def causal_uniform_score("),  # a name
        source.replace('check_int(n, "n", 1)', 'check_int(n, "n", 2)'),  # a constant
        source.replace("margin = scores - mean_others", "margin = scores + mean_others"),  # an operator
        source.replace(f'{function}', f'_UNUSED = "{{not a docstring}}"\n\n\n{function}', 1),  # a string at module level
    ]
    for edited in code_edits:
        assert edited != source and digest.code_only(edited) != kept


@pytest.mark.parametrize("before, after", [
    # a form feed is a line's whitespace to Python, not a line break: the cut must not drift into the code
    ('x = 1  # c\n\x0c\ndef f():\n    "doc"\n    return 1\n', 'x = 1  # c\n\x0c\ndef g():\n    "doc"\n    return 1\n'),
    # a string's own blank lines and trailing spaces are its value
    ('t = """a\n\nb"""\n', 't = """a\nb"""\n'),
    ('t = """a   \nb"""\n', 't = """a\nb"""\n'),
])
def test_code_only_keeps_every_edit_of_a_value(before, after):
    assert digest.code_only(before) != digest.code_only(after)


def test_code_only_reads_a_file_with_a_byte_order_mark_as_without():
    source = 'import os\n\n\ndef f():\n    """doc"""\n    return os.sep  # why\n'
    assert digest.code_only("\ufeff" + source) == digest.code_only(source) == (
        "import os\ndef f():\n    return os.sep")


def test_scores_made_again_with_the_same_canvases_leave_the_light_record_as_it_was(llada, tmp_path):
    """A fresh clone that makes a trace's scores again (another machine: its provenance, last bits) rewrites no
    committed file when the canvases are the same: only the cache's files are written."""
    [made] = trace_store.stored_traces(llada, PROMPTS[:1], tmp_path, progress=False, settings=llada.settings_for())
    folder = made.folder
    light = {name: (folder / name).read_bytes() for name in ("meta.json", "canvas.parquet")}
    for name in ("scores.parquet", "maps.parquet", "scores.json"):
        (folder / name).unlink()
    [again] = trace_store.stored_traces(llada, PROMPTS[:1], tmp_path, progress=False, settings=llada.settings_for())
    assert again.scores is not None and (folder / "scores.json").is_file()
    assert {name: (folder / name).read_bytes() for name in light} == light
