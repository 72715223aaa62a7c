"""Family adapters and the registry: a family defined in one file outside sinklib (tests/toy_family.py) loads,
is inferred from its config, generates token for token like a reference loop, and owns its options."""
import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch

import sinklib
from sinklib.families.base import FAMILIES, DiffusionFamily, FamilySettings, family_names, get_family, record, register_family
from sinklib.loading import infer_family_from_dict
from sinklib.registry import Registry
from tests.models import MASK_ID, diffusion_llama

pytestmark = pytest.mark.transformers  # runs transformers models: the transformers-4.56 tier runs it too


@pytest.fixture
def toy():
    register_family("toy", "tests.toy_family:TOY")
    yield get_family("toy")
    FAMILIES.unregister("toy")


def reference_left_to_right(model, prompt: list[int], gen_length: int) -> list[int]:
    x = torch.tensor([prompt + [MASK_ID] * gen_length])
    for offset in range(gen_length):
        with torch.no_grad():
            x[0, len(prompt) + offset] = model(input_ids=x).logits[0, len(prompt) + offset].argmax()
    return x[0].tolist()


def test_a_family_in_one_file_plus_its_registration_generates_like_its_reference_loop(toy):
    model = diffusion_llama("toy")
    loaded = sinklib.load(model, mask_id=MASK_ID)
    assert loaded.family is toy and loaded.family.is_diffusion
    assert loaded.family.trace_meta() == {"family": "toy", "kind": "diffusion"}
    prompt = [3, 4, 5, 6]
    trace = sinklib.generate(loaded, prompt, loaded.settings_for(steps=5, gen_length=5), progress=False)
    assert trace.tokens[-1].tolist() == reference_left_to_right(model, prompt, 5)
    assert trace.scores.shape[0] == 5 and trace.is_masked[0, 4:].all() and not trace.is_masked[-1, :5].any()
    batch = sinklib.generate(loaded, [prompt, [7, 8]], loaded.settings_for(steps=5, gen_length=5), progress=False)  # left padding
    assert batch[0].tokens[-1].tolist() == trace.tokens[-1].tolist()
    assert batch[1].tokens[-1].tolist() == reference_left_to_right(model, [7, 8], 5)


def test_a_family_owns_its_options(toy):
    loaded = sinklib.load(diffusion_llama("toy"), mask_id=MASK_ID)
    right = sinklib.generate(loaded, [3, 4], loaded.settings_for(steps=3, gen_length=3, direction="right_to_left"),
                             progress=False)
    assert right.is_masked[1].tolist() == [False, False, True, True, False]  # the last position came first
    with pytest.raises(ValueError, match=r"alg='entropy' is not allowed for the toy family: it applies to dream only"):
        sinklib.generate(loaded, [3, 4], loaded.settings_for(steps=3, gen_length=3, alg="entropy"), progress=False)
    with pytest.raises(ValueError, match=r"direction='up' is not allowed: direction must be one of"):
        loaded.settings_for(steps=3, gen_length=3, direction="up")
    llada = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    with pytest.raises(ValueError, match=r"direction='right_to_left' is not allowed for the llada family: "
                                         r"it applies to toy only"):
        llada.settings_for(steps=2, gen_length=2, direction="right_to_left")


def test_unknown_and_renamed_options_are_refused_with_a_hint():
    llada = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    with pytest.raises(TypeError, match=r"block_lenght=4 is not a sampler option: .*\(did you mean 'block_length'\?\)"):
        llada.settings_for(steps=2, gen_length=2, block_lenght=4)
    with pytest.raises(TypeError, match=r"eps=0.001 is not a sampler option: did you mean final_time"):
        llada.settings_for(steps=2, gen_length=2, eps=1e-3)


def test_settings_made_by_hand_give_the_same_run_as_the_models_own():
    from sinklib.families.llada import LLaDASettings

    llada = sinklib.load(diffusion_llama("llada"), mask_id=MASK_ID)
    by_name = sinklib.generate(llada, [3, 4, 5], llada.settings_for(steps=4, gen_length=4, block_length=2), progress=False)
    typed = sinklib.generate(llada, [3, 4, 5], LLaDASettings(steps=4, gen_length=4, block_length=2), progress=False)
    assert typed.tokens.tolist() == by_name.tokens.tolist() and torch.equal(typed.scores, by_name.scores)
    assert typed.meta["settings"]["mask_id"] == MASK_ID  # the model's mask id, not the dataclass default
    from sinklib.families.dream import DreamSettings

    with pytest.raises(TypeError, match=r"settings=DreamSettings\(.*\) is not allowed: the llada family of .* takes "
                                        r"LLaDASettings"):
        sinklib.generate(llada, [3], DreamSettings(steps=2, gen_length=2), progress=False)


def test_config_words_declare_a_registered_family(toy, tmp_path):
    assert infer_family_from_dict({"model_type": "toydiff", "architectures": ["ToyDiffModel"]}) == "toy"
    assert infer_family_from_dict({"model_type": "llada", "architectures": ["LLaDAModelLM"]}) == "llada"
    assert infer_family_from_dict({"model_type": "mmada", "architectures": ["MMadaModelLM"]}) == "mmada"
    assert infer_family_from_dict({"model_type": "Dream"}) == "dream"
    assert infer_family_from_dict({"model_type": "llama"}) is None  # native: decided from the config object


