"""Regenerate every figure: execute the numbered notebooks headlessly with papermill.

    python -m sinklib.reproduce                                   # the tiny zoo on CPU (the default)
    python -m sinklib.reproduce --params notebooks/params/paper-llada.yaml   # a real checkpoint on a GPU
    python -m sinklib.reproduce --check                           # rerun elsewhere, compare with the committed

Notebooks run two at a time on a CPU (each kernel with one torch thread; --jobs N), each after the notebooks whose
stores it reads (RunConfig.READS_FROM), the slowest ready one first. The default run executes the notebooks in
place (they are committed with their outputs); any other run writes executed copies to notebooks/executed/.
Figures go to figures/ (PNG + PDF); numbers to data/results/. A run on models outside the zoo writes into
figures/<model names>/ and data/results/<model names>/ unless the parameters name figures_dir / results_dir.
Unknown or mistyped parameters are refused before anything runs.
With --check nothing in the checkout is written: the notebooks run into a temporary folder and each results
file is compared with the committed one (sinklib.lab.agreement); the exit status says whether they agree.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

try:  # the notebooks extra: papermill runs them (nbformat, a dependency of it, edits them), and their figures need matplotlib
    import importlib.util

    if importlib.util.find_spec("papermill") is None:  # found now, imported where a notebook runs (3.7 s of import
        raise ModuleNotFoundError("No module named 'papermill'", name="papermill")  # a refused argument need not wait)

    from tqdm.auto import tqdm

    from sinklib.lab.runs import run_for
except ModuleNotFoundError as missing:
    raise ImportError(f"sinklib.reproduce runs the notebooks, which need the notebooks extra ({missing.name} is "
                      "missing): pip install -e '.[notebooks]'") from missing

from sinklib.lab import agreement
from sinklib.lab.agreement_notebooks import compare_notebook
from sinklib.lab.notebook_outputs import strip_volatile
from sinklib.validation import BadValue, did_you_mean
from sinklib.model_names import is_default_model, resolve_name
from sinklib.paths import DATA_DIR, INSTALLED, NOTEBOOKS
from sinklib.lab.stores import COMMITTED_RUNS, committed_version, regenerated_stores, remove_stale, seed_committed_runs

ROOT = Path(__file__).resolve().parents[2]  # the checkout: sinklib/lab/reproduce.py → ../../


TUTORIAL = NOTEBOOKS / "00_what_is_an_attention_sink.ipynb"


def notebook_paths(only: list[str] | None = None) -> list[Path]:
    """The figure notebooks (01, 02, …), in order; `only` keeps those whose names start with a given prefix. The
    tutorial (00) is not one of them: it takes no run parameters (the default run executes it too)."""
    paths = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if p != TUTORIAL)
    if only is not None and (isinstance(only, str) or not only or not all(isinstance(p, str) and p for p in only)):
        raise BadValue(f"only={only!r} is not allowed: only must be a non-empty list of notebook prefixes such as "
                       "['01', '03'] (None: every notebook)")
    if only:
        paths = [p for p in paths if any(p.name.startswith(prefix) for prefix in only)]
        if not paths:
            have = [p.name for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))]
            raise BadValue(f"only={only!r} is not allowed: no notebook starts with it (have {have})")
    return paths


def declared_parameters(paths: list[Path]) -> dict[str, Any]:
    """name → default over the notebooks' run configs (sinklib.lab.runs: a config's fields are its notebook's
    parameters, their defaults read from its parameters cell)."""
    declared: dict[str, Any] = {}
    for path in paths:
        defaults = run_for(path)()
        for name in defaults.parameter_names():
            declared.setdefault(name, getattr(defaults, name))
    return declared


def check_parameters(given: dict[str, Any], paths: list[Path]) -> None:
    """Refuse, before anything runs, a key no notebook declares; say on stderr which keys none of the selected
    notebooks declares (a parameter file for every notebook may be run with --only, but `--params {eps: 2.0}
    --only 03` changes nothing: notebook 03 sweeps eps_values); then build each selected notebook's run config from
    the given values: its declared types, ranges and cross-field rules (sinklib.lab) refuse a bad value naming it."""
    every = notebook_paths()
    declared = declared_parameters(every)
    selected = declared_parameters(paths)
    for key in given:
        if key not in declared:
            raise BadValue(f"parameter {key!r} is not allowed: no notebook declares it{did_you_mean(key, declared)}; "
                           f"allowed: {sorted(declared)}")
    unused = [key for key in given if key not in selected]
    if unused:
        owners = {key: " ".join(path.stem[:2] for path in every if key in run_for(path).parameter_names())
                  for key in unused}
        described = ", ".join(f"{key} (notebooks {where})" for key, where in owners.items())
        print(f"note: {described}: not a parameter of notebooks {' '.join(p.stem[:2] for p in paths)}, so it changes "
              "nothing in this run", file=sys.stderr)
    for path in paths:
        run_for(path)(**parameters_for(path, given))


def check_model_names(given: dict[str, Any], paths: list[Path] | None = None) -> None:
    """Every model a run names must resolve (zoo name, existing folder, reachable or cached hub id) before the
    first notebook starts: a typo would otherwise fail an hour in, or not at all. With `paths`, the models those
    notebooks run by default resolve too: a named model (SmolLM2) is converted here, once, before notebooks that run
    side by side would each convert it into the same folder."""
    names = list(given.get("models") or []) + ([given["model"]] if given.get("model") else [])
    if not names and paths:
        names = [name for path in paths for name in getattr(run_for(path)(), "models", [])]
    for name in dict.fromkeys(names):
        if not isinstance(name, str):
            raise BadValue(f"parameter models={given.get('models')!r} is not allowed: models are names (str), "
                           f"got {name!r}")
        resolve_name(name)


UNCHANGING = ("progress", "figures_dir", "results_dir")  # parameters that change where or how visibly, not what


def output_folders(given: dict[str, Any]) -> dict[str, str]:
    """Where a run writes unless told otherwise, never over the committed outputs: runs on models outside the zoo
    into figures/<models>/ and data/results/<models>/; runs of the default models with any other parameter value
    (eps 2.0, 50 prompts) into figures/custom-<hash of those values>/ and data/results/custom-<hash>/; the default
    run ({}) into figures/ and data/results/."""
    names = list(given.get("models") or []) + ([given["model"]] if given.get("model") else [])
    if names and not all(is_default_model(n) for n in names):
        slug = "+".join(dict.fromkeys(Path(str(n).rstrip("/")).name for n in names))
    else:
        declared = declared_parameters(notebook_paths())
        changed = {k: v for k, v in given.items() if k not in UNCHANGING and (k not in declared or declared[k] != v)}
        if not changed:
            return {}
        slug = "custom-" + hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return {"figures_dir": str(ROOT / "figures" / slug), "results_dir": str(ROOT / "data" / "results" / slug)}


def parameters_for(path: Path, given: dict[str, Any]) -> dict[str, Any]:
    """The given parameters that this notebook declares (a `models` list also fills a single `model`)."""
    declared = set(run_for(path).parameter_names())
    params = {k: v for k, v in given.items() if k in declared}
    if "model" in declared and "model" not in given and given.get("models"):
        params["model"] = given["models"][0]
    return params


def run(params: dict[str, Any] | None = None, out: Path | None = None, only: list[str] | None = None,
        figures_dir: Path | None = None, results_dir: Path | None = None, progress: bool = True,
        remake_long_runs: bool = False, jobs: int | None = None) -> list[Path]:
    """Execute the figure notebooks (execute_all: `jobs` at a time, each after those it reads from); returns the
    executed notebooks' paths, in notebook order.

    The default run (no parameters, no folders) executes each notebook in place, the tutorial too: their outputs
    are committed so that a reader sees the figures on GitHub, and it then removes what no notebook read any more
    (remove_stale). Every run reads the stores (STORED) under their keys and makes only what is not there. Any other run
    writes executed copies to `out` (notebooks/executed/). `remake_long_runs`: the default run also makes the long
    runs (COMMITTED_RUNS: the twins' Table 1 at n = 200, about 2.5 hours on one core for the diffusion twin; the
    long traces, about 4 minutes) again instead of reading them. `jobs`: notebooks at a time, None for
    default_jobs (2 on a CPU, 1 on another device)."""
    given = dict(params or {})
    paths = notebook_paths(only)
    jobs = default_jobs(given) if jobs is None else jobs
    custom = bool(only or params or out is not None or figures_dir is not None or results_dir is not None)
    _check_run_options(jobs, remake_long_runs, custom)
    check_parameters(given, paths)
    check_model_names(given, paths)
    if INSTALLED:  # the wheel's notebooks and results are read, never written: everything goes under `out`
        if out is None:
            raise BadValue("out=None is not allowed: an installed sinklib runs its notebooks into a folder of "
                           "yours (python -m sinklib.reproduce --out DIR)")
        figures_dir = figures_dir or Path(out) / "figures"
        results_dir = results_dir or Path(out) / "data" / "results"
        seed_committed_runs(Path(results_dir))
    in_place = out is None and not given and figures_dir is None and results_dir is None
    given = {**output_folders(given), **given}
    if figures_dir is not None:
        given["figures_dir"] = str(Path(figures_dir).resolve())
    if results_dir is not None:
        given["results_dir"] = str(Path(results_dir).resolve())
    out = NOTEBOOKS if in_place else Path(out or NOTEBOOKS / "executed")
    out.mkdir(parents=True, exist_ok=True)
    runs = [Execution.of(path, out / path.name, parameters_for(path, given)) for path in paths]
    if in_place and not only:  # the default run (`make figures`) also refreshes the tutorial's committed outputs
        runs.append(Execution.of(TUTORIAL, TUTORIAL, {}))
    started = time.time()
    # every run reads the stores under their keys (nothing whose inputs did not change is made again); the default
    # run of every notebook then removes what it no longer read; --remake-long-runs makes the long runs again
    with regenerated_stores(DATA_DIR / "results", COMMITTED_RUNS) if remake_long_runs else contextlib.nullcontext():
        executed = execute_all(runs, jobs, progress)
    if in_place and not only:
        remove_stale(DATA_DIR / "results", started)
    return executed


def _check_run_options(jobs: Any, remake_long_runs: Any, custom: bool) -> None:
    """jobs a whole number >= 1; remake_long_runs a real bool, True only for the default run of every notebook."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise BadValue(f"jobs={jobs!r} is not allowed: jobs must be a whole number >= 1 (notebooks run at once)")
    if remake_long_runs is not False and (remake_long_runs is not True or custom):
        raise BadValue(f"remake_long_runs={remake_long_runs!r} is not allowed here: only the default run of every "
                       "notebook (python -m sinklib.reproduce --remake-long-runs, no other option) makes the long "
                       "runs again, since it remakes everything that reads them")


