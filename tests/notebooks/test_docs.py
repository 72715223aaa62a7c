"""The documentation site (mkdocs.yml; `make docs`): the strict build succeeds (a broken link or anchor, a page left
out of the navigation or a docstring that does not render would fail it); the notebooks are rendered as committed,
their figures inline; the API page documents the public API from its docstrings; the README's quick start runs and
prints what it says; and in headless Chromium a notebook's figure is visible and the API page shows find_sinks.

The site is built once per module into a temporary folder, never into the checkout's site/."""
from __future__ import annotations

import base64
import contextlib
import functools
import html
import http.server
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import sinklib

ROOT = Path(__file__).resolve().parents[2]
DOCS_PACKAGES = ("mkdocs", "material", "mkdocs_jupyter", "mkdocstrings", "mkdocstrings_handlers.python")
NOTEBOOK_01 = ROOT / "notebooks" / "01_attention_distributions.ipynb"
API = {"capture": sinklib.capture, "find_sinks": sinklib.find_sinks, "generate": sinklib.generate,
       "MaskSinks": sinklib.MaskSinks, "load": sinklib.load, "Trace": sinklib.Trace}
IMG = re.compile(r'<img\b[^>]*\bsrc="([^"]+)"')


def _missing_docs_packages() -> list[str]:
    missing = []
    for name in DOCS_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a dotted name whose parent is missing
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """(the built site's folder, the finished `mkdocs build --strict`, seconds it took)."""
    missing = _missing_docs_packages()
    if missing:
        pytest.skip(f"the documentation site needs the docs extra ({', '.join(missing)} missing): "
                    "pip install -e '.[docs]' (make docs installs it)")
    site = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    return site, done, time.monotonic() - started


@pytest.fixture(scope="module")
def site(build) -> Path:
    folder, done, _ = build
    if done.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed:\n{done.stderr[-4000:]}")
    return folder


def test_the_strict_build_succeeds(build):
    folder, done, seconds = build
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    print(f"mkdocs build --strict: {seconds:.1f} s")
    for page in ("index.html", "api/index.html", "extending/index.html", "changelog/index.html"):
        assert (folder / page).is_file(), page
    assert not (folder / "hooks.py").exists() and not (folder / "__pycache__").exists()  # mkdocs.yml's exclude_docs


def test_every_notebook_is_a_page_with_its_download(site):
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert (site / "notebooks" / path.stem / "index.html").is_file(), path.name
        assert (site / "notebooks" / path.stem / path.name).read_bytes() == path.read_bytes()


def test_notebook_01s_page_carries_its_committed_figures(site):
    """Rendered from the committed outputs, not re-run: every PNG output of the notebook is an inline image."""
    notebook = json.loads(NOTEBOOK_01.read_text())
    committed = [output["data"]["image/png"] for cell in notebook["cells"] for output in cell.get("outputs", [])
                 if "image/png" in output.get("data", {})]
    page = (site / "notebooks" / NOTEBOOK_01.stem / "index.html").read_text()
    inline = [src.split(",", 1)[1] for src in IMG.findall(page) if src.startswith("data:image/png;base64,")]
    assert committed and len(inline) >= len(committed)
    assert all(base64.b64decode(data).startswith(b"\x89PNG") for data in inline)
    shown = {re.sub(r"\s", "", data) for data in inline}
    assert all(re.sub(r"\s", "", "".join(png) if isinstance(png, list) else png) in shown for png in committed)


def _text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def test_the_api_page_documents_the_public_api_from_its_docstrings(site):
    page = (site / "api" / "index.html").read_text()
    text = _text(page)
    for name, obj in API.items():
        anchor = f"{obj.__module__}.{obj.__qualname__}"
        assert f'id="{anchor}"' in page, anchor
        first_line = re.sub(r"\s+", " ", inspect.getdoc(obj).split("\n\n")[0].replace("`", "")).strip()  # markdown: code
        assert first_line in text, (name, first_line)


