"""The verdict on the built pages in headless Chromium at 1400x900: the Overview's verdict table is fully in
view without scrolling, and the Quality page's forest plot is drawn with data."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import committed_results

from kvbench.dashboards import browser, site
from kvbench.dashboards import data as site_data

REPO = Path(__file__).resolve().parents[2]
WHY_NOT = browser.available()
pytestmark = [pytest.mark.browser, pytest.mark.skipif(WHY_NOT is not None, reason=f"no headless browser: {WHY_NOT}")]

BOX_JS = """
const t = document.querySelector('table.verdict-table');
if (!t) return null;
const r = t.getBoundingClientRect();
return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
        vw: window.innerWidth, vh: window.innerHeight, scrollY: window.scrollY};
"""


@pytest.fixture(scope="module")
def committed_site(tmp_path_factory):
    out = tmp_path_factory.mktemp("verdict-site")
    site.write_site(site_data.load(committed_results()), out)
    return out


def test_the_overview_verdict_table_is_fully_visible_at_1400x900(committed_site, tmp_path):
    with browser.chromium(1400, 900) as driver:
        driver.set_window_size(1400, 900)
        driver.get((committed_site / "index.html").resolve().as_uri())
        browser.wait_for_plots(driver)
        box = driver.execute_script(BOX_JS)
        assert box is not None, "no verdict table on the Overview"
        assert box["scrollY"] == 0
        assert 0 <= box["top"] and box["bottom"] <= box["vh"], box
        assert 0 <= box["left"] and box["right"] <= box["vw"], box
        driver.save_screenshot(str(tmp_path / "overview.png"))


def test_the_quality_forest_plot_renders(committed_site):
    with browser.chromium(1400, 900) as driver:
        report = browser.inspect(driver, committed_site / "quality.html")
        assert report["errors"] == []
        forests = [p for p in report["plots"] if p["id"].startswith("quality-forest-")]
        assert forests and all(p["drawn"] > 0 and p["with_points"] > 0 for p in forests), report["plots"]