def default_jobs(given: dict[str, Any]) -> int:
    """Notebooks at a time: 2 on a CPU (each kernel one torch thread: this project's 2-core machines), 1 when the
    parameters name another device (an 8B model fills a GPU's memory)."""
    return 2 if str(given.get("device", "cpu")) == "cpu" else 1


@dataclass(frozen=True)
class Execution:
    """One notebook of a run: which, where its executed copy goes, its parameters, the notebooks whose stores it reads
    (stems) and about how long it takes with its stores made again (seconds, one torch thread)."""
    path: Path
    target: Path
    parameters: dict[str, Any]
    reads_from: tuple[str, ...] = ()
    seconds: int = 20

    @classmethod
    def of(cls, path: Path, target: Path, parameters: dict[str, Any]) -> "Execution":
        """A figure notebook's execution, its order read from its run config (READS_FROM, SECONDS_TO_REGENERATE);
        the tutorial reads no store."""
        if path == TUTORIAL:
            return cls(path, target, parameters)
        config = run_for(path)
        return cls(path, target, parameters, config.READS_FROM, config.SECONDS_TO_REGENERATE)


def waits_for(runs: list[Execution]) -> dict[Path, list[Path]]:
    """Which notebooks each one starts after: the notebooks whose stores it reads (READS_FROM), where they are in
    the run; where the notebook that makes a store is not (`--only 02 07`), its readers one after another, in
    notebook order, so that two of them never make the same traces at once. A cycle is refused, naming it."""
    present = {run.path.stem: run.path for run in runs}
    after: dict[Path, list[Path]] = {run.path: [] for run in runs}
    last_reader: dict[str, Path] = {}
    for run in runs:
        for maker in run.reads_from:
            if maker in present:
                after[run.path].append(present[maker])
            else:
                if maker in last_reader:
                    after[run.path].append(last_reader[maker])
                last_reader[maker] = run.path
    done: set[Path] = set()
    while len(done) < len(after):
        free = [path for path, before in after.items() if path not in done and set(before) <= done]
        if not free:
            cycle = sorted(path.stem for path in after if path not in done)
            raise BadValue(f"READS_FROM is not allowed to form a cycle: {cycle} each wait for another of them")
        done.update(free)
    return after


