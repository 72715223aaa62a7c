"""The Trace: what one generation did and what its attention looked like at every step.

Shapes (one prompt; padding already removed):
  scores       [steps, layers, heads, seq] float32, sum units (Σ over queries); NaN where a key did not
               exist yet (autoregressive steps before that token was written); None when generated with
               keep_scores=False
  tokens       [steps + 1, seq] int64: the canvas before each step, and at the end
  is_masked    [steps, seq] bool: still masked (diffusion) / not yet written (autoregressive) at that step
  unmasked_at  [seq] int64: the step whose forward committed each position; −1 for prompt positions and
               positions never committed
  masked_keys  [steps, layers, heads, seq] bool or None: keys the intervention masked
  maps         {(step, layer, head): [queries, keys] float32}
  margins      [steps] float64 or None: each step's decision margin, the relative gap by which the sampler's
               choice (argmax token, top-k confident positions) beat the best alternative; NaN for sampled
               decisions. Another CPU may decide differently only where this is within float rounding.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from sinklib.digest import digest as _digest, file_sha256 as sha256_of
from sinklib.families.base import get_family
from sinklib.validation import BadValue


@dataclass
class Trace:
    """One generation: its scores at every step, its canvases, masked keys, kept maps and decision margins.

    Shapes are for one prompt, padding removed (the module docstring lists them with their units). Made by
    sinklib.generate; saved and read back with save / load (each file's SHA-256 checked).

    Attributes:
        scores: [steps, layers, heads, seq] float32 in sum units (Σ over queries); NaN where a key did not exist yet;
            None when generated with keep_scores=False.
        tokens: [steps + 1, seq] int64: the canvas before each step, and at the end.
        is_masked: [steps, seq] bool: still masked (diffusion) / not yet written (autoregressive) at that step.
        prompt_len: prompt tokens at the start of the canvas.
        layer_names: the attention modules' paths, one per layer.
        text: the generated text.
        masked_keys: [steps, layers, heads, seq] bool, the keys the intervention masked; None without one.
        maps: {(step, layer, head): [queries, keys] float32} the full attention maps asked for.
        token_strings: token id → its text.
        meta: how it was made (model, family, kind, sampler settings, seed, intervention, prompt, versions).
        margins: [steps] float64: each step's decision margin (the relative gap by which the sampler's choice beat the
            best alternative; NaN for sampled decisions); None when not recorded.
        recomputed: [steps, seq] bool: the positions each step's forward computed (a cached sampler's window; a
            cached step's scores sum over those query rows only); None: all of them.
    """

    scores: torch.Tensor | None
    tokens: torch.Tensor
    is_masked: torch.Tensor
    prompt_len: int
    layer_names: list[str]
    text: str = ""
    masked_keys: torch.Tensor | None = None
    maps: dict[tuple[int, int, int], torch.Tensor] = field(default_factory=dict)
    token_strings: dict[int, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    margins: torch.Tensor | None = None
    # [steps, seq] bool: the positions each step's forward computed (a cached sampler's window); None: all of them.
    # A cached step's scores sum over the computed query rows only (the rest attended with reused keys).
    recomputed: torch.Tensor | None = None

    @property
    def n_steps(self) -> int:
        """Steps (forwards) of the generation: one fewer than the canvases in `tokens`."""
        return self.tokens.shape[0] - 1

    @property
    def is_autoregressive(self) -> bool:
        """Whether the family that made it decodes left to right, one query row per step after the prompt: its
        kind, recorded at generation (for a trace saved before kinds were recorded: its family is not a diffusion
        one, Family.is_diffusion)."""
        kind = self.meta.get("kind")
        if kind is None and self.meta.get("family"):
            return not get_family(self.meta["family"]).is_diffusion
        return kind == "autoregressive"

    def require_scores(self) -> torch.Tensor:
        """The scores, or a clear error for a trace generated with keep_scores=False."""
        if self.scores is None:
            raise BadValue("this Trace has no attention scores: it was generated with keep_scores=False "
                           "(generate again with keep_scores=True to analyse its attention)")
        return self.scores

    @property
    def unmasked_at(self) -> torch.Tensor:
        """[seq] int64: the step whose forward committed each position; −1 for prompt positions and positions
        never committed."""
        written = self.is_masked & ~_next_masked(self.tokens, self.is_masked)
        steps = torch.arange(self.n_steps)[:, None].expand_as(written)
        first = torch.where(written, steps, torch.full_like(steps, self.n_steps)).amin(0)
        return torch.where(first == self.n_steps, torch.full_like(first, -1), first)

    def token_text(self, token_id: int) -> str:
        """The token's text, or its id where the tokenizer has none (ids past a tokenizer in a padded vocabulary)."""
        text = self.token_strings.get(int(token_id))
        return str(int(token_id)) if text is None else text

    def to_frame(self, steps=None, layers=None, heads=None) -> pd.DataFrame:
        """Tidy scores: one row per (step, layer, head, position) with the token at that position and step.
        Filter with lists of steps / layers / heads to keep it small."""
        scores = self.require_scores()
        s_idx = _pick(steps, scores.shape[0], "steps")
        l_idx = _pick(layers, scores.shape[1], "layers")
        h_idx = _pick(heads, scores.shape[2], "heads")
        block = scores[s_idx][:, l_idx][:, :, h_idx]
        grid = np.meshgrid(s_idx, l_idx, h_idx, np.arange(block.shape[-1]), indexing="ij")
        frame = pd.DataFrame({"step": grid[0].ravel(), "layer": grid[1].ravel(), "head": grid[2].ravel(),
                              "position": grid[3].ravel(), "score": block.numpy().ravel()})
        canvas = self.tokens[:-1].numpy()
        frame["token_id"] = canvas[frame["step"].to_numpy(), frame["position"].to_numpy()]
        frame["token"] = frame["token_id"].map(self.token_text)
        frame["is_masked"] = self.is_masked.numpy()[frame["step"].to_numpy(), frame["position"].to_numpy()]
        frame["is_prompt"] = frame["position"] < self.prompt_len
        return frame.dropna(subset=["score"]).reset_index(drop=True)

    # -- persistence: parquet for tensors, json for metadata ----------------------------------------
    def save(self, path: str | Path, light: bool = True) -> Path:
        """Write the trace to a folder in two parts: its light record (canvas.parquet, and meta.json with its
        checksum) and its scores (scores.parquet, maps.parquet and their checksums in scores.json). The light record
        is what a reader of a store needs to know what was generated (canvases, margins, text); the scores are what
        an analysis reads, and a store may keep them as a cache (trace_store). Over an existing trace the new files
        are written beside the old ones first and only then moved into place, meta.json last: a full disk or an
        interruption leaves the old trace readable. A folder holding anything but a trace's files is refused.
        `light` False writes the scores alone, beside a light record already there (it is left as it is)."""
        scores = self.require_scores()
        folder = Path(path)
        _check_trace_folder(folder)
        folder.mkdir(parents=True, exist_ok=True)
        written: dict[str, Path] = {}
        try:
            for name, write in self._writers(scores).items():
                if light or name in _HEAVY_FILES:
                    written[name] = _fresh_file(folder, name)
                    write(written[name])
            contents = {_HEAVY_RECORD: {"format": FORMAT,
                                        "sha256": {name: sha256_of(written[name]) for name in _HEAVY_FILES}}}
            if light:
                meta = contents["meta.json"] = self._meta(scores)
                meta["sha256"] = {name: sha256_of(written[name]) for name in _LIGHT_FILES}
                meta["sha256"]["meta.json"] = _sha256_meta(meta)
            for name, content in contents.items():
                written[name] = _fresh_file(folder, name)
                written[name].write_text(json.dumps(content, indent=1, sort_keys=True))
            for name in (*_HEAVY_FILES, _HEAVY_RECORD, *_LIGHT_FILES, "meta.json"):  # meta.json last: complete
                if name in written:
                    os.replace(written.pop(name), folder / name)
        finally:
            for leftover in written.values():  # ours: partial files of this save
                leftover.unlink(missing_ok=True)
        return folder

    def _writers(self, scores: torch.Tensor) -> dict:
        steps, layers, heads, seq = scores.shape
        step, layer, head = np.meshgrid(np.arange(steps), np.arange(layers), np.arange(heads), indexing="ij")
        columns = {"step": step.ravel(), "layer": layer.ravel(), "head": head.ravel(),
                   "scores": _fixed_list(scores.reshape(-1, seq).numpy(), pa.float32())}
        if self.masked_keys is not None:
            columns["masked"] = _fixed_list(self.masked_keys.reshape(-1, seq).numpy(), pa.bool_())
        canvas = {"step": np.arange(self.tokens.shape[0]), "tokens": _fixed_list(self.tokens.numpy(), pa.int64()),
                  "is_masked": _fixed_list(np.concatenate([self.is_masked.numpy(), np.zeros((1, seq), bool)]), pa.bool_())}
        if self.margins is not None:  # one per step; the final canvas has no decision after it
            canvas["margin"] = np.append(self.margins.numpy(), np.nan)
        if self.recomputed is not None:  # likewise: no forward after the final canvas
            canvas["recomputed"] = _fixed_list(np.concatenate([self.recomputed.numpy(), np.zeros((1, seq), bool)]),
                                               pa.bool_())
        keys = sorted(self.maps)
        maps = pa.table({"step": [k[0] for k in keys], "layer": [k[1] for k in keys], "head": [k[2] for k in keys],
                         "rows": [int(self.maps[k].shape[0]) for k in keys],
                         "map": [self.maps[k].numpy().ravel().tolist() for k in keys]},
                        schema=pa.schema([("step", pa.int64()), ("layer", pa.int64()), ("head", pa.int64()),
                                          ("rows", pa.int64()), ("map", pa.list_(pa.float32()))]))
        return {"scores.parquet": lambda target: pq.write_table(pa.table(columns), target),
                "canvas.parquet": lambda target: pq.write_table(pa.table(canvas), target),
                "maps.parquet": lambda target: pq.write_table(maps, target)}

    def _meta(self, scores: torch.Tensor) -> dict:
        steps, layers, heads, seq = scores.shape
        return {"prompt_len": self.prompt_len, "layer_names": self.layer_names, "text": self.text,
                "token_strings": {str(k): v for k, v in self.token_strings.items()}, "meta": _to_json(self.meta),
                "shape": [steps, layers, heads, seq], "has_masked_keys": self.masked_keys is not None,
                "format": FORMAT}

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a folder written by save(), refusing one whose files were changed or cut since (each file's
        SHA-256 is in meta.json or scores.json) or whose tables do not have the shape meta.json declares."""
        folder = Path(path)
        meta = _read_meta(folder)
        _verify(folder, meta, _read_heavy(folder))
        steps, layers, heads, seq = meta["shape"]
        table = pq.read_table(folder / "scores.parquet")
        _expect(folder, "scores.parquet", table, steps * layers * heads, seq, "scores")
        expected = np.meshgrid(np.arange(steps), np.arange(layers), np.arange(heads), indexing="ij")
        for name, grid in zip(("step", "layer", "head"), expected):
            if not np.array_equal(table[name].to_numpy(), grid.ravel()):
                raise BadValue(f"path={str(path)!r} is not a consistent Trace: scores.parquet's {name} column does not "
                               f"match the shape {meta['shape']} in meta.json")
        scores = torch.from_numpy(_unlist(table["scores"], np.float32, seq)).reshape(steps, layers, heads, seq)
        masked = None
        if meta["has_masked_keys"]:
            masked = torch.from_numpy(_unlist(table["masked"], np.bool_, seq)).reshape(steps, layers, heads, seq)
        maps = {}
        for row in pq.read_table(folder / "maps.parquet").to_pylist():
            flat = torch.tensor(row["map"], dtype=torch.float32)
            if row["rows"] < 1 or flat.numel() % row["rows"]:
                raise BadValue(f"path={str(path)!r} is not a consistent Trace: map {row['step'], row['layer'], row['head']} "
                               f"has {flat.numel()} values for {row['rows']} rows")
            maps[(row["step"], row["layer"], row["head"])] = flat.reshape(row["rows"], -1)
        light = cls.load_light(folder)
        light.scores, light.masked_keys, light.maps = scores, masked, maps
        return light

    @classmethod
    def load_light(cls, path: str | Path) -> "Trace":
        """The light record of a saved trace (has_scores tells whether its scores are there too): canvases,
        margins, text and meta, checked against meta.json's checksums; scores None, no maps."""
        folder = Path(path)
        meta = _read_meta(folder)
        _verify(folder, meta)
        steps, _, _, seq = meta["shape"]
        canvas = pq.read_table(folder / "canvas.parquet")
        _expect(folder, "canvas.parquet", canvas, steps + 1, seq, "tokens")
        return cls(scores=None, prompt_len=meta["prompt_len"], layer_names=meta["layer_names"], text=meta["text"],
                   token_strings={int(k): v for k, v in meta["token_strings"].items()}, meta=_from_json(meta["meta"]),
                   **_canvas_fields(canvas, seq))

    @staticmethod
    def has_scores(path: str | Path) -> bool:
        """Whether a saved trace's folder holds its scores too (scores.json, written with them), not only its
        light record."""
        return (Path(path) / _HEAVY_RECORD).is_file()


