"""The interactive figures in JupyterLab, checked the way a learner sees them: a notebook
that displays each figure of ``annotated_transformer/interactive.py`` (small made-up
data) is executed, served by JupyterLab on a local port and opened in Chromium, where
each figure must be drawn by plotly (an SVG, its traces, the attention's slider), not
left as a line of text such as ``InteractiveFigure('attention')`` or "Loading...".
Jupyter Notebook 7, which the same server serves, is checked the same way. A screenshot
of each goes to ``_build/screenshots/``.

JupyterLab and Notebook 7 draw a figure from plotly's JSON output
(``application/vnd.plotly.v1+json``) with the renderer that the ``plotly`` wheel installs
as a prebuilt extension (``jupyterlab-plotly`` in ``share/jupyter/labextensions``), which
carries its own plotly.js: that path works offline, and the check runs offline (a request
that leaves the local server fails it). The notebook is opened as a learner opens a
chapter with committed outputs: untrusted. Not checked here: Colab, whose figures are
plotly's HTML that loads plotly.js from plotly's CDN (it needs Colab and the network),
and VS Code, which draws the same JSON with a renderer of its own. Skipped, saying why,
where Playwright, Chromium or JupyterLab is missing or cannot start.
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from library.test_interactive import fake_maps  # tests/library, a folder of tests/

from annotated_transformer import interactive
from annotated_transformer.interactive import PLOTLY_MIME

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]
SCREENSHOTS = ROOT / "_build" / "screenshots"
WAIT_MS = 60_000  # the longest wait for one thing in the page (a busy 2-core machine)

playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
pytest.importorskip("jupyterlab", reason="JupyterLab is not installed (requirements.txt pins "
                                         "it: bash scripts/test.sh)")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM=...)",
                allow_module_level=True)

SETUP = f"""\
import torch
from annotated_transformer.inspect_attention import AttentionMaps
from annotated_transformer.interactive import (attention_figure, learning_rate_figure,
                                               positional_encoding_figure)

