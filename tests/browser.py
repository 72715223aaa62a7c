"""Drive the explorer in headless Chromium (playwright, pointed at the system browser) for the `browser` tests:
a JupyterLab server on a free loopback port, and helpers that read what the explorer shows."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def chromium_executable() -> str:
    """The system Chromium ($SINKLIB_CHROMIUM or on PATH); skip with the reason where there is none."""
    found = os.environ.get("SINKLIB_CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    if not found:
        pytest.skip("no Chromium on this machine (apt-get install chromium, or set SINKLIB_CHROMIUM)")
    pytest.importorskip("playwright.sync_api", reason="the browser tests drive Chromium with playwright")
    return found


@contextlib.contextmanager
def chromium_page():
    from playwright.sync_api import sync_playwright

    executable = chromium_executable()
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's own sandbox refuses to start
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.errors = []
            page.on("pageerror", lambda error: page.errors.append(str(error)))
            yield page
        finally:
            browser.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def jupyterlab(root: Path, timeout: float = 90.0):
    """A JupyterLab server on 127.0.0.1 serving `root`, with its own config and settings folders; yields its base
    URL and token."""
    port, token = free_port(), "sinklib-browser-test"
    home = root / ".jupyter-home"
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    # no news or update pop-ups over the notebook
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces")}
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
               "--LabApp.expose_app_in_browser=True"] + (["--allow-root"] if os.geteuid() == 0 else [])
    log = open(root / ".jupyterlab.log", "w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                    break
            except OSError as error:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start: {(root / '.jupyterlab.log').read_text()[-2000:]}") from error
                time.sleep(0.5)
        yield url, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def shown(page) -> dict:
    """What the explorer shows now: step, layer, head, ε and the strip's sink positions."""
    label = page.locator("[data-role=step-label]")
    head = page.locator("[data-role=head-label]")
    sinks = page.locator("[data-role=strip]").get_attribute("data-sinks")
    return {"step": int(label.get_attribute("data-step")), "layer": int(head.get_attribute("data-layer")),
            "head": int(head.get_attribute("data-head")), "sinks": [int(p) for p in sinks.split(",") if p]}


def screenshot_folder(default: Path) -> Path:
    """Where the tests save their screenshots: $SINKLIB_SCREENSHOTS (the README's come from there) or `default`."""
    folder = Path(os.environ.get("SINKLIB_SCREENSHOTS") or default)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