@contextlib.contextmanager
def one_torch_thread(jobs: int) -> Iterator[None]:
    """With more than one notebook at a time, every kernel started inside runs torch (and OpenMP, MKL) on one thread,
    so two kernels share two cores instead of fighting over them; the process's environment is put back after."""
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    before = {name: os.environ.get(name) for name in names}
    if jobs > 1:
        os.environ.update({name: "1" for name in names})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def execute_all(runs: list[Execution], jobs: int = 1, progress: bool = True) -> list[Path]:
    """Execute the notebooks `jobs` at a time (papermill from threads of this process, each kernel its own process):
    each starts once those it waits for (waits_for) have finished, the slowest of the ready ones first. The first
    failure starts nothing more; the notebooks still running finish, then it is raised. Returns the executed
    notebooks in the order of `runs`."""
    after = waits_for(runs)
    pending = list(runs)
    finished: dict[Path, Path] = {}
    running: dict[Future, Execution] = {}
    failure: BaseException | None = None
    began: dict[Path, float] = {}
    with one_torch_thread(jobs), ThreadPoolExecutor(max_workers=jobs) as pool, \
            tqdm(total=len(runs), desc="notebooks", unit="notebook", disable=not progress) as bar:
        while (pending and failure is None) or running:
            ready = sorted((run for run in pending if set(after[run.path]) <= set(finished)),
                           key=lambda run: -run.seconds)
            for run in ready[:jobs - len(running)] if failure is None else []:
                pending.remove(run)
                began[run.path] = time.perf_counter()
                # one notebook at a time shows papermill's cell bar; side by side, the bar of notebooks
                running[pool.submit(execute, run.path, run.target, run.parameters, progress and jobs == 1)] = run
            bar.set_postfix_str(", ".join(run.path.stem[:2] for run in running.values()))
            for future in wait(running, return_when=FIRST_COMPLETED)[0]:
                run = running.pop(future)
                try:
                    finished[run.path] = future.result()
                except BaseException as error:  # noqa: BLE001  (raised once the running notebooks end)
                    failure = failure or error
                    continue
                bar.update(1)
                bar.write(f"{run.path.stem}: {time.perf_counter() - began[run.path]:.0f} s")
    if failure is not None:
        raise failure
    return [finished[run.path] for run in runs]


