"""The explorer: watch sinks move through the denoising steps of one generation.

    Explorer(trace, loaded)          the Jupyter widget (play / step, click a head, ε, replayed map)
    to_html(trace, "page.html")      the same views as one self-contained page (no replayed maps)
    export_pages(models, folder)     one page per model, as `make figures` writes them
    render(loaded, trace, ...)       matplotlib figures of one (step, layer, head), for static output

payload.py turns a Trace into what the front end (static/explorer.js) reads; widget.py and page.py feed it.
"""
from sinklib.explorer.figures import View, canvas_text, check_view, render
from sinklib.explorer.page import page_html, page_layers, to_html
from sinklib.explorer.pages import export_pages, page_name


def __getattr__(name: str):
    # the widget needs anywidget (the notebooks extra); pages and figures do not
    if name == "Explorer":
        from sinklib.explorer.widget import Explorer  # noqa: PLC0415  (anywidget: the notebooks extra)

        return Explorer
    raise AttributeError(f"module 'sinklib.explorer' has no attribute {name!r}")

__all__ = ["Explorer", "View", "canvas_text", "check_view", "export_pages", "page_html", "page_layers", "page_name",
           "render", "to_html"]