def test_the_registry_imports_lazily_and_refuses_unknown_and_duplicate_names():
    registry = Registry("policy", {"json": "json:dumps"})
    assert registry.names() == ["json"] and "json" in registry
    assert registry.get("json") is json.dumps
    with pytest.raises(ValueError, match=r"policy='jsno' is not allowed: policy must be one of \['json'\] "
                                         r"\(did you mean 'json'\?\)"):
        registry.get("jsno")
    with pytest.raises(ValueError, match=r"name='json' is not allowed: a policy of that name is registered already"):
        registry.register("json", "json:loads")
    registry.register("json", "json:loads", replace=True)
    assert registry.get("json") is json.loads
    with pytest.raises(ValueError, match=r"target='json.loads' is not allowed"):
        registry.register("other", "json.loads")
    assert family_names() == ["arm", "diffusion_gemma", "dream", "llada", "mmada", "udlm"]


# `.kind` reads that mean something else: inspect.Parameter's (harness, compat), a Registry's own (registry.py) and a
# numpy dtype's (a dtype's kind: "i", "f", "O"…)
OTHER_KINDS = {("parameter", None), ("p", None), ("self", "registry.py")}


def _kind_and_zoo_reads(root: Path, skip: Path | None = None) -> list[str]:
    """Every read of an attribute named `kind` or `is_zoo` (getattr / hasattr by name included) in the modules under
    `root` (but `skip`), as "path:line receiver.name", but the OTHER_KINDS."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if skip is not None and skip in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                name, receiver = node.attr, ast.unparse(node.value)
            elif (isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)):
                name, receiver = node.args[1].value, ast.unparse(node.args[0])
            else:
                continue
            other = ((receiver, None) in OTHER_KINDS or (receiver, path.name) in OTHER_KINDS
                     or receiver.endswith(".dtype") or receiver == "dtype")
            if name == "is_zoo" or (name == "kind" and not other):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {receiver}.{name}")
    return found


def test_nothing_outside_the_families_reads_a_kind_or_whether_a_model_is_of_the_zoo():
    """Issue 68: the family answers whether it is a diffusion family (Family.is_diffusion) and what a trace records
    of it (Family.trace_meta), the model how it is prompted (LoadedModel.prompt_style, from model_names.prompt_style):
    no module of sinklib outside sinklib/families/ reads a `kind` (inspect.Parameter's and Registry's own are other
    meanings) or an `is_zoo`."""
    root = Path(sinklib.__file__).parent
    assert _kind_and_zoo_reads(root / "families")  # the scan sees the families' own reads (trace_meta's self.kind)
    assert _kind_and_zoo_reads(root, skip=root / "families") == []


def test_every_familys_settings_say_what_they_are_keyed_by_and_a_family_without_that_is_refused():
    """The Settings protocol declares steps, gen_length and record(); every family's settings dataclass inherits
    record() from FamilySettings (families.base.record), and a family whose settings do not is refused when made."""
    from sinklib.families.arm import ARMSettings
    from sinklib.families.dream import DreamSettings
    from sinklib.families.llada import LLaDASettings
    from sinklib.settings import Settings
    from sinklib.validation import validated

    assert {"steps", "gen_length", "record"} <= set(dir(Settings))
    fast = DreamSettings(steps=4, gen_length=4, block_length=4, threshold=0.9, alg="maskgit_plus")
    for settings in (LLaDASettings(steps=4, gen_length=4), DreamSettings(steps=4, gen_length=4), fast,
                     ARMSettings(gen_length=4)):
        assert isinstance(settings, Settings) and settings.record() == record(settings)
    assert "threshold" in fast.record() and "threshold" not in DreamSettings(steps=4, gen_length=4).record()

    @validated
    @dataclasses.dataclass(frozen=True)
    class Unkeyed:
        steps: int = 1
        gen_length: int = 1

    with pytest.raises(TypeError, match="inherit sinklib.families.base.FamilySettings"):
        DiffusionFamily("unkeyed", lambda *args: [], Unkeyed)
    assert issubclass(get_family("llada").settings, FamilySettings)


def test_a_models_prompt_style_picks_the_prompts_it_is_traced_on():
    """TRACE_TASKS by prompt style: the zoo's format for a zoo model, plain English for every other; anything else
    (a bool, as trace_prompts once took) is refused naming the styles."""
    from sinklib.evaluation.tasks import TRACE_TASKS, trace_prompts
    from sinklib.model_names import PROMPT_STYLES

    assert sorted(TRACE_TASKS) == sorted(PROMPT_STYLES)
    zoo, chat = trace_prompts("zoo", 2), trace_prompts("chat", 2)
    assert len(zoo) == len(chat) == 2 and zoo != chat and zoo[0].startswith("Q:")
    with pytest.raises(ValueError, match="prompt_style=True is not allowed"):
        trace_prompts(True, 1)
