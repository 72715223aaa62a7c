"""MMaDA-8B through the MMaDA repository's own classes, the ones the paper ran.

A downloaded MMaDA checkpoint (Gen-Verse/MMaDA-8B-MixCoT, -Base) holds weights and a config.json with
model_type "mmada" but no modelling code: its class, MMadaModelLM, is a subclass of LLaDA's LLaDAModelLM
and lives in the repository's `models` package (github.com/Gen-Verse/MMaDA). For text, only three of that
package's files run: modeling_mmada.py and the configuration_llada.py / modeling_llada.py / sampling.py it
imports (needs torch, transformers and pillow). The package's __init__ also imports the image tokenizer
(MAGVIT-v2), which needs diffusers==0.32.2, einops, jaxtyping, omegaconf and typeguard; sinklib imports
the text files as a package of its own, so attention analysis needs none of those.

Where the repository is: the folder named by SINKLIB_MMADA_REPO, else a `models` package on sys.path
(e.g. `export PYTHONPATH=/path/to/MMaDA`).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

ENV = "SINKLIB_MMADA_REPO"
PACKAGE = "sinklib_mmada_models"  # the name the repository's text files are imported under
INSTALL = ("git clone https://github.com/Gen-Verse/MMaDA /path/to/MMaDA, then `export SINKLIB_MMADA_REPO=/path/to/MMaDA` "
           "(or put the clone on PYTHONPATH)")


@dataclass(frozen=True)
class MMaDAClasses:
    """MMaDA's config class (MMadaConfig), model class (MMadaModelLM) and the `models` folder they came from."""

    config: type
    model: type
    source: Path


def models_folder(repo: str | os.PathLike | None = None) -> Path:
    """The repository's `models` folder: repo/models, $SINKLIB_MMADA_REPO/models, or a `models` package on sys.path."""
    root = repo or os.environ.get(ENV)
    if root:
        folder = Path(root).expanduser() / "models"
        if not (folder / "modeling_mmada.py").is_file():
            source = "repo" if repo else ENV
            raise ImportError(f"{source}={str(root)!r} is not the MMaDA repository: {folder / 'modeling_mmada.py'} does not "
                              f"exist. To load MMaDA checkpoints: {INSTALL}")
        return folder
    spec = importlib.util.find_spec("models")  # finds the folder without running the package's __init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"MMaDA checkpoints run the MMaDA repository's modelling code (MMadaModelLM), and it was not "
                          f"found ({ENV} is unset and no `models` package is importable). {INSTALL}")
    for location in spec.submodule_search_locations:
        if (Path(location) / "modeling_mmada.py").is_file():
            return Path(location)
    raise ImportError(f"the importable `models` package ({list(spec.submodule_search_locations)}) is not the MMaDA "
                      f"repository's: it has no modeling_mmada.py. {INSTALL}")


_imported: MMaDAClasses | None = None


def import_classes(repo: str | os.PathLike | None = None) -> MMaDAClasses:
    """MMaDA's config and model classes, imported once per process (importing them registers the "mmada" type)."""
    global _imported
    if _imported is not None:
        return _imported
    already = sys.modules.get("models.modeling_mmada")  # the user imported the repository themselves
    if already is not None:
        _imported = MMaDAClasses(already.MMadaConfig, already.MMadaModelLM, Path(already.__file__).parent)
        return _imported
    folder = models_folder(repo)
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(folder)]
    sys.modules[PACKAGE] = package
    try:
        module = importlib.import_module(f"{PACKAGE}.modeling_mmada")
    except Exception as error:
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        missing = getattr(error, "name", None) if isinstance(error, ImportError) else None
        hint = f" (`pip install {'pillow' if missing == 'PIL' else missing}`)" if missing else ""
        raise ImportError(f"importing MMaDA's modelling code from {folder / 'modeling_mmada.py'} failed: "
                          f"{type(error).__name__}: {error}{hint}. Its text model needs torch, transformers and pillow; "
                          "the whole repository (image tokenizer too) needs its requirements.txt, e.g. diffusers==0.32.2, "
                          "einops, jaxtyping, omegaconf, typeguard") from error
    _imported = MMaDAClasses(module.MMadaConfig, module.MMadaModelLM, folder)
    return _imported