def execute(path: Path, target: Path, parameters: dict[str, Any], progress: bool = True) -> Path:
    """Execute one notebook with papermill (its kernel started in notebooks/, so its relative folders resolve there)
    into a temporary file beside `target`, strip what changes on every run, then move it over `target`: an
    interrupted run leaves the previous notebook whole.

    The kernel is given its folder itself (nbclient's resources path: the kernel's own cwd), never by papermill's
    `cwd=`, which changes the working directory of this whole process for the run: with two notebooks run from two
    threads (execute_all), one run's change back let the other's kernel start in the checkout's root, where
    "../data/results" is a folder outside the checkout — it wrote there and made every stored result again."""
    # a name no other file has (created exclusively), so the run can only ever replace or remove its own file
    handle, scratch_name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".executing.ipynb", dir=target.parent)
    os.close(handle)
    scratch = Path(scratch_name)
    try:
        import papermill  # noqa: PLC0415  (3.7 s of import: only where a notebook runs)

        papermill.execute_notebook(str(path), str(scratch), parameters=parameters, cwd=None,
                                   resources={"metadata": {"path": str(NOTEBOOKS)}},
                                   progress_bar=progress, kernel_name="python3", execution_timeout=3600)
        strip_volatile(scratch)
        os.chmod(scratch, target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask())
        os.replace(scratch, target)
    finally:
        scratch.unlink(missing_ok=True)
    return target


