"""MkDocs hook (mkdocs.yml `hooks:`): the site is built from the repository as it stands, nothing copied into docs/
and no symlinks. At build time it adds

- README.md as the home page and CHANGELOG.md as a page;
- the committed notebooks (notebooks/NN_*.ipynb, executed, with their outputs), which mkdocs-jupyter renders as they
  are (execute: false: never re-run);
- the figures and explorer pages (figures/*.png, *.html, screenshots/) and CITATION.cff, as static files;

and rewrites the links written for a reader of the repository (README's `docs/library.md`, a page's
`../figures/fig10_threshold_sweep.png`) to where those files sit in the site. A link to a repository file the site does
not carry (`../sinklib/compat.py`) becomes its plain text; a link to a file that does not exist is left alone, so
that `mkdocs build --strict` fails on it.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"}  # repository file → its page in the site
SOURCES = {page: source for source, page in PAGES.items()}
MOUNTED = {  # repository folder → the files of it the site carries, at the same path
    "notebooks": ["[0-9][0-9]_*.ipynb"],
    "figures": ["*.png", "*.html", "screenshots/*.png"],
}
STATIC = ["CITATION.cff"]
LINK = re.compile(r"(!?\[[^\]]*\])\(([^()\s]+)\)")  # [text](target) and ![alt](target), without a title
FENCE = re.compile(r"^ *```.*?^ *```[^\n]*$", re.S | re.M)  # fenced code: left as written
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#|/)")  # a URL, an anchor of this page, an absolute path


def mounted_files() -> list[str]:
    """The repository paths of the files the site carries at their own path (notebooks, figures, CITATION.cff)."""
    found = [path.relative_to(ROOT).as_posix() for folder, patterns in MOUNTED.items() for pattern in patterns
             for path in sorted((ROOT / folder).glob(pattern))]
    return found + STATIC


@event_priority(100)  # before mkdocs-jupyter's on_files, which makes pages of the .ipynb files it is handed
def on_files(files: Files, config) -> Files:
    for source, page in PAGES.items():
        files.append(File.generated(config, page, abs_src_path=str(ROOT / source)))
    for path in mounted_files():  # real Files: mkdocs-jupyter's wrapper reads a notebook through src_dir
        files.append(File(path, src_dir=str(ROOT), dest_dir=config.site_dir, use_directory_urls=config.use_directory_urls))
    return files


def site_path(repository_path: str) -> str | None:
    """Where a repository file sits in the site (every page at its root), or None when the site does not carry it."""
    if repository_path in PAGES:
        return PAGES[repository_path]
    if repository_path.startswith("docs/"):
        return repository_path.removeprefix("docs/")
    if repository_path in STATIC or repository_path.split("/")[0] in MOUNTED:
        return repository_path
    return None


def rewrite(target: str, page_source: str) -> str | None:
    """A relative link's target as the site needs it, from the page whose repository path is `page_source`; None
    when the site does not carry an existing file (the link becomes its text)."""
    if EXTERNAL.match(target):
        return target
    path, hash_, anchor = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page_source), path))
    site = site_path(resolved)
    if site is None:
        return None if (ROOT / resolved).exists() else target
    return site + hash_ + anchor


def rewrite_links(markdown: str, page_source: str) -> str:
    """Every link of `markdown` outside fenced code rewritten for the site."""

    def replace(match: re.Match) -> str:
        text, target = match.groups()
        new = rewrite(target, page_source)
        if new is None:
            return text[2:-1] if text.startswith("!") else text[1:-1]
        return f"{text}({new})"

    pieces, start = [], 0
    for fence in FENCE.finditer(markdown):
        pieces += [LINK.sub(replace, markdown[start:fence.start()]), fence.group()]
        start = fence.end()
    return "".join(pieces + [LINK.sub(replace, markdown[start:])])


def on_page_markdown(markdown: str, page, config, files) -> str:
    return rewrite_links(markdown, SOURCES.get(page.file.src_uri, f"docs/{page.file.src_uri}"))
