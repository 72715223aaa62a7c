"""A folder of traces keyed by what shaped them, so notebooks read a generation instead of making it again.

Notebooks 01, 02, 03 and 07 analyse the same generations (each model on the first prompts of its task, its own
settings, seed + i for prompt i). Each trace is kept in `store/<model>/<key>/` (Trace.save's files), where the key is
the digest of every input that shaped it (trace_key; sinklib.keys says what that is and what it leaves out: no package
version, no code but the code that computes numbers). A trace is read only under its own key, so nothing made from
other inputs is ever reused; a folder whose files were changed is refused by Trace.load (each file's SHA-256 is
recorded), one whose recorded key differs from its name is refused here.

A trace is kept in two parts (Trace.save): its light record (meta.json, canvas.parquet: a few kB, what was generated)
and its scores (scores.parquet, maps.parquet: up to megabytes). The repository commits the light records and not the
scores, which are a cache: a StoredTrace reads its light record at once and its scores only when an analysis first
asks for them, generating them again (the same inputs, so the same generation up to another CPU's last bits) when they
are not there. A notebook's picks are kept under keys of their own (sinklib.derived), so a reader and nbval redraw
every figure from committed tables without the scores; a changed parameter or changed numeric code makes what it
needs again, with a progress bar."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from sinklib.capturing import check_intervention
from sinklib.digest import canonical, digest
from sinklib.families.base import record
from sinklib.generation import generate
from sinklib.interventions import identity
from sinklib.keys import code_of, model_identity, numerics_code
from sinklib.loading import LoadedModel
from sinklib.settings import Settings
from sinklib.trace import Trace
from sinklib.validation import BadValue

# 1: keyed by versions and the code generation imports. 2: keyed by keys.model_identity and keys.numerics_code;
# a trace saved in two parts (Trace FORMAT 3).
STORE_FORMAT = 2
MEASURED = "measured"  # a trace folder's subfolder of measurements (stored_measurement): a cache, as its scores are


def trace_key(loaded: LoadedModel, prompt: str, settings: Settings, seed: int, chat: bool, intervention=None) -> dict:
    """Every input a trace depends on (a JSON-able dict): what its folder's name is the digest of. The model as
    keys.model_identity (name, family, weights, forward-shaping files, dtype), the settings' every field, the prompt,
    seed, chat flag, intervention, and keys.numerics_code of its family."""
    return {"store": STORE_FORMAT, **model_identity(loaded), "settings": record(settings), "prompt": prompt,
            "seed": seed, "chat": chat, "intervention": identity(intervention) if intervention is not None else None,
            "code": numerics_code(loaded.family.name)}


def trace_folder(store: str | Path, key: dict) -> Path:
    """Where the trace of `key` lives in `store`: <model name, made a folder name>/<digest of the key>."""
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", str(key["model"]).strip("/")) or "model"
    return Path(store) / model / digest(key)


class StoredTrace(Trace):
    """A trace of a store: its light record (canvases, margins, text, meta) read at once, its scores and maps read
    from the store, or generated again, when first asked for (`make`). Everything else is a Trace's."""

    _HEAVY = ("scores", "maps", "masked_keys")

    def __init__(self, light: Trace, folder: Path, key: dict, make: Callable[[], Trace]):  # noqa: D107
        for name in Trace.__dataclass_fields__:
            if name not in self._HEAVY:
                setattr(self, name, getattr(light, name))
        self.folder, self.store_key, self._make, self._whole = folder, key, make, None

    def whole(self) -> Trace:
        """The trace with its scores: read from the store, or generated and saved there when they are not."""
        if self._whole is None:
            self._whole = self._make()
            for name in Trace.__dataclass_fields__:  # a generation on another CPU may differ at a near-tie
                if name not in self._HEAVY:
                    setattr(self, name, getattr(self._whole, name))
        return self._whole

    scores = property(lambda self: self.whole().scores)
    maps = property(lambda self: self.whole().maps)
    masked_keys = property(lambda self: self.whole().masked_keys)