def _read_meta(folder: Path) -> dict:
    if not (folder / "meta.json").exists():
        raise FileNotFoundError(f"path={str(folder)!r} is not a saved Trace (no meta.json in it)")
    try:
        return json.loads((folder / "meta.json").read_text())
    except ValueError as error:
        raise BadValue(f"path={str(folder)!r} is not a readable Trace: meta.json is not valid JSON ({error})") from None


def _read_heavy(folder: Path) -> dict:
    """The checksums of a trace's scores (scores.json), refused when missing or unreadable."""
    try:
        heavy = json.loads((folder / _HEAVY_RECORD).read_text())
    except FileNotFoundError:
        raise BadValue(f"path={str(folder)!r} holds a Trace's light record only: its scores ({_HEAVY_RECORD}, "
                       f"{', '.join(_HEAVY_FILES)}) are not there; generate it again") from None
    except ValueError as error:
        raise BadValue(f"path={str(folder)!r} is not a readable Trace: {_HEAVY_RECORD} is not valid JSON ({error})") \
            from None
    return heavy.get("sha256") if isinstance(heavy, dict) else None


def _canvas_fields(canvas: pa.Table, seq: int) -> dict:
    """tokens, is_masked, margins and recomputed from canvas.parquet (one row per canvas, the last one final)."""
    columns = canvas.column_names
    return {"tokens": torch.from_numpy(_unlist(canvas["tokens"], np.int64, seq)),
            "is_masked": torch.from_numpy(_unlist(canvas["is_masked"], np.bool_, seq))[:-1],
            "margins": torch.from_numpy(canvas["margin"].to_numpy()[:-1].copy()) if "margin" in columns else None,
            "recomputed": torch.from_numpy(_unlist(canvas["recomputed"], np.bool_, seq))[:-1]
            if "recomputed" in columns else None}


