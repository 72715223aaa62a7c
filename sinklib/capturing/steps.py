"""The step store: one forward of the captured model is one step. While a step runs, each attention layer adds
its scores, masked keys and query count; when it ends they are stacked over layers (a layer that did not run
gets NaN scores) and moved to the store device. Only what was asked for is kept (keep_steps=False: counts; a
capture's names_filter: its layers)."""
from __future__ import annotations

from typing import Sequence

import torch

from sinklib.validation import BadValue, check_int
from sinklib.attention_math import DecodingRows

FIELDS = {"scores": float("nan"), "masked": False, "query_count": float("nan")}  # → fill for a layer that did not run


class StepStore:
    """Finished steps, each {"scores": [layers, batch, heads, keys] float32, "masked": same shape bool,
    "query_count": [layers, batch]}, and the step being recorded."""

    def __init__(self, n_layers: int, store_device: str | torch.device | None, keep_steps: bool,
                 kept: Sequence[int] | None = None) -> None:
        self.n_layers = n_layers
        self.kept = list(range(n_layers)) if kept is None else list(kept)  # the layers stacked, in order
        self._kept = set(self.kept)
        self.store_device = store_device
        self.keep_steps = keep_steps
        self.completed = 0
        self.current: dict | None = None
        self.last: dict | None = None  # the last step ended with keep_last=True, stacked
        self._steps: list[dict] = []

    def begin(self) -> None:
        """Open a new step, empty until its attention layers add to it."""
        self.current = {name: {} for name in FIELDS} | {"layers_ran": set(), "called": set(), "deferred": {}}

    def add(self, layer: int, scores: torch.Tensor | None, masked: torch.Tensor | None,
            query_count: torch.Tensor | None) -> None:
        """One attention layer's result for the step being recorded (scores None: it ran, nothing is kept; a layer
        outside `kept` is only counted as called)."""
        self.current["called"].add(layer)
        if layer not in self._kept:
            return
        self.current["scores"][layer] = scores
        self.current["masked"][layer] = masked
        self.current["query_count"][layer] = query_count

    def defer(self, layer: int, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
        """A decoding row, copied now and scored with the step's other rows of its shape and scale when the step
        ends (attention_math.DecodingRows)."""
        self.current["called"].add(layer)
        self.current["scores"][layer] = None
        shape = (tuple(q.shape), tuple(k.shape), q.device, scale)
        waiting = self.current["deferred"].setdefault(shape, ([], DecodingRows()))
        waiting[0].append(layer)
        waiting[1].add(q, k)

    def settle(self) -> None:
        """Score every decoding row waiting in the step being recorded."""
        for (*_, scale), (layers, rows) in self.current["deferred"].items():
            scores = rows.scores(scale)
            query_count = torch.ones(scores.shape[1], device=scores.device)
            for layer, row_scores in zip(layers, scores):
                self.add(layer, row_scores, None, query_count)
        self.current["deferred"] = {}

    def end(self, keep_last: bool = False) -> dict | None:
        """Close the step being recorded; it counts (and is kept) only if some attention call was seen; keep_last
        also keeps it, stacked, as `last` (whatever keep_steps says). Returns the raw record (None if none was
        open)."""
        if self.current is not None and (self.keep_steps or keep_last):
            self.settle()
        record, self.current = self.current, None
        if record is not None and record["called"]:
            self.completed += 1
            stacked = self._stacked(record) if self.keep_steps or keep_last else None
            if self.keep_steps:
                self._steps.append(stacked)
            if keep_last:
                self.last = stacked
        return record

    def _stacked(self, record: dict) -> dict:
        template = next(iter(record["scores"].values()))
        width = max(value.shape[-1] for value in record["scores"].values())
        stacked = {}
        for name, fill in FIELDS.items():
            shape = template.shape[:1] if name == "query_count" else (*template.shape[:-1], width)
            dtype = torch.bool if name == "masked" else torch.float32
            rows = [record[name].get(index) for index in self.kept]
            if name == "masked" and all(row is None for row in rows):  # nothing masked in any layer: one block
                stacked[name] = torch.zeros((len(self.kept), *shape), dtype=dtype, device=self.store_device or template.device)
                continue
            rows = [torch.full(shape, fill, dtype=dtype, device=template.device) if row is None else row for row in rows]
            stacked[name] = torch.stack(rows) if self.store_device is None else torch.stack(rows).to(self.store_device)
        return stacked

    def require(self) -> None:
        """Raise unless per-step scores are kept (keep_steps=True)."""
        if not self.keep_steps:
            raise BadValue("this capture was opened with keep_steps=False: it kept no per-step scores "
                           "(open it with keep_steps=True to read them)")

    def step(self, step: int, name: str = "scores") -> torch.Tensor:
        """One field of a finished step: [layers, batch, heads, keys] ("scores", "masked") or [layers, batch]
        ("query_count")."""
        self.require()
        return self._steps[check_int(step, "step", 0, self.completed - 1)][name]

    def stack(self, name: str) -> torch.Tensor:
        """[steps, layers, …] of one field; steps with fewer keys (KV-cache decoding) are padded with its fill."""
        self.require()
        if not self._steps:
            raise BadValue("no step was recorded: run a forward pass of the model inside the capture first")
        if name == "query_count":
            return torch.stack([step[name] for step in self._steps])
        width = max(step[name].shape[-1] for step in self._steps)
        return torch.stack([torch.nn.functional.pad(step[name], (0, width - step[name].shape[-1]), value=FIELDS[name])
                            for step in self._steps])