def stored_traces(loaded: LoadedModel, texts: Sequence[str], store: str | Path, seed: int = 0, intervention=None,
                  progress: bool = True, settings: Settings | None = None) -> list[Trace]:
    """One trace per prompt as collect_traces makes them (prompt i with seed + i, the model's own
    prompt style, `settings` default loaded.settings_for()), each a StoredTrace of `store` (trace_key): its light
    record read when it is there, its scores read or generated when an analysis asks for them; a prompt with no
    record at all is generated and saved there now."""
    if isinstance(texts, (str, bytes)):
        raise BadValue(f"texts={texts!r} is not allowed: texts must be a list of prompts (a single text is one "
                       "prompt: pass [text])")
    check_intervention(intervention)  # refused before any work: a policy whose record names a memory address
    settings = loaded.settings_for() if settings is None else loaded.runnable(settings)
    traces, made = [], 0
    with tqdm(total=len(texts), desc=f"traces {loaded.name}", disable=not progress) as bar:
        for index, text in enumerate(texts):
            key = trace_key(loaded, text, settings, seed + index, loaded.chat, intervention)
            folder = trace_folder(store, key)
            if (folder / "meta.json").exists():
                os.utime(folder / "meta.json")  # read by this run: not stale (reproduce.remove_stale)
            else:
                trace = generate(loaded, text, settings, seed=seed + index, chat=loaded.chat, progress=False,
                                 intervention=intervention)
                trace.meta["store_key"] = key
                trace.save(folder)
                made += 1
            whole = functools.partial(_whole, loaded, text, settings, seed + index, intervention, key, folder, progress)
            traces.append(StoredTrace(_read(folder, key, whole=False), folder, key, whole))
            bar.update(1)
        bar.set_postfix_str(f"{len(texts) - made} read, {made} generated")
    return traces


def _whole(loaded: LoadedModel, text: str, settings: Settings, seed: int, intervention, key: dict, folder: Path,
           progress: bool) -> Trace:
    """A stored trace with its scores: read when the store holds them, else generated again and saved there."""
    if Trace.has_scores(folder):
        return _read(folder, key, whole=True)
    trace = generate(loaded, text, settings, seed=seed, chat=loaded.chat, progress=progress, intervention=intervention)
    trace.meta["store_key"] = key
    recorded = Trace.load_light(folder)
    # the same canvases: the light record stays as it was (another CPU's last bits in its margins, and its provenance,
    # are no change of content); other canvases (a near-tie decided otherwise here) are this store's trace now
    same = torch.equal(recorded.tokens, trace.tokens) and recorded.text == trace.text
    trace.save(folder, light=not same)
    return _read(folder, key, whole=True) if same else trace


def collect_traces(loaded: LoadedModel, texts: Sequence[str], out: str | Path | None = None, seed: int = 0,
                   intervention=None, progress: bool = True, settings: Settings | None = None) -> list[Trace]:
    """One trace per prompt, as generate makes them: prompt i with seed + i, in the model's own prompt style.

    Args:
        loaded: the LoadedModel to generate with.
        texts: the prompts, as a list of texts.
        out: a trace store (stored_traces): each trace is kept there under the key of what made it as it finishes, and
            a rerun reads it instead of generating it again; a trace of other inputs gets a folder of its own. None:
            kept in memory only.
        seed: the seed of the first prompt (prompt i gets seed + i).
        intervention: a policy applied at every forward, as for generate.
        progress: a progress bar over the prompts.
        settings: the family's settings dataclass; None: loaded.settings_for().

    Returns:
        The traces, in the order of `texts`.
    """
    if out is not None:
        return stored_traces(loaded, texts, out, seed=seed, intervention=intervention, progress=progress,
                             settings=settings)
    if isinstance(texts, (str, bytes)):
        raise BadValue(f"texts={texts!r} is not allowed: texts must be a list of prompts (a single text is one "
                       "prompt: pass [text])")
    settings = loaded.settings_for() if settings is None else loaded.runnable(settings)
    return [generate(loaded, text, settings, seed=seed + index, progress=False, intervention=intervention)
            for index, text in enumerate(tqdm(texts, desc=f"traces {loaded.name}", disable=not progress))]


def _read(folder: Path, key: dict, whole: bool) -> Trace:
    """The stored trace (whole, or its light record), refused if the key it records is not its folder's name's."""
    trace = Trace.load(folder) if whole else Trace.load_light(folder)
    if canonical(trace.meta.get("store_key")) != canonical(key):
        raise BadValue(f"store={str(folder.parent.parent)!r} is not allowed: {folder.relative_to(folder.parent.parent)} "
                       f"holds a trace of other inputs (its store_key is {trace.meta.get('store_key')!r}, its name "
                       f"says {key!r}); delete that folder to generate it again")
    return trace


def stored_measurement(store: str | Path | None, trace: Trace, what: str, params: dict, module: str,
                       measure: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """A measurement of one stored trace that costs forwards (the logit lens: one forward and a softmax over the
    vocabulary per step and layer), kept beside the trace as measured/<what>-<key>.parquet, the key the digest of
    `params`, `what` and the code of `module` (keys.code_of; the trace's own key holds the rest). Read back when it is
    there; otherwise `measure()` and write it. With `store` None, or a trace that is not from a store (no
    store_key in its meta), it is measured and not kept."""
    key = trace.meta.get("store_key")
    if store is None or key is None:
        return measure()
    name = digest({"what": what, "params": params, "code": code_of((module,))})
    path = trace_folder(store, key) / MEASURED / f"{what}-{name}.parquet"
    if path.is_file():
        return pd.read_parquet(path)
    frame = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")  # written whole, then moved into place
    frame.to_parquet(partial)
    os.replace(partial, path)
    return frame
