"""One version string: sinklib/_version.py holds it, pyproject.toml reads it from there, CITATION.cff repeats it and
CHANGELOG.md has its section; the citation file and the README cite the paper the project reproduces as published
(Findings of ACL 2026), beside its arXiv preprint."""
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


PAPER = "Attention Sinks in Diffusion Language Models"
AUTHORS = ["Rulli", "Petruzzi", "Michielon", "Silvestri", "Scardapane", "Devoto"]
FINDINGS = "Findings of the Association for Computational Linguistics: ACL 2026"
ANTHOLOGY = "https://aclanthology.org/2026.findings-acl.2145"
ARXIV = "arXiv:2510.15731"


def test_citation_cff_prefers_the_published_paper():
    """The preferred citation is the paper as published in Findings of ACL 2026, with its pages and its Anthology
    address, and it still names the arXiv preprint."""
    paper = yaml.safe_load((ROOT / "CITATION.cff").read_text())["preferred-citation"]
    assert paper["title"] == PAPER and paper["year"] == 2026
    assert [author["family-names"] for author in paper["authors"]] == AUTHORS
    assert paper["type"] == "conference-paper" and paper["collection-type"] == "proceedings"
    assert paper["collection-title"] == FINDINGS
    assert paper["publisher"]["name"] == "Association for Computational Linguistics"
    assert (paper["start"], paper["end"]) == (43244, 43256)
    assert paper["url"] == ANTHOLOGY
    identifiers = [identifier["value"] for identifier in paper["identifiers"]]
    assert ANTHOLOGY in identifiers and ARXIV in identifiers


def test_citation_cff_keeps_the_arxiv_preprint():
    preprint = yaml.safe_load((ROOT / "CITATION.cff").read_text())["references"][0]
    assert preprint["title"] == PAPER and preprint["year"] == 2025
    assert [author["family-names"] for author in preprint["authors"]] == AUTHORS
    assert ARXIV in [identifier["value"] for identifier in preprint["identifiers"]]
    assert preprint["url"] == "https://arxiv.org/abs/2510.15731"


def test_readme_cites_the_published_paper_beside_the_preprint():
    section = (ROOT / "README.md").read_text().split("## Citing", 1)[1].split("\n## ", 1)[0]
    citing = " ".join(" ".join(line.lstrip("> ") for line in section.splitlines()).split())  # the quote's lines joined
    assert "Findings of the Association for Computational Linguistics: ACL 2026" in citing
    assert "pages 43244–43256" in citing and ANTHOLOGY in citing and ARXIV in citing


def test_changelog_has_a_section_for_the_version_and_one_for_unreleased_work():
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == "Unreleased" and sinklib.__version__ in headings
