"""The documentation site fits a 1280-pixel window: every page, opened in Chromium, is no wider
than the window, and nothing in its text scrolls sideways (no table, no code block): tables and
code wrap (docs/conf.py, docs/_static/fit.css).

The site is built here from docs/ (Sphinx, as ``bash scripts/docs.sh`` builds it; the docs
extra). Screenshot: ``docs-table.png``, the table of the kinds of limits on the Concepts page.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_lab import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _missing

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
WIDTH = 1280
# how wide the page is, and what in its text is wider than its box and scrolls
MEASURE = """() => ({
    width: document.documentElement.scrollWidth,
    scrolling: Array.from(document.querySelectorAll('article *'))
        .filter(node => node.scrollWidth > node.clientWidth + 1
                && ['auto', 'scroll'].includes(getComputedStyle(node).overflowX))
        .map(node => `${node.tagName.toLowerCase()}.${node.className}: `
                     + node.textContent.trim().slice(0, 60)),
})"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for module, package in (("sphinx", "sphinx"), ("myst_parser", "myst-parser"),
                            ("furo", "furo"), ("playwright", "playwright")):
        if importlib.util.find_spec(module) is None:
            _missing(f"{package} is not installed (pip install -e '.[docs,browser]')")
    if not Path(CHROMIUM).is_file():
        _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    out = tmp_path_factory.mktemp("docs-html")
    built = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html",
                            str(REPO / "docs"), str(out)], capture_output=True, text=True,
                           timeout=600, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    return out


@pytest.fixture(scope="module")
def page(site: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": WIDTH, "height": 900})
        finally:
            browser.close()
    finally:
        playwright.stop()


def test_every_page_fits_a_1280_pixel_window(site: Path, page: Any) -> None:
    pages = sorted(site.glob("*.html"))
    assert len(pages) > 10, pages
    too_wide = {}
    for path in pages:
        page.goto(path.as_uri())
        found = page.evaluate(MEASURE)
        if found["width"] > WIDTH or found["scrolling"]:
            too_wide[path.name] = found
    assert too_wide == {}, too_wide
    page.goto((site / "concepts.html").as_uri())
    table = page.locator("article table.docutils").first
    table.scroll_into_view_if_needed()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "docs-table.png").write_bytes(page.screenshot())
    box = table.bounding_box()
    assert box is not None and box["x"] + box["width"] <= WIDTH, box
