"""What a settings object is, wherever settings pass (generate, collect_traces, LoadedModel.settings_for, the run
configs): a family's frozen settings dataclass — LLaDASettings, DreamSettings, ARMSettings or a registered family's —
which carries at least the generation's layout and says what a run with it is keyed by. The classes do not inherit
from Settings: they are it structurally (record() comes from sinklib.families.base.FamilySettings, which every
family's settings dataclass inherits)."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Settings(Protocol):
    """A family's sampling settings (a frozen dataclass, checked when it is made).

    Attributes:
        steps: denoising steps over the generation (None for an autoregressive family: one forward per token).
        gen_length: tokens generated after the prompt.
    """

    @property
    def steps(self) -> int | None: ...

    @property
    def gen_length(self) -> int: ...

    def record(self) -> dict[str, Any]:
        """What a run with these settings is keyed by: every field but the special ids (families.base.record)."""
        ...
