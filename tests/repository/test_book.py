"""The web book, checked the way a reader sees it: built, served, opened in Chromium.

Every page loads with no failed request (nothing depends on the network), every
formula is typeset by the locally served MathJax (no raw ``\\(`` or ``$$`` left),
every image has loaded with a non-zero size, the navigation reaches every chapter,
and each chapter's Colab button opens that chapter's notebook. The interactive figures
(plotly, whose plotly.js the book serves once) are drawn, switch layer and head, and show
the value under the pointer. A full-page
screenshot of every page goes to ``_build/screenshots/``. Skipped, saying why, where
no Chromium or Playwright can be found.
"""

from __future__ import annotations

import functools
import http.server
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]
CHAPTERS = sorted(p.stem for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
SCREENSHOTS = ROOT / "_build" / "screenshots"

playwright = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
expect = playwright.expect
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set CHROMIUM=...)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Build the book (warnings are errors) into a temporary folder: its HTML folder."""
    out = tmp_path_factory.mktemp("book")
    build = subprocess.run(
        [str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT), "--config",
         str(ROOT / "book/_config.yml"), "--toc", str(ROOT / "book/_toc.yml"), "--path-output",
         str(out), "--warningiserror", "--keep-going"],
        capture_output=True, text=True, cwd=ROOT)
    assert build.returncode == 0, f"the book does not build:\n{build.stdout[-4000:]}"
    return out / "_build" / "html"


@pytest.fixture(scope="module")
def site(built) -> str:
    """The built book, served on a local port."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(built))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()


def pages() -> list[str]:
    toc = (ROOT / "book/_toc.yml").read_text()
    files = [line.split(":", 1)[1].strip() for line in toc.splitlines()
             if line.strip().startswith(("- file:", "root:"))]
    return [f"{f}.html" for f in files]


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(request.url))
    origin = url.split("/", 3)[:3]
    page.on("request", lambda r: None if r.url.split("/", 3)[:3] == origin
            or r.url.startswith(("data:", "blob:")) else failed.append(f"outside: {r.url}"))
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400
            else None)
    page.goto(url, wait_until="networkidle")
    page.wait_for_function("() => !window.MathJax || (MathJax.startup && "
                           "MathJax.startup.promise !== undefined)")
    page.evaluate("() => window.MathJax && MathJax.startup.promise")
    return page, failed


def test_every_chapter_is_in_the_book():
    listed = {p.removesuffix(".html").split("/")[-1] for p in pages()}
    missing = [c for c in CHAPTERS if c not in listed]
    assert not missing, f"chapters missing from book/_toc.yml: {missing}"


@pytest.mark.parametrize("path", pages())
def test_page_reads_as_written(site, browser, path):
    page, failed = open_page(browser, f"{site}/{path}")
    try:
        assert not failed, f"{path}: requests failed (the book must work offline): {failed}"
        text = page.inner_text("article")
        for raw in ("\\(", "\\[", "$$"):
            assert raw not in text, f"{path}: untypeset math left in the page ({raw!r})"
        images = page.evaluate("Array.from(document.images).map(i => [i.src, i.complete, "
                               "i.naturalWidth, i.naturalHeight])")
        broken = [src for src, done, width, height in images if not (done and width and height)]
        assert not broken, f"{path}: images that did not load: {broken}"
        if path.startswith("chapters/"):
            assert page.locator("mjx-container").count() > 0, f"{path}: no typeset math"
            figures = [src for src, *_ in images if "logo" not in src]
            if not path.startswith("chapters/00") or figures:
                assert figures, f"{path}: a chapter without a single figure"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / (path.replace("/", "_") + ".png")),
                        full_page=True)
    finally:
        page.close()