{inspect.getsource(fake_maps)}"""
# Each figure's cell, in the notebook's order, and what plotly must draw of it: traces in
# the figure, heatmaps and lines shown, steps of the slider.
FIGURES = {
    "attention_figure": (
        "attention_figure(fake_maps(layers=2, heads=3), name='attention')",
        dict(traces=18, heatmaps=3, lines=0, steps=6)),
    "learning_rate_figure": (
        "steps = list(range(1, 41))\n"
        "learning_rate_figure({f'warmup {w}': (steps, [min(s / w, (w / s) ** 0.5) / 100\n"
        "                                               for s in steps]) for w in (4, 16)})",
        dict(traces=2, heatmaps=0, lines=2, steps=0)),
    "positional_encoding_figure": (
        "positional_encoding_figure(torch.sin(torch.arange(12.0)[:, None]\n"
        "                                     / 2 ** torch.arange(8.0)[None]))",
        dict(traces=1, heatmaps=1, lines=0, steps=0)),
}
# What one output of the page shows: the mime type drawn (JupyterLab's renderers name it
# in ``data-mime-type``; plotly's, ``jp-RenderedPlotly``, draws in its own node) and what
# plotly drew.
DRAWN = """(output, plotlyMime) => {
  const plot = output.closest('.js-plotly-plot') || output.querySelector('.js-plotly-plot');
  return {
    mime: output.classList.contains('jp-RenderedPlotly') ? plotlyMime
          : output.dataset.mimeType || output.className,
    text: output.innerText.trim().slice(0, 200),
    svg: plot ? plot.querySelectorAll('svg.main-svg').length : 0,
    traces: plot && plot.data ? plot.data.length : 0,
    heatmaps: plot ? plot.querySelectorAll('.heatmaplayer .hm').length : 0,
    lines: plot ? plot.querySelectorAll('.scatterlayer .trace .js-line').length : 0,
    steps: plot ? plot.querySelectorAll('.slider-container .slider-tick-rect').length : 0,
  };
}"""


def test_every_figure_of_the_module_is_in_the_notebook():
    made = {name for name, value in vars(interactive).items()
            if name.endswith("_figure") and inspect.isfunction(value)}
    assert made == set(FIGURES), f"figures without a cell here: {sorted(made - set(FIGURES))}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> Path:
    """The notebook, executed (nbclient, a python3 kernel that imports this checkout), in
    the folder that the server serves."""
    import nbformat
    from nbclient import NotebookClient

    folder = tmp_path_factory.mktemp("lab") / "root"
    folder.mkdir()
    cells = [SETUP] + [source for source, _ in FIGURES.values()]
    book = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in cells],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    NotebookClient(book, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute(env=env)
    path = folder / "figures.ipynb"
    nbformat.write(book, path)
    return path


@pytest.fixture(scope="module")
def server(notebook: Path, tmp_path_factory):
    """JupyterLab on a free local port with a token, serving the notebook's folder, its
    settings and runtime files in a temporary folder: its URL and token. Always stopped."""
    home = tmp_path_factory.mktemp("jupyter")
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get(
               "PYTHONPATH")])]),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "IPYTHONDIR": str(home / "ipython"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces")}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser",
               "--ServerApp.open_browser=False", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebook.parent}",
               "--LabApp.news_url=None",  # nothing fetched from outside
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--ServerApp.allow_root=True")
    log = (home / "server.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                               cwd=notebook.parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                request = urllib.request.Request(f"{url}/api/status",
                                                 headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(request, timeout=5) as answer:
                    json.load(answer)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (home / "server.log").read_text()[-2000:]
                pytest.skip(f"JupyterLab did not start (exit code {process.poll()}):\n{tail}")
            time.sleep(0.5)
        yield url, token
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        try:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, timeout=WAIT_MS)
        except playwright.Error as error:
            pytest.skip(f"Chromium at {CHROMIUM} did not start: {error}")
        try:
            yield chromium
        finally:
            chromium.close()


APPS = {"JupyterLab": "lab/tree", "Notebook 7": "notebooks"}


@pytest.mark.slow
@pytest.mark.alone  # waits on a browser and a server
@pytest.mark.parametrize("app", APPS)
def test_each_figure_is_drawn_by_plotly(server, browser, notebook: Path, app: str):
    url, token = server
    if app == "Notebook 7":
        pytest.importorskip("notebook", reason="Jupyter Notebook 7 is not installed")
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith((url, "data:", "blob:"))
            else outside.append(r.url))
    page.set_default_timeout(WAIT_MS)
    try:
        page.goto(f"{url}/{APPS[app]}/{notebook.name}?token={token}", timeout=WAIT_MS)
        cells = page.locator(".jp-Notebook .jp-CodeCell")
        playwright.expect(cells).to_have_count(1 + len(FIGURES), timeout=WAIT_MS)
        for index, (name, (_, expected)) in enumerate(FIGURES.items(), start=1):
            output = cells.nth(index).locator(".jp-OutputArea-output").first
            output.scroll_into_view_if_needed(timeout=WAIT_MS)
            shown = output.evaluate(DRAWN, PLOTLY_MIME)
            assert shown["mime"] == PLOTLY_MIME, (
                f"{app}: {name} is shown as {shown['mime']}, not by plotly's renderer: {shown}")
            try:
                output.locator("svg.main-svg").first.wait_for(timeout=WAIT_MS)
            except playwright.Error:
                pass  # the summary below says what is there instead
            drawn = output.evaluate(DRAWN, PLOTLY_MIME)
            assert drawn["svg"], f"{app}: plotly did not draw {name}: {drawn}"
            assert {key: drawn[key] for key in expected} == expected, (
                f"{app}: {name} is not drawn as made: {drawn}")
            assert "Loading" not in drawn["text"] and "InteractiveFigure(" not in drawn["text"]
        assert not outside, f"{app}: requests left the machine (it must work offline): {outside}"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"jupyter_{APPS[app].split('/')[0]}.png"))
    finally:
        page.close()
