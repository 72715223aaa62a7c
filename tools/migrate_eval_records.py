"""One-off migration of stored evaluation runs to records format 4 (issue 67), without recomputing them.

Format 3 kept a run in three files: NAME.jsonl (its records), NAME.jsonl.provenance.json (its config and inputs,
versions, machine, code) and, for a Table 1 run, NAME.jsonl.checks.json; its key held the model by name and weights
only. Format 4 keeps a run in one file whose first line is a header (sinklib.evaluation.runner.run_header), keyed by
what shapes its records (runner.run_config). For each run file under the folders given:

1. Its records are read, each seal and config_hash checked. Its recorded config must be the one its config_hash
   names, and the one this checkout's objects give under that format's key (format 3: old_config, and the inputs the
   format-3 runner recorded: old_inputs): the model loaded with sinklib.load (float32, as every committed run), the
   task and its samples, the intervention, the settings, the seed and the batch size. A run made with weights the
   model no longer has (an earlier training) is left as it is and reported.
2. Its first batch (the first two where a batch is one problem) is generated again with the current code; each record
   must give the stored output, or differ only where the stored or the new decision was a near-tie (sinklib.ties).
3. The run is written under its new key (a Table 1 run: the new config_hash in its name; a speed run: in place), its
   records re-sealed under the new config_hash, its header holding the new key, the inputs, the provenance of the run
   that made the records (their machine and versions, not this one's), its checks and the key it had.
4. The files it replaced are deleted (and only those).

A format-4 file whose key is stale (the numerics' or a scorer's code changed since) is re-keyed the same way, its
model, task, samples, settings and intervention unchanged: only where the re-generated batch agrees.

Usage: python tools/migrate_eval_records.py [--dry-run | --keys-only] [--models a,b] [--skip-models a,b]
       [--shard I/N] [--report FILE] FOLDER...
(Processes running at once must be given disjoint files: other --models, or --shard 0/2 and 1/2.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sinklib
from sinklib.cache_manifest import MANIFEST
from sinklib.digest import digest, file_sha256
from sinklib.evaluation import records as run_file, runner
from sinklib.evaluation.table1 import CONDITIONS
from sinklib.evaluation.tasks import get_task, qualified_name
from sinklib.families.base import get_family, record
from sinklib.interventions import identity
from sinklib.paths import ZOO_DIR
from sinklib.ties import is_near_tie

PROVENANCE, CHECKS = ".provenance.json", ".checks.json"
# what the key of either format holds that the objects rebuilt here must give again (the rest is allowed to change)
KEPT_V4 = ("model", "task", "samples", "limit", "seed", "batch_size", "intervention", "settings")
MAX_K = 64  # the largest k an intervention is rebuilt at


@dataclass
class Run:
    """One stored run: its file, the config it was keyed by, its provenance, checks and records."""
    path: Path
    key: str
    config: dict[str, Any]
    provenance: dict[str, Any]
    records: list[dict]
    checks: dict | None = None
    inputs: dict | None = None
    sidecars: list[Path] = field(default_factory=list)
    format: int = 3
    origin: dict | None = None  # a format-4 file's migrated_from: the format-3 key it was first migrated from


def read_stored(path: Path) -> Run:
    """A run file of format 3 (with its sidecars) or 4 (its header), every record's seal and key checked."""
    header, records = run_file.read_run(path)
    if header is not None:
        run = Run(path, header["config_hash"], header["config"], header["provenance"], records, header.get("checks"),
                  header.get("inputs"), format=4, origin=header.get("migrated_from"))
    else:
        entries = json.loads(Path(f"{path}{PROVENANCE}").read_text())
        if len(entries) != 1:
            raise ValueError(f"{path.name}: its provenance names {len(entries)} configurations, not one")
        key, entry = next(iter(entries.items()))
        config = json.loads(entry["config"]) if isinstance(entry["config"], str) else entry["config"]
        checks_file = Path(f"{path}{CHECKS}")
        checks = json.loads(checks_file.read_text()) if checks_file.is_file() else None
        run = Run(path, key, config, {k: entry[k] for k in ("versions", "machine", "code")}, records, checks,
                  entry.get("inputs"), [Path(f"{path}{PROVENANCE}"), *([checks_file] if checks is not None else [])])
    if run.format == 3 and digest(run.config) != run.key:
        raise ValueError(f"{path.name}: its config is not the one its config_hash {run.key} names")
    for number, item in enumerate(records, 2 if run.format == 4 else 1):
        if item.get("config_hash") != run.key or item.get("record_sha256") != run_file.record_digest(item):
            raise ValueError(f"{path.name}: line {number} is not a sealed record of {run.key}")
    return run


def old_config(loaded, task, intervention, seed: int, batch_size: int, settings) -> dict[str, Any]:
    """The key of records format 3 (the runner before issue 67), from the objects."""
    return json.loads(json.dumps({"records": 3, "model": loaded.name, "weights": loaded.weights,
                                  "family": loaded.family.name, "task": task.name, "limit": task.limit, "seed": seed,
                                  "batch_size": batch_size, "intervention": identity(intervention),
                                  "settings": record(settings), "task_path": task.path}, default=str))


