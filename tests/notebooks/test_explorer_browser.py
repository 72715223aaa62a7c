"""The explorer in a real browser (headless Chromium): notebook 05 run in JupyterLab, and the exported page.
Both: press play and the shown step moves; click a head and the selection follows; the sinks the page marks
are the ones sinklib.find_sinks finds for what it shows."""
from __future__ import annotations

import shutil

import pytest

import sinklib
from sinklib import explorer
from sinklib.lab import reproduce
from sinklib.generation import demo_trace
from tests.browser import chromium_page, jupyterlab, screenshot_folder, shown

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROMPT = "Q: tom has 5 apples . tom gets 7 more apples . how many apples does tom have now ? A:"


@pytest.fixture(scope="module")
def llada_trace():
    return demo_trace(sinklib.load("tiny-llada"), PROMPT)


def python_sinks(trace, state: dict, eps: float) -> list[int]:
    scores = trace.scores[state["step"], state["layer"], state["head"]]
    return sinklib.find_sinks(scores, eps).nonzero().flatten().tolist()


def play_then_click_another_head(page, first: dict, timeout_ms: float) -> tuple[int, int]:
    """Press play until the shown step reaches 2, pause, click a head other than the first one shown."""
    page.click("[data-role=play]")
    page.wait_for_function("Number(document.querySelector('[data-role=step-label]').dataset.step) >= 2",
                           timeout=timeout_ms)
    page.click("[data-role=play]")  # pause
    layer, head = (first["layer"] + 1) % 4, (first["head"] + 2) % 4
    page.click(f"[data-role=grid] td[data-layer='{layer}'][data-head='{head}']")
    page.wait_for_function(f"document.querySelector('[data-role=head-label]').dataset.head === '{head}'",
                           timeout=timeout_ms)
    return layer, head


def test_exported_page_plays_selects_and_marks_the_same_sinks(llada_trace, tmp_path):
    path = explorer.to_html(llada_trace, tmp_path / "explorer_tiny-llada.html")
    assert path.stat().st_size < 2_000_000
    with chromium_page() as page:
        requests = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto(path.as_uri())
        page.wait_for_selector("[data-role=step-label]")
        first = shown(page)
        assert first["step"] == 0 and first["sinks"] == python_sinks(llada_trace, first, 3.0)

        layer, head = play_then_click_another_head(page, first, 10_000)
        now = shown(page)
        assert now["step"] >= 2 and (now["layer"], now["head"]) == (layer, head)
        assert now["sinks"] == python_sinks(llada_trace, now, 3.0)

        page.fill("[data-role=eps]", "0.5")
        page.press("[data-role=eps]", "Enter")
        page.wait_for_function("document.querySelector('[data-role=strip-caption]').textContent.includes('ε = 0.5')")
        assert shown(page)["sinks"] == python_sinks(llada_trace, now, 0.5)
        page.screenshot(path=str(screenshot_folder(tmp_path) / "explorer_page.png"), full_page=True)
        assert page.errors == []
        assert requests == [path.as_uri()]  # self-contained: nothing fetched


def test_notebook_05_in_jupyterlab_plays_and_replays_the_clicked_head(llada_trace, tmp_path):
    import papermill

    figures = tmp_path / "figures"
    papermill.execute_notebook(str(reproduce.NOTEBOOKS / "05_explorer.ipynb"), str(tmp_path / "05_explorer.ipynb"),
                               parameters={"models": ["tiny-llada"], "figures_dir": str(figures)}, prepare_only=True)
    with jupyterlab(tmp_path) as (url, token), chromium_page() as page:
        page.goto(f"{url}/lab/tree/05_explorer.ipynb?token={token}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        # the notebook's kernel is up (running cells before that asks the user to pick a kernel)
        page.wait_for_function("window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel?.status"
                               " === 'idle'", timeout=90_000)
        # Run ▸ Run All Cells, through the command the menu item calls (not awaited: it resolves when all ran)
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        page.wait_for_selector(".sinklib-explorer [data-role=step-label]", timeout=180_000)
        first = shown(page)
        assert first["step"] == 0 and first["sinks"] == python_sinks(llada_trace, first, 3.0)

        layer, head = play_then_click_another_head(page, first, 30_000)
        # the kernel replays the clicked head's map on that step's canvas and sends it back
        page.wait_for_function(f"document.querySelector('[data-role=attention-caption]').textContent"
                               f".includes('layer {layer}, head {head}, replayed')", timeout=30_000)
        now = shown(page)
        assert now["step"] >= 2 and (now["layer"], now["head"]) == (layer, head)
        assert now["sinks"] == python_sinks(llada_trace, now, 3.0)
        size = page.locator("[data-role=attention]").evaluate("canvas => [canvas.width, canvas.height]")
        assert size[0] == size[1] > 0  # a square diffusion map, seq × seq
        page.wait_for_selector("text=explorer_tiny-llada.html", timeout=60_000)  # the last cell exported the page
        page.locator(".sinklib-explorer").screenshot(path=str(screenshot_folder(tmp_path) / "explorer_notebook.png"))
        assert page.errors == []
    assert (figures / "explorer_tiny-llada.html").is_file()
    shutil.rmtree(tmp_path / ".jupyter-home", ignore_errors=True)
