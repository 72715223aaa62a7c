"""The limits one sandboxed program runs under (SandboxLimits), checked when made.

Where each is enforced: `timeout` by the supervisor's clock (judge.py: the whole process tree is killed at the
deadline) and, as CPU seconds (`ceil(timeout) + 1`), by RLIMIT_CPU; `memory_mb` (address space), `max_file_mb`
(the largest file) and `max_open_files` by resource limits; `max_processes` by RLIMIT_NPROC for a normal user and
by a pids cgroup's pids.max for root, whom the kernel exempts from RLIMIT_NPROC; `max_disk_mb`, everything the
program writes in its directory together, by a private tmpfs of that size for root, else by the supervisor
measuring the directory every 20 ms (confine.py applies all but the clock).

Standard library only, like every module of the sandbox: the supervisor and the confined program load it by path
under `python -I`, without sinklib.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def bad_value(param: str, value, allowed: str) -> ValueError:
    """sinklib.validation.bad_value's message in a plain ValueError (returned, not raised), repeated so that the
    sandbox needs only the standard library: the supervisor loads it by path under `python -I`, without importing
    sinklib (and torch) for every sample.

    Args:
        param: the parameter's name.
        value: the value refused.
        allowed: what the parameter must be.

    Returns:
        The ValueError, "{param}={value!r} is not allowed: {param} must be {allowed}".
    """
    return ValueError(f"{param}={value!r} is not allowed: {param} must be {allowed}")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits. Seconds, megabytes (2**20 bytes) and counts; every field a positive number (the
    counts and sizes integers).

    Raises:
        ValueError: a field that is a bool, not a finite positive number, or (but `timeout`) not an integer.
    """
    timeout: float = 10.0  # wall-clock seconds per program, its tests included
    memory_mb: int = 1024  # address space
    max_processes: int = 16  # processes the program may have at once, itself included
    max_file_mb: int = 16  # largest file it may write
    max_open_files: int = 64
    max_disk_mb: int = 64  # everything it writes in its directory together

    def __post_init__(self):
        for name in ("timeout", "memory_mb", "max_processes", "max_file_mb", "max_open_files", "max_disk_mb"):
            value = getattr(self, name)
            integer = name != "timeout"
            kind = (int,) if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value <= 0:
                raise bad_value(name, value, "a positive integer" if integer else "a positive finite number")