# 2: SHA-256 of every file in meta.json, tuples and non-string keys kept in meta. 3: the light record (meta.json,
# canvas.parquet) and the scores (scores.parquet, maps.parquet, their checksums in scores.json) apart.
FORMAT = 3
_LIGHT_FILES = ("canvas.parquet",)
_HEAVY_FILES = ("scores.parquet", "maps.parquet")
_HEAVY_RECORD = "scores.json"
_DATA_FILES = (*_HEAVY_FILES, *_LIGHT_FILES)


def _check_trace_folder(folder: Path) -> None:
    """A trace is saved into a new folder, an empty one, or over a saved trace — never over other files."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise BadValue(f"path={str(folder)!r} is not allowed: a Trace is saved into a folder (this is a file or a symlink)")
    if folder.is_dir():
        # measured/: what a store measured of the trace (trace_store.stored_measurement), kept beside it
        foreign = sorted(p.name for p in folder.iterdir() if p.name not in (*_DATA_FILES, _HEAVY_RECORD, "meta.json")
                         and not (p.name == "measured" and p.is_dir())
                         and not (p.name.startswith(".") and p.name.endswith(".partial")))  # an interrupted save's
        if foreign:
            raise BadValue(f"path={str(folder)!r} is not allowed: it holds files that are not a Trace's ({foreign[:3]}); "
                           "save into a new or empty folder")


def _fresh_file(folder: Path, name: str) -> Path:
    """A new, empty file of ours beside `name` (created exclusively: never an existing file or a symlink)."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=folder)
    os.close(descriptor)
    return Path(temporary)