def test_navigation_reaches_every_chapter(site, browser):
    page, _ = open_page(browser, f"{site}/book/intro.html")
    try:
        links = page.evaluate("Array.from(document.querySelectorAll('nav.bd-docs-nav a'))"
                              ".map(a => a.href)")
    finally:
        page.close()
    for chapter in CHAPTERS:
        assert any(link.endswith(f"chapters/{chapter}.html") for link in links), (
            f"the navigation has no link to {chapter}")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_colab_button_opens_the_chapter(site, browser, chapter):
    page, _ = open_page(browser, f"{site}/chapters/{chapter}.html")
    try:
        links = page.evaluate("Array.from(document.querySelectorAll('a'))"
                              ".map(a => a.href).filter(h => h.includes('colab.research'))")
        download = page.evaluate("Array.from(document.querySelectorAll('a'))"
                                 ".map(a => a.href).filter(h => h.endsWith('.ipynb'))")
    finally:
        page.close()
    assert links and all(link.endswith(f"/blob/main/chapters/{chapter}.ipynb") for link in links), (
        f"{chapter}: the Colab link should open chapters/{chapter}.ipynb, got {links}")
    assert any(link.endswith(f"{chapter}.ipynb") for link in download), (
        f"{chapter}: no download link for the notebook")


# The interactive figures: page, the id of the figure's block
# (annotated_transformer/interactive.py).
FIGURES = {"chapters/07_decoding.html": "interactive-translator-attention",
           "chapters/01_positional_encoding.html": "interactive-positional-encoding",
           "chapters/06_training.html": "interactive-learning-rate"}
# Those that replace a static image of the cell before (tagged static-twin) once drawn.
TWINS = ["chapters/01_positional_encoding.html", "chapters/06_training.html"]


def test_plotly_js_ships_once(built):
    scripts = sorted(p.relative_to(built).as_posix() for p in built.rglob("plotly*.js"))
    assert scripts == ["_static/plotly.min.js"], f"plotly.js should ship once, found {scripts}"
    banner = (built / scripts[0]).read_text(encoding="utf-8")[:200].split("\n")[1]
    assert "plotly.js" in banner, f"unexpected start of {scripts[0]}: {banner!r}"
    for page in built.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert banner not in text, f"{page.relative_to(built)} embeds plotly.js"
        has_figure = 'class="interactive-figure"' in text
        assert has_figure == ("_static/plotly.min.js" in text), (
            f"{page.relative_to(built)}: plotly.js must load exactly where a figure is "
            f"(figure: {has_figure})")
    for path, element in FIGURES.items():
        assert f'id="{element}"' in (built / path).read_text(encoding="utf-8"), (
            f"{path}: no interactive figure {element}")


def figure_on(browser, site: str, path: str):
    page, failed = open_page(browser, f"{site}/{path}")
    figure = page.locator(f"#{FIGURES[path]}")
    assert not failed, f"{path}: requests failed or left the machine: {failed}"
    assert figure.evaluate("el => el.classList.contains('js-plotly-plot')"), (
        f"{path}: plotly.js did not draw the figure {FIGURES[path]}")
    figure.scroll_into_view_if_needed()
    return page, figure


def point_at(page, figure, suffix: str, x: float, y: float):
    """Move the pointer over data point (x, y) of the axes ``x<suffix>``/``y<suffix>``;
    the hover label's locator."""
    px, py = figure.evaluate("(el, [s, x, y]) => {const xa = el._fullLayout['xaxis' + s], "
                             "ya = el._fullLayout['yaxis' + s]; "
                             "return [xa._offset + xa.l2p(x), ya._offset + ya.l2p(y)];}",
                             [suffix, x, y])
    label = figure.locator(".hoverlayer .hovertext")
    page.mouse.move(0, 0)  # away first, so that no earlier label is read
    expect(label).to_have_count(0)
    box = figure.bounding_box()
    page.mouse.move(box["x"] + px, box["y"] + py)
    return label


SHOWN = ("el => el.data.filter(t => t.visible === true).map(t => ({name: t.name, z: t.z, "
         "x: t.xaxis, y: t.yaxis}))")


