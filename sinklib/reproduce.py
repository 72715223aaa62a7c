"""Regenerate every figure: execute the numbered notebooks headlessly with papermill, in order.

    python -m sinklib.reproduce                                   # the tiny zoo on CPU (the default)
    python -m sinklib.reproduce --params notebooks/params/paper-llada.yaml   # a real checkpoint on a GPU

Executed copies go to notebooks/executed/; figures to figures/ (PNG + PDF); numbers to data/results/.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def notebook_paths(only: list[str] | None = None) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        paths = [p for p in paths if any(p.name.startswith(prefix) for prefix in only)]
        if not paths:
            raise ValueError(f"only={only!r} is not allowed: no notebook starts with it (have {[p.name for p in sorted(NOTEBOOKS.glob('[0-9][0-9]_*.ipynb'))]})")
    return paths


def parameters_for(path: Path, given: dict[str, Any]) -> dict[str, Any]:
    """The given parameters that this notebook declares (a `models` list also fills a single `model`)."""
    import papermill

    declared = set(papermill.inspect_notebook(str(path)))
    params = {k: v for k, v in given.items() if k in declared}
    if "model" in declared and "model" not in given and given.get("models"):
        params["model"] = given["models"][0]
    return params


def run(params: dict[str, Any] | None = None, out: Path | None = None, only: list[str] | None = None,
        figures_dir: Path | None = None, results_dir: Path | None = None, progress: bool = True) -> list[Path]:
    import papermill

    given = dict(params or {})
    if figures_dir is not None:
        given["figures_dir"] = str(Path(figures_dir).resolve())
    if results_dir is not None:
        given["results_dir"] = str(Path(results_dir).resolve())
    out = Path(out or NOTEBOOKS / "executed")
    out.mkdir(parents=True, exist_ok=True)
    executed = []
    for path in notebook_paths(only):
        target = out / path.name
        papermill.execute_notebook(str(path), str(target), parameters=parameters_for(path, given), cwd=str(NOTEBOOKS),
                                   progress_bar=progress, kernel_name="python3",
                                   execution_timeout=3600)
        executed.append(target)
    return executed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sinklib.reproduce", description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, help="a YAML file of notebook parameters (notebooks/params/*.yaml)")
    parser.add_argument("--only", nargs="*", help="notebook prefixes to run, e.g. 01 03")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    params = yaml.safe_load(args.params.read_text()) if args.params else {}
    for path in run(params, args.out, args.only):
        print(f"executed {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