def _sha256_meta(meta: dict) -> str:
    """The digest of meta.json's content other than the meta.json digest itself."""
    body = {**meta, "sha256": {k: v for k, v in meta.get("sha256", {}).items() if k != "meta.json"}}
    return _digest(body, length=None)


def _verify(folder: Path, meta: dict, heavy: dict | None = None) -> None:
    """Every file of the light record (and, given `heavy`, scores.json's checksums, of the scores) matches its
    SHA-256."""
    digests = meta.get("sha256") if isinstance(meta, dict) else None
    if not isinstance(digests, dict) or meta.get("format") != FORMAT:
        raise BadValue(f"path={str(folder)!r} is not a verifiable Trace: meta.json has no checksums or another format "
                       f"than {FORMAT} (written by an older sinklib, or edited); generate it again")
    if digests.get("meta.json") != _sha256_meta(meta):
        raise BadValue(f"path={str(folder)!r} is a damaged Trace: meta.json was changed after it was written")
    files = {**{name: digests.get(name) for name in _LIGHT_FILES}, **({} if heavy is None else
                                                                       {name: heavy.get(name) for name in _HEAVY_FILES})}
    if heavy is not None and not isinstance(heavy, dict):
        raise BadValue(f"path={str(folder)!r} is a damaged Trace: {_HEAVY_RECORD} holds no checksums")
    for name, expected in files.items():
        if not (folder / name).exists():
            raise BadValue(f"path={str(folder)!r} is an incomplete Trace: {name} is missing")
        if sha256_of(folder / name) != expected:
            raise BadValue(f"path={str(folder)!r} is a damaged Trace: {name} does not match its SHA-256 "
                           "(changed or cut after it was written)")


