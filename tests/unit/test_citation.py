"""One version string: sinklib/_version.py holds it, pyproject.toml reads it from there, CITATION.cff repeats it and
CHANGELOG.md has its section; the citation file names the paper the project reproduces."""
import re
import tomllib
from pathlib import Path

import yaml

import sinklib

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_reads_the_version_from_the_package():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sinklib._version.__version__"}


def test_citation_cff_has_the_package_version():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0"
    assert str(citation["version"]) == sinklib.__version__


def test_citation_cff_prefers_the_paper():
    paper = yaml.safe_load((ROOT / "CITATION.cff").read_text())["preferred-citation"]
    assert paper["title"] == "Attention Sinks in Diffusion Language Models" and paper["year"] == 2025
    assert [author["family-names"] for author in paper["authors"]] == ["Rulli", "Petruzzi", "Michielon", "Silvestri",
                                                                     "Scardapane", "Devoto"]
    assert "arXiv:2510.15731" in [identifier["value"] for identifier in paper["identifiers"]]


def test_changelog_has_a_section_for_the_version_and_one_for_unreleased_work():
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == "Unreleased" and sinklib.__version__ in headings
