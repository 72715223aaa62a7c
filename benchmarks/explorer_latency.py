"""How long the explorer takes to show a new step, per model: the kernel's side (the widget's step change:
that step's scores plus the replayed map of the selected head) and the browser's side (the page redrawing after
a click on ▶, until the next frame), measured in one run.

    python benchmarks/explorer_latency.py

Goal: a step change redraws in well under a second on 2 cores for a zoo model.
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import sinklib
from sinklib import explorer
from sinklib.generation import demo_trace

PROMPT = "Q: tom has 5 apples . tom gets 7 more apples . how many apples does tom have now ? A:"
MODELS = ["tiny-llada", "tiny-dream", "tiny-arm", "smollm2-135m-instruct"]

REDRAW = """async () => {
  const label = document.querySelector('[data-role=step-label]');
  const before = label.dataset.step;
  const start = performance.now();
  document.querySelector('[data-role=next]').click();
  while (label.dataset.step === before) await new Promise(requestAnimationFrame);
  await new Promise(requestAnimationFrame);
  return performance.now() - start;
}"""


def kernel_side(widget: explorer.Explorer, steps: int) -> list[float]:
    """Seconds of each step change of the widget, steps 1 to steps − 1."""
    seconds = []
    for step in range(1, steps):
        start = time.perf_counter()
        widget.step = step  # sends the step's scores and replays the selected head's map
        seconds.append(time.perf_counter() - start)
    return seconds


def browser_side(page_path: Path, steps: int) -> list[float] | None:
    """Seconds from each click on ▶ of the saved page in headless Chromium to the frame after it shows the next
    step (steps − 1 clicks); None without playwright or a chromium executable."""
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if executable is None:
        return None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(page_path.as_uri())
        page.wait_for_selector("[data-role=step-label]")
        milliseconds = [page.evaluate(REDRAW) for _ in range(1, steps)]
        browser.close()
    return [ms / 1000 for ms in milliseconds]


def main() -> None:
    """Print, for every model, the median and largest milliseconds of a step change in the kernel and the page."""
    print(f"{'model':24} {'steps':>5} {'seq':>4} {'kernel: step + map (ms)':>24} {'page redraw (ms)':>17}")
    with tempfile.TemporaryDirectory() as folder:
        for name in MODELS:
            loaded = sinklib.load(name)
            trace = demo_trace(loaded, PROMPT)
            steps, _, _, seq = trace.scores.shape
            kernel = kernel_side(explorer.Explorer(trace, loaded), steps)
            browser = browser_side(explorer.to_html(trace, Path(folder) / f"{name}.html"), steps)
            page = "no browser" if browser is None else f"{1000 * statistics.median(browser):.1f} (max {1000 * max(browser):.1f})"
            print(f"{name:24} {steps:5d} {seq:4d} {1000 * statistics.median(kernel):12.1f} "
                  f"(max {1000 * max(kernel):6.1f}) {page:>17}")


if __name__ == "__main__":
    main()