def test_the_home_page_is_the_readme_with_its_figures_and_links(site):
    page = (site / "index.html").read_text()
    assert "What an attention sink is." in _text(page)
    images = [src for src in IMG.findall(page) if not src.startswith("data:")]
    assert "figures/fig01_token_step_smollm2-135m-instruct.png" in images
    assert all((site / src).is_file() for src in images), images
    for target in ("library/", "api/", "notebooks/00_what_is_an_attention_sink/", "figures/explorer_tiny-llada.html",
                   "CITATION.cff", "changelog/"):
        assert f'href="{target}"' in page, target
        assert (site / target).exists(), target


def test_links_are_rewritten_for_the_site():
    """docs/hooks.py: links written for the repository point where the site has the file; a file the site does not
    carry becomes text; a missing one is left for the strict build to refuse."""
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("sinklib_docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.rewrite("docs/library.md#units", "README.md") == "library.md#units"
    assert hooks.rewrite("figures/fig10_threshold_sweep.png", "README.md") == "figures/fig10_threshold_sweep.png"
    assert hooks.rewrite("../figures/fig10_threshold_sweep.png", "docs/findings.md") == "figures/fig10_threshold_sweep.png"
    assert hooks.rewrite("../README.md#quick-start", "docs/library.md") == "index.md#quick-start"
    assert hooks.rewrite("../sinklib/compat.py", "docs/checkpoints.md") is None
    assert hooks.rewrite("../no_such_file.md", "docs/api.md") == "../no_such_file.md"
    assert hooks.rewrite("https://arxiv.org/abs/2510.15731", "README.md") == "https://arxiv.org/abs/2510.15731"
    markdown = "See [compat](../sinklib/compat.py) and ![fig](../figures/a.png).\n```python\nx = [1](../y)\n```\n"
    assert hooks.rewrite_links(markdown, "docs/library.md") == \
        "See compat and ![fig](figures/a.png).\n```python\nx = [1](../y)\n```\n"


def test_the_readme_quick_start_runs_and_prints_what_it_says(tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Quick start\s+```python\n(.*?)```", readme, re.S).group(1)
    assert len(code.strip().splitlines()) <= 12
    said = [line.split("#", 1)[1].strip() for line in code.splitlines() if line.startswith("print(")]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.strip().splitlines()
    assert len(printed) == len(said) == 3
    assert printed[0].strip() == said[0] and "12" in printed[0]  # tiny-llada answers 5 + 7
    assert printed[1] == f"torch.Size({said[1].split(':')[0]})"
    assert printed[2].strip() != printed[0].strip()  # the top sinks masked change the answer (Table 1's zoo result)


@contextlib.contextmanager
def serving(folder: Path):
    """The built site over HTTP on a free loopback port, as a static host serves it; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no request log on the test's output
        pass


@pytest.mark.browser
def test_the_site_in_a_browser_shows_a_notebook_figure_and_find_sinks(site):
    from tests.browser import chromium_page

    with serving(site) as url, chromium_page() as page:
        page.goto(f"{url}/notebooks/{NOTEBOOK_01.stem}/")
        figure = page.locator('img[src^="data:image/png"]').first
        figure.scroll_into_view_if_needed(timeout=30_000)
        assert figure.is_visible()
        size = figure.evaluate("img => [img.complete, img.naturalWidth, img.getBoundingClientRect().width]")
        assert size[0] and size[1] > 100 and size[2] > 100, size  # decoded and drawn, not a broken image
        assert "01 · How attention is distributed" in page.title()

        page.goto(f"{url}/api/")
        heading = page.locator('[id="sinklib.sinks.find_sinks"]')
        heading.scroll_into_view_if_needed(timeout=30_000)
        assert heading.is_visible() and "find_sinks" in heading.inner_text()
        assert "Eq. 3: key j is a sink" in page.locator("article").inner_text()
        assert page.errors == []
