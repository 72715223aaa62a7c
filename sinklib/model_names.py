"""What a name given to sinklib.load means (model_source: a zoo name, a named model, a folder, a hub id or a
module; resolve_name: where its files are, offline first), which family a checkpoint's config declares
(infer_family) and how its model is prompted (prompt_style: the zoo's format or a chat template)."""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from huggingface_hub import try_to_load_from_cache
from torch import nn

from sinklib import named
from sinklib.cache_manifest import check_shipped
from sinklib.families.base import family_names, get_family
from sinklib.paths import ZOO_DIR
from sinklib.validation import bad_value, did_you_mean


def _config_text(model_type: Any, architectures: Any) -> str:
    return " ".join([str(model_type or "")] + [str(a) for a in architectures or []]).lower()


def _declaring_family(text: str) -> str | None:
    return next((name for name in family_names() if get_family(name).declared_by(text)), None)


def infer_family(config: Any) -> str | None:
    """The family a config declares: the zoo's `sinklib_family`, a family's words in model_type / architectures
    (Family.model_types), else the family that claims a native config of this kind (a causal LM → "arm")."""
    declared = getattr(config, "sinklib_family", None)
    if declared:
        return declared
    named = _declaring_family(_config_text(getattr(config, "model_type", ""), getattr(config, "architectures", None)))
    if named is not None:
        return named
    return next((name for name in family_names() if get_family(name).matches_native(config)), None)


def infer_family_from_dict(raw: dict[str, Any]) -> str | None:
    """The family a config.json declares by model_type or architectures (before any code is imported)."""
    return _declaring_family(_config_text(raw.get("model_type"), raw.get("architectures")))


def _offline_hint(name: str) -> str:
    return (f"could not load {name!r}: it is not a local folder and the model hub could not be reached "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}). On a machine with internet run "
            f"`huggingface-cli download {name} --local-dir /path/to/{name.split('/')[-1]}` and pass that folder. "
            f"Available offline here: the zoo {zoo_names()} and the named models {sorted(named.named_names())}.")


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


SOURCES = ("zoo", "named", "folder", "hub", "module")


def model_source(name_or_model: str | os.PathLike | nn.Module) -> str:
    """Where a model comes from, one of SOURCES, decided from the name alone (nothing is loaded or checked): a model
    object ("module"), a named real model or an adapted one ("named", sinklib.named), a zoo name ("zoo",
    data/models/), an existing local path ("folder"), else a hub id ("hub")."""
    if isinstance(name_or_model, nn.Module):
        return "module"
    name = str(name_or_model)
    if name in named.named_names():
        return "named"
    if _is_zoo_name(name):
        return "zoo"
    return "folder" if Path(name).expanduser().exists() else "hub"


PROMPT_STYLES = ("zoo", "chat")


def prompt_style(config: Any) -> str:
    """How a model with this config is prompted, one of PROMPT_STYLES: "zoo" for a model of the tiny zoo (its config
    declares its sampler family, `sinklib_family`, which real checkpoints do not), which reads the zoo's plain
    "Q: … A:" text in its fixed answer slot; "chat" for every other model, whose prompts go through its chat
    template."""
    return "zoo" if getattr(config, "sinklib_family", None) is not None else "chat"


def _is_zoo_name(name: str) -> bool:
    """A plain folder name of data/models/ ("tiny-arm"; never "", "..", a hidden name or a path)."""
    return bool(name) and not name.startswith(".") and "/" not in name and os.sep not in name and (ZOO_DIR / name).is_dir()


def _check_if_shipped(folder: Path) -> None:
    """A folder of data/models/ reached by its path ("data/models/tiny-arm", an absolute path, a symlink) is a shipped
    model all the same: checked against its manifest as loading it by name is."""
    resolved = folder.resolve()
    if resolved.is_dir() and resolved.parent == ZOO_DIR.resolve() and not resolved.name.startswith("."):
        verb = "adapt" if resolved.name in named.ADAPTED_MODELS else "train"
        check_shipped(resolved, resolved.name, f"python -m experiments.zoo {verb} {resolved.name}")


def is_default_model(name: str) -> bool:
    """A model of the CPU default: the tiny zoo or a named real model (sinklib.named)."""
    return model_source(name) in ("zoo", "named")


def zoo_names() -> list[str]:
    """The names of the zoo models shipped in data/models/."""
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file()) if ZOO_DIR.is_dir() else []


def resolve_name(name: str) -> str:
    """A zoo name, a local folder or a hub id → what transformers should open, settled offline where it can be:
    a mistyped zoo name, a missing folder or a folder without config.json is refused at once (with "did you
    mean"), never after a minute of hub retries; a shipped model (a zoo model, a twin's adapter) whose files differ
    from its manifest is refused naming each file (cache_manifest.check_shipped), whether named or reached by its
    path."""
    source = model_source(name)
    if source == "named":
        return _resolve_named(name)
    if source == "zoo":  # a shipped model: every file as its training wrote it, before any is read
        check_shipped(ZOO_DIR / name, name, f"python -m experiments.zoo train {name}")
        return str(ZOO_DIR / name)
    path = Path(name).expanduser()
    if source == "folder":
        _check_if_shipped(path)
        if not path.is_dir():
            raise bad_value("name_or_model", name, "a model folder (this is a file), a zoo name or a hub id")
        if not (path / "config.json").is_file():
            raise bad_value("name_or_model", name, "a model folder with a config.json (this folder has none)")
        return str(path)
    hint = did_you_mean(name, zoo_names() + named.named_names(), cutoff=0.75)
    close = bool(hint)
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1)
    if looks_like_path or not _HUB_ID.match(name) or close:
        raise bad_value("name_or_model", name, f"a zoo name {zoo_names()}, a named real model {named.named_names()}, "
                        f"an existing local folder or a hub id 'org/name'{hint}")
    if not _hub_cached(name) and not _hub_reachable():
        raise OSError(_offline_hint(name))
    return name


def _resolve_named(name: str) -> str:
    """A named model's folder: its converted GGUF (or, without the package, the same model on the hub where it can
    be reached); an adapted model's base's (its adapter is merged once the base is loaded)."""
    if name in named.ADAPTED_MODELS:  # the GGUF conversion it was trained on, never the hub's unquantised weights
        named.check_adapter(named.ADAPTED_MODELS[name])  # the shipped adapter as trained, before its base loads
        return named.resolve_named(named.ADAPTED_MODELS[name].base)
    spec = named.NAMED_MODELS[name]
    try:
        return named.resolve_named(name)
    except ModuleNotFoundError:
        if _hub_cached(spec.hub_id) or _hub_reachable():
            return spec.hub_id  # the same model, unquantised
        raise


def _hub_cached(name: str) -> bool:
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id the cache cannot even parse is simply not cached
        return False


def _hub_reachable() -> bool:
    """One DNS lookup instead of the hub client's five retries with back-off."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False