def _umask() -> int:
    """The process's file-creation mask, read without changing it where Linux reports it (/proc), else by setting
    and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def committed_folders(params: dict[str, Any]) -> tuple[Path, Path]:
    """(results, figures): the folders a run with these parameters writes to (notebooks resolve relative paths
    from notebooks/)."""
    folders = output_folders(params)
    results = params.get("results_dir") or folders.get("results_dir") or "../data/results"
    figures = params.get("figures_dir") or folders.get("figures_dir") or "../figures"
    return (NOTEBOOKS / results).resolve(), (NOTEBOOKS / figures).resolve()


def check(params: dict[str, Any] | None = None, only: list[str] | None = None, progress: bool = True,
          jobs: int | None = None):
    """Run the notebooks into a temporary folder and compare each results file, figure and explorer page with the
    committed one (git HEAD's, in a checkout: committed_version), and, for the default run, each notebook's printed
    text (agreement_notebooks.compare_notebook): an agreement.Report (print report.to_text();
    report.agrees; report.compared_with says against what). The checkout is never written."""
    params = dict(params or {})
    results, figures = committed_folders(params)
    with tempfile.TemporaryDirectory(prefix="sinklib-check-") as scratch:
        scratch = Path(scratch)
        results, results_source = committed_version(results, scratch / "committed")
        figures, figures_source = committed_version(figures, scratch / "committed")
        seed_committed_runs(scratch / "results", results, COMMITTED_RUNS)  # the stores are made again
        notebooks, notebooks_source = committed_version(NOTEBOOKS, scratch / "committed")
        executed = run(params, out=scratch / "executed", only=only, figures_dir=scratch / "figures",
                       results_dir=scratch / "results", progress=progress, jobs=jobs)
        report = agreement.compare_folders(results, scratch / "results", rerun_only=bool(only),
                                           pages=(figures, scratch / "figures"))
        report.compared_with = [results_source, figures_source]
        if not params:  # the committed notebooks show the default run: what a run with other parameters prints differs
            report.rows += [compare_notebook(notebooks / path.name, path) for path in executed]
            report.compared_with.append(notebooks_source)
        return report


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice (plain YAML keeps the last, hiding a typo's twin)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is written twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_params(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """A YAML mapping of parameter names to values; anything else is refused with the file named."""
    if not path.is_file():
        parser.error(f"--params={str(path)!r} is not allowed: no such file")
    try:
        params = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as error:
        parser.error(f"--params={str(path)!r} is not allowed: it is not UTF-8 text ({error.reason} at byte {error.start})")
    except yaml.YAMLError as error:
        parser.error(f"--params={str(path)!r} is not valid YAML: {' '.join(str(error).split())}")
    if params is None:
        return {}
    if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
        parser.error(f"--params={str(path)!r} is not allowed: it must hold a mapping of parameter names to values "
                     f"(name: value), not a {type(params).__name__}")
    return params


def main(argv: list[str] | None = None) -> None:
    """The command line (`argv`, else sys.argv): run the notebooks, or with --check rerun them and compare, exiting
    with a message on a refused argument or a disagreement."""
    parser = argparse.ArgumentParser(prog="python -m sinklib.reproduce", description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, help="a YAML file of notebook parameters (notebooks/params/*.yaml)")
    parser.add_argument("--only", nargs="+", help="notebook prefixes to run, e.g. 01 03")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--remake-long-runs", action="store_true",
                        help="with no other option: make the long runs (the twins' Table 1 at n = 200, hours) again "
                             "instead of reading the committed ones")
    parser.add_argument("--jobs", type=int, default=None,
                        help="notebooks at a time (default: 2 on a CPU, each kernel one torch thread; 1 on another device)")
    parser.add_argument("--check", action="store_true",
                        help="rerun into a temporary folder and compare every results file with the committed one "
                             "(exit 1 naming what differs beyond float rounding and near-ties)")
    args = parser.parse_args(argv)
    if args.check and (args.out or args.remake_long_runs):
        parser.error(f"{'--out' if args.out else '--remake-long-runs'} is not allowed with --check: a check writes "
                     "nothing outside a temporary folder and reads the committed long runs")
    params = read_params(args.params, parser) if args.params else {}
    try:
        if args.check:
            report = check(params, args.only, jobs=args.jobs)
        else:
            executed = run(params, args.out, args.only, remake_long_runs=args.remake_long_runs, jobs=args.jobs)
    except (ValueError, OSError) as error:
        parser.error(" ".join(str(error).split()))
    if args.check:
        print("compared with " + " and ".join(report.compared_with))
        print(report.to_text())
        if not report.rows:
            sys.exit("the check compared nothing, so it confirms nothing (see above)")
        if not report.agrees:
            sys.exit(f"the rerun does not agree with the committed results: {', '.join(report.failing)}")
        print("the rerun agrees with the committed results")
        return
    for path in executed:
        print(f"executed {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