def test_attention_switches_layer_and_head_and_reads_weights(site, browser):
    page, figure = figure_on(browser, site, "chapters/07_decoding.html")
    try:
        before = figure.evaluate(SHOWN)
        assert [t["name"] for t in before] == [
            f"{kind}, layer 1, head 1" for kind in
            ("encoder self-attention", "decoder self-attention", "cross-attention")]
        pixels = figure.locator(".cartesianlayer").screenshot()
        labels = figure.locator(".slider-label")
        last = labels.nth(labels.count() - 1)
        box = last.bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        choice = last.text_content()  # e.g. "L3 H4"
        layer, head = choice[1:].split(" H")
        expect(figure.locator(".slider-group")).to_contain_text(f"layer and head: {choice}")
        after = figure.evaluate(SHOWN)
        assert all(t["name"].endswith(f"layer {layer}, head {head}") for t in after), after
        assert [t["z"] for t in after] != [t["z"] for t in before], "the maps did not change"
        assert figure.locator(".cartesianlayer").screenshot() != pixels, (
            "switching layer and head left the drawn maps as they were")
        for trace in after:  # one cell of each map: query, key and weight under the pointer
            suffix = trace["x"][1:]
            queries, keys = figure.evaluate(
                "(el, s) => [el._fullLayout['yaxis' + s].ticktext, "
                "el._fullLayout['xaxis' + s].ticktext]", suffix)
            row, column = len(queries) - 1, 1
            label = point_at(page, figure, suffix, column, row)
            expect(label).to_contain_text(f"{queries[row]} → {keys[column]}")
            expect(label).to_contain_text(f"weight {trace['z'][row][column]:.3f}")
            expect(label).to_contain_text(trace["name"])
    finally:
        page.close()


def test_positional_encoding_reads_position_dimension_and_value(site, browser):
    page, figure = figure_on(browser, site, "chapters/01_positional_encoding.html")
    try:
        d_model = len(figure.evaluate("el => el.data[0].z[0]"))
        for position, dimension in [(10, 5), (37, 64)]:
            pair = dimension // 2
            angle = position / 10000 ** (2 * pair / d_model)
            value = math.sin(angle) if dimension % 2 == 0 else math.cos(angle)
            label = point_at(page, figure, "", dimension, position)
            expect(label).to_contain_text(f"position {position}")
            expect(label).to_contain_text(f"dimension {dimension}")
            expect(label).to_contain_text(f"value {value:.4f}")
    finally:
        page.close()


def test_learning_rate_reads_step_and_rate(site, browser):
    page, figure = figure_on(browser, site, "chapters/06_training.html")
    try:
        names = figure.evaluate("el => el.data.map(t => t.name)")
        assert names == [f"d_model = {d}, warmup = {w}" for d, w in
                         [(512, 4000), (512, 8000), (256, 4000)]], names
        # in the warmup, at the peak, and in the decay (where the first two curves meet)
        for trace, step, d_model, warmup in [(0, 2000, 512, 4000), (0, 4000, 512, 4000),
                                             (2, 12000, 256, 4000)]:
            x = figure.evaluate("(el, [t, s]) => el.data[t].x.indexOf(s)", [trace, step])
            assert x >= 0, f"step {step} is not among the points of {names[trace]}"
            y = figure.evaluate("(el, [t, i]) => el.data[t].y[i]", [trace, x])
            label = point_at(page, figure, "", step, y)
            expect(label).to_contain_text(names[trace])
            # the pointer lands within a pixel (tens of steps): read which step it shows
            shown = re.search(r"step (\d+)rate (\S+)", label.text_content())
            assert shown, f"no step and rate in the label {label.text_content()!r}"
            hovered = int(shown.group(1))
            assert abs(hovered - step) <= 100, f"pointed at step {step}, the label says {hovered}"
            rate = d_model ** -0.5 * min(hovered ** -0.5, hovered * warmup ** -1.5)
            mantissa, exponent = f"{rate:.3e}".split("e")
            assert shown.group(2) == f"{mantissa}e{int(exponent)}", (
                f"step {hovered}: the label says rate {shown.group(2)}, the schedule {rate:.3e}")
    finally:
        page.close()


@pytest.mark.parametrize("path", TWINS)
def test_the_static_image_is_shown_once(site, browser, path):
    """Drawn, the figure hides the static image of the cell before; without JavaScript
    the static image and the figure's note stay."""
    page, figure = figure_on(browser, site, path)
    try:
        hidden = page.evaluate("Array.from(document.querySelectorAll('.tag_static-twin img'))"
                               ".map(i => getComputedStyle(i).display)")
        assert hidden == ["none"], f"{path}: static twin images after drawing: {hidden}"
    finally:
        page.close()
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(f"{site}/{path}")
        shown = page.evaluate("Array.from(document.querySelectorAll('.tag_static-twin img'))"
                              ".map(i => i.complete && i.naturalWidth > 0)")
        assert shown == [True], f"{path}: without JavaScript the static image should show"
        assert "drawn in the web book" in page.locator(f"#{FIGURES[path]}").inner_text()
    finally:
        context.close()
