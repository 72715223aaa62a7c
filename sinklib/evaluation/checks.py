"""The checks every masking result carries (Table 1, notebook 07).

- No-op: a capture whose policy masks nothing changes nothing — the logits of a forward are bit-identical to the
  model's own, and a generation writes the same tokens as one run with no capture at all. Without this, a drop in
  accuracy could be the capture's doing rather than the masking's.
- Mass dropped: the masked keys' score (sum units) with the mask lifted and as the call ran, summed over every call
  of one audited generation. Masking that works takes the attention away (after ≈ 0); a value ablation leaves it
  where it was (after = before) and removes what the keys carry instead. The audited generation's closest decision
  margin is kept beside, so that a rerun elsewhere knows when its audit may have taken another path.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sinklib.capturing import capture
from sinklib.evaluation.records import CHECKS, read_run
from sinklib.evaluation.runner import write_checks
from sinklib.generation import encode, generate
from sinklib.interventions import Audited, MaskSinks
from sinklib.loading import LoadedModel
from sinklib.ties import smallest_margin


@torch.no_grad()
def noop_check(loaded: LoadedModel, prompt: str, settings: Any, chat: bool, seed: int = 0) -> bool:
    """Whether a capture with a policy that masks nothing (MaskSinks(top_k=0)) leaves the model's output bit for bit
    as it is: the logits of one forward over the prompt, and every token of a generation against one made with no
    capture (the sampler's decisions)."""
    ids = torch.tensor([encode(loaded, prompt, chat)], device=loaded.device)
    plain = loaded.logits(ids)
    with capture(loaded, intervention=MaskSinks(top_k=0)):
        captured = loaded.logits(ids)
    uncaptured = generate(loaded, prompt, settings, seed=seed, chat=chat, progress=False, keep_scores=False)
    watched = generate(loaded, prompt, settings, seed=seed, chat=chat, progress=False, intervention=MaskSinks(top_k=0))
    return bool(torch.equal(plain, captured)) and bool(torch.equal(uncaptured.tokens, watched.tokens))


def mass_dropped(loaded: LoadedModel, prompt: str, intervention, settings: Any, chat: bool,
                 seed: int = 0) -> dict[str, float]:
    """One generation of `prompt` under `intervention`, audited (interventions.Audited): masked (batch, head, key)
    entries, their summed score with the mask lifted (`masked_score_before`) and as the calls ran
    (`masked_score_after`), the share of it that stayed (`kept_share`: ~0 for masking, 1 for value ablation;
    NaN when nothing was masked), and the generation's closest decision margin (`audit_margin`, ties.smallest_margin;
    NaN where none was recorded): where it is a near-tie, another CPU's audit may follow another path and mask
    other entries (agreement.compare_file allows that, within AUDIT_SHIFT)."""
    audited = Audited(intervention)
    trace = generate(loaded, prompt, settings, seed=seed, chat=chat, progress=False, intervention=audited,
                     keep_scores=False)
    ledger = audited.ledger
    before, after = ledger["before"], ledger["after"]
    margin = smallest_margin(trace)
    return {"masked_entries": ledger["masked"], "masked_score_before": before, "masked_score_after": after,
            "kept_share": after / before if before > 0 else float("nan"),
            "audit_margin": float("nan") if margin is None else margin}


CHECK_COLUMNS = ["noop_identical", "masked_entries", "masked_score_before", "masked_score_after", "kept_share",
                 "audit_margin"]
UNMASKED = {"masked_entries": 0, "masked_score_before": 0.0, "masked_score_after": 0.0, "kept_share": float("nan"),
            "audit_margin": float("nan")}  # what the unmasked condition drops: nothing


class Audit:
    """The checks of one model's Table 1 rows: the no-op check once, the mass each condition's policy drops on the
    task's first sample. A run written to a file keeps its checks in its header (runner.write_checks), so a finished
    table is read back without running the model."""

    def __init__(self, loaded: LoadedModel, spec: Any, settings: Any, seed: int):
        self.loaded, self.settings, self.seed, self.chat = loaded, settings, seed, spec.chat
        self.prompt = spec.samples()[0].prompt
        self._noop: bool | None = None

    def of(self, intervention, run_file: Path | None) -> dict:
        """The row's check columns for this condition's policy (None: the unmasked condition, nothing dropped),
        read from the header of `run_file` when an earlier run wrote them there."""
        header = read_run(run_file)[0] if run_file is not None and run_file.is_file() else None
        saved = (header or {}).get(CHECKS) or {}
        if all(column in saved for column in CHECK_COLUMNS):
            return {column: saved[column] for column in CHECK_COLUMNS}
        # none written yet, or written before a check column existed (audit_margin): this run's own checks made again
        if self._noop is None:
            self._noop = noop_check(self.loaded, self.prompt, self.settings, self.chat, self.seed)
        dropped = dict(UNMASKED) if intervention is None else \
            mass_dropped(self.loaded, self.prompt, intervention, self.settings, self.chat, self.seed)
        checks = {"noop_identical": self._noop, **dropped}
        if header is not None:
            write_checks(run_file, checks)
        return checks