def old_inputs(loaded, task, samples) -> dict[str, Any]:
    """The inputs records format 3 recorded: the task's definition and samples, the zoo folder's shaping files."""
    definition = {"name": task.name, "chat": task.chat, "stops": list(task.stops), "gen_length": task.gen_length,
                  "executes_code": task.executes_code, "scorer": qualified_name(task.scorer),
                  "load": qualified_name(task.load)}
    folder = ZOO_DIR / loaded.name
    files = {} if not folder.is_dir() else {
        path.name: file_sha256(path)[:16] for path in sorted(folder.iterdir())
        if path.is_file() and path.suffix in (".json", ".jinja", ".model", ".txt") and path.name not in ("card.json",
                                                                                                           MANIFEST)}
    return {"task": digest(definition), "samples": digest([[s.id, s.prompt, s.target, dict(s.meta)] for s in samples]),
            "model_files": files}


def rebuild_intervention(family, text: str, seed: int):
    """The intervention whose identity is `text`: a registered Table 1 condition's at some k, for `family`."""
    if text == "None":
        return None
    for name in CONDITIONS.names():
        for k in range(1, MAX_K + 1):
            built = CONDITIONS.get(name).intervention(family, k, seed)
            if built is not None and identity(built) == text:
                return built
    raise ValueError(f"no registered condition builds the intervention {text}")


@dataclass
class Rebuilt:
    """The objects a stored run was made from, as this checkout builds them, and its new key."""
    task: Any
    samples: list
    intervention: Any
    settings: Any
    config: dict[str, Any]


def rebuild(run: Run, loaded) -> Rebuilt:
    """The run's task, samples, intervention and settings built again, checked to give its stored key's fields."""
    old = run.config
    if run.format == 3:
        name, path, limit, family, seed = old["task"], old.get("task_path"), old["limit"], old["family"], old["seed"]
    else:
        name, path, limit = old["task"]["name"], (run.inputs or {}).get("task_path"), old["limit"]
        family, seed = old["model"]["family"], old["seed"]
    task = get_task(name, path=path, limit=limit)
    samples = task.samples()
    settings = loaded.runnable(get_family(family).settings(**old["settings"]))
    intervention = rebuild_intervention(loaded.family, old["intervention"], seed)
    config = runner.run_config(loaded, task, intervention, seed, old["batch_size"], settings, samples)
    if run.format == 3:
        again = old_config(loaded, task, intervention, seed, old["batch_size"], settings)
        if again != old:
            raise ValueError(f"its config differs from this checkout's old key in {_differing(old, again)}")
        if run.inputs is not None and run.inputs != old_inputs(loaded, task, samples):
            raise ValueError(f"its inputs differ in {_differing(run.inputs, old_inputs(loaded, task, samples))}")
    elif {k: old.get(k) for k in KEPT_V4} != {k: config.get(k) for k in KEPT_V4}:
        raise ValueError(f"its key differs in {_differing({k: old.get(k) for k in KEPT_V4}, config)}")
    if config["model"]["dtype"] != "float32":
        raise ValueError(f"the model loads as {config['model']['dtype']}, not float32")
    return Rebuilt(task, samples, intervention, settings, config)


def _differing(recorded: dict, wanted: dict) -> list[str]:
    return sorted(k for k in set(recorded) | set(wanted) if recorded.get(k) != wanted.get(k))


def recompute(run: Run, loaded, made: Rebuilt) -> dict[str, Any]:
    """The first batch (the first two of one problem each) generated again with the current code, compared with the
    stored records: per record equal, a near-tie (outputs differ where either decision was one) or different."""
    size = made.config["batch_size"]
    batches = [made.samples[start:start + size] for start in range(0, len(made.samples), size)][:2 if size == 1 else 1]
    generator = runner._Run(loaded, made.task, made.intervention, made.settings, run_file.config_hash(made.config),
                            made.config["seed"])
    stored = {item["id"]: item for item in run.records}
    outcome: dict[str, Any] = {"equal": 0, "near_tie": [], "different": []}
    for index, batch in enumerate(batches):
        for fresh in generator.batch(index, batch, {}):
            old = stored[fresh["id"]]
            if old["output"] == fresh["output"] and old["correct"] == fresh["correct"]:
                outcome["equal"] += 1
            elif old["output"] != fresh["output"] and (is_near_tie(old.get("margin")) or is_near_tie(fresh["margin"])):
                outcome["near_tie"].append(fresh["id"])
            else:
                outcome["different"].append({"id": fresh["id"], "stored": old["output"], "now": fresh["output"]})
    return outcome


def migrated_lines(run: Run, loaded, made: Rebuilt) -> list[dict]:
    """The new file's lines: its header (the new key, the inputs, the records' own provenance, the checks, the key it
    had), then every record re-sealed under the new config_hash."""
    key = run_file.config_hash(made.config)
    header = {"header": run_file.HEADER, "config_hash": key, "config": made.config,
              "inputs": runner.run_inputs(loaded, made.task, made.samples), "provenance": run.provenance,
              **({run_file.CHECKS: run.checks} if run.checks is not None else {}),
              "migrated_from": run.origin or {"config_hash": run.key, "records": run.config.get("records")}}
    records = [run_file._sealed({**{k: v for k, v in item.items() if k != "record_sha256"}, "config_hash": key})
               for item in run.records]
    return [run_file._sealed(header), *records]


