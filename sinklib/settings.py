"""What a settings object is, wherever settings pass (generate, collect_traces, LoadedModel.settings_for, the run
configs): a family's frozen settings dataclass — LLaDASettings, DreamSettings, ARMSettings or a registered family's —
which carries at least the generation's layout. The classes do not inherit from Settings: they are it structurally."""
from __future__ import annotations

from typing import Protocol, runtime_checkable


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