def _expect(folder: Path, name: str, table: pa.Table, rows: int, width: int, column: str) -> None:
    list_width = getattr(table.schema.field(column).type, "list_size", None)
    if table.num_rows != rows or list_width != width:
        raise BadValue(f"path={str(folder)!r} is not a consistent Trace: {name} holds {table.num_rows} rows of "
                       f"{list_width} values, meta.json's shape needs {rows} of {width}")


def _to_json(value: Any) -> Any:
    """JSON that keeps tuples and non-string dict keys (plain json turns both into something else)."""
    if isinstance(value, tuple):
        return {"__tuple__": [_to_json(v) for v in value]}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and "__tuple__" not in value and "__items__" not in value:
            return {k: _to_json(v) for k, v in value.items()}
        return {"__items__": [[_to_json(k), _to_json(v)] for k, v in value.items()]}
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_from_json(v) for v in value["__tuple__"])
        if set(value) == {"__items__"}:
            return {_hashable(_from_json(k)): _from_json(v) for k, v in value["__items__"]}
        return {k: _from_json(v) for k, v in value.items()}
    return value


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def _next_masked(tokens: torch.Tensor, is_masked: torch.Tensor) -> torch.Tensor:
    """is_masked shifted one step on: whether each position is still masked after each step."""
    after = torch.zeros_like(is_masked)
    after[:-1] = is_masked[1:]
    return after


def _pick(selection, size: int, param: str) -> list[int]:
    if selection is None:
        return list(range(size))
    if isinstance(selection, (int, str)) or \
            not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in selection):
        raise BadValue(f"{param}={selection!r} is not allowed: {param} must be a list of integers in 0..{size - 1}")
    picked = [int(i) for i in selection]
    bad = [i for i in picked if not 0 <= i < size]
    if bad:
        raise BadValue(f"{param}={bad} is not allowed: {param} must lie in 0..{size - 1}")
    return picked


def _fixed_list(array: np.ndarray, value_type: pa.DataType) -> pa.FixedSizeListArray:
    values = pa.array(np.ascontiguousarray(array).ravel(), type=value_type)
    return pa.FixedSizeListArray.from_arrays(values, array.shape[-1])


def _unlist(column: pa.ChunkedArray, dtype, width: int) -> np.ndarray:
    flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return np.array(flat, dtype=dtype).reshape(-1, width)  # a writable copy