def target_path(run: Run, key: str) -> Path:
    """Where the migrated run goes: a Table 1 run's name ends in its config_hash (replaced), a speed run keeps its
    name."""
    suffix = f"-{run.key}.jsonl"
    if run.path.name.endswith(suffix):
        return run.path.with_name(run.path.name[:-len(suffix)] + f"-{key}.jsonl")
    return run.path


def write(run: Run, lines: list[dict], target: Path) -> None:
    """The new file written whole (atomically), then the files it replaced removed."""
    descriptor, scratch = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    with os.fdopen(descriptor, "w") as handle:
        handle.write("".join(json.dumps(line) + "\n" for line in lines))
    os.chmod(scratch, 0o644)
    os.replace(scratch, target)
    for replaced in [*run.sidecars, *([run.path] if run.path != target else [])]:
        replaced.unlink()


def migrate(path: Path, models: dict, dry_run: bool, keys_only: bool = False) -> dict[str, Any]:
    """Migrate one run file; its report (status: migrated, current, stale, refused; the recomputation's outcome)."""
    run = read_stored(path)
    model_name = run.config["model"] if run.format == 3 else run.config["model"]["model"]
    weights = run.config["weights"] if run.format == 3 else run.config["model"]["weights"]
    if model_name not in models:
        models[model_name] = sinklib.load(model_name)
    loaded = models[model_name]
    report: dict[str, Any] = {"file": str(path), "model": model_name, "records": len(run.records), "old_key": run.key,
                              "inputs_checked": run.inputs is not None}
    if weights != loaded.weights:
        return {**report, "status": "stale", "why": f"made with weights {weights}; {model_name} is {loaded.weights} now"}
    try:
        made = rebuild(run, loaded)
    except ValueError as error:
        return {**report, "status": "refused", "why": str(error)}
    key = run_file.config_hash(made.config)
    if run.format == 4 and key == run.key:
        return {**report, "status": "current"}
    report.update(new_key=key, target=str(target_path(run, key)))
    if keys_only:
        return {**report, "status": "keys checked"}
    outcome = recompute(run, loaded, made)
    report["recomputed"] = outcome
    if outcome["different"]:
        return {**report, "status": "refused", "why": "re-generated records differ beyond near-ties"}
    if target_path(run, key).exists() and target_path(run, key) != path:
        return {**report, "status": "refused", "why": "its new file exists already"}
    if not dry_run:
        write(run, migrated_lines(run, loaded, made), target_path(run, key))
    return {**report, "status": "migrated" if not dry_run else "would migrate"}


def run_files(folders: list[str]) -> list[Path]:
    """Every run file under the folders (sidecars and scratch files left out), in name order."""
    return sorted(path for folder in folders for path in Path(folder).rglob("*.jsonl") if not path.name.startswith("."))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--dry-run", action="store_true", help="check and re-generate, write nothing")
    parser.add_argument("--keys-only", action="store_true", help="check the keys only: re-generate and write nothing")
    parser.add_argument("--models", default="", help="only the runs of these models (comma-separated)")
    parser.add_argument("--skip-models", default="", help="not the runs of these models (comma-separated)")
    parser.add_argument("--report", default=None, help="append one JSON line per run file to this file")
    parser.add_argument("--shard", default="0/1", help="I/N: of the run files chosen, every N-th from the I-th")
    args = parser.parse_args(argv)
    only, skip = set(filter(None, args.models.split(","))), set(filter(None, args.skip_models.split(",")))
    index, count = map(int, args.shard.split("/"))
    models: dict[str, Any] = {}
    failed = 0
    chosen = [path for path in run_files(args.folders)
              if not (only and _model_of(path) not in only) and _model_of(path) not in skip]
    for path in chosen[index::count]:
        if not path.exists():  # migrated meanwhile by another process
            continue
        try:
            report = migrate(path, models, args.dry_run, args.keys_only)
        except (OSError, ValueError, KeyError) as error:
            report = {"file": str(path), "status": "refused", "why": f"{type(error).__name__}: {error}"}
        failed += report["status"] == "refused"
        print(json.dumps(report), flush=True)
        if args.report:
            with open(args.report, "a") as handle:
                handle.write(json.dumps(report) + "\n")
    return 1 if failed else 0


def _model_of(path: Path) -> str:
    """The model a run file's key names (read from its provenance or header)."""
    header, _ = run_file.read_run(path)
    if header is not None:
        return header["config"]["model"]["model"]
    entry = next(iter(json.loads(Path(f"{path}{PROVENANCE}").read_text()).values()))
    config = json.loads(entry["config"]) if isinstance(entry["config"], str) else entry["config"]
    return config["model"]


if __name__ == "__main__":
    sys.exit(main())
