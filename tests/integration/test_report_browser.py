"""The report in a real browser: headless Debian Chromium loads the dashboard and an
episode page from local files, with no console error, the four charts drawn, a screenshot
that is not blank, and a model's `<script>` shown as text, never run."""

from __future__ import annotations

import io
import shutil

from tests.browser import Browser
from tests.report_run import INJECTION
from tracerl.report.html import CURVES, GAP_CURVE, write_report


def _not_blank(png: bytes) -> tuple[int, float]:
    from PIL import Image, ImageStat

    image = Image.open(io.BytesIO(png)).convert("L")
    colours = len(image.getcolors(maxcolors=1 << 16) or [])
    return colours, ImageStat.Stat(image).stddev[0]


def test_the_report_renders_in_headless_chromium(scripted_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(scripted_run, run)
    index = write_report(run)
    injected = [p for p in (index.parent / "episodes").glob("*.html") if "__pwned" in p.read_text()]
    assert injected, "the report links no episode with the injected answer"
    with Browser() as browser:
        browser.load(index)
        assert browser.console_errors() == []
        assert browser.evaluate("document.documentElement.dataset.ready") == "1"
        charts = browser.evaluate(
            "Array.from(document.querySelectorAll('figure.curve')).map(f => [f.dataset.curve,"
            " f.querySelectorAll('svg.chart circle').length, f.querySelector('svg.chart')"
            ".getBoundingClientRect().height])"
        )
        # the scripted run's sampler log-probs are made up (-1): its gap curve is drawn too
        assert [c[0] for c in charts] == [*CURVES, GAP_CURVE]
        assert all(points > 0 and height > 100 for _, points, height in charts), charts
        png = browser.screenshot()
        (run / "report" / "screenshot.png").write_bytes(png)
        colours, spread = _not_blank(png)
        assert colours > 20 and spread > 5, (colours, spread)
        # the legend toggles a series (the page's one script runs under its CSP)
        hidden = browser.evaluate(
            "(() => { const b = document.querySelector('.legend-item'); b.click();"
            " return document.querySelectorAll('g.series.hidden').length; })()"
        )
        assert hidden >= 1
        for page in injected:
            browser.load(page)
            assert browser.console_errors() == []
            assert browser.evaluate("typeof window.__pwned") == "undefined"
            text = browser.evaluate("document.body.innerText")
            assert "<script>window.__pwned=1</script>" in text  # shown as text
            assert INJECTION.split("<img")[0] in text
