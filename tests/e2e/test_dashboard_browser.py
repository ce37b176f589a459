"""The built pages in a real browser: headless Debian Chromium loads each from file://, with the network
closed. No console errors; every plot div drawn with data; injected markup never runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support import committed_results

from kvbench.dashboards import browser, site
from kvbench.dashboards import data as site_data

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("dashboard_sample", Path(__file__).parents[1] / "dashboard_sample.py")
sample = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sample)

WHY_NOT = browser.available()
pytestmark = [pytest.mark.browser, pytest.mark.skipif(WHY_NOT is not None, reason=f"no headless browser: {WHY_NOT}")]


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """Three sites, built once: sample records with history, the committed results, an empty folder."""
    root = tmp_path_factory.mktemp("browser")
    loaded = site_data.load(sample.write_results(root / "results"))
    loaded.history = sample.history_frame()
    loaded.history["when"] = loaded.history["run_started"]
    loaded.regressions = sample.regressions_frame(loaded.history)
    expected = {"sample": {p.slug: [d for d, _ in p.figures] for p in site.build_pages(loaded)}}
    site.write_site(loaded, root / "sample")
    committed = site_data.load(committed_results(), asv_conf=REPO / "asv.conf.json")
    expected["committed"] = {p.slug: [d for d, _ in p.figures] for p in site.build_pages(committed)}
    site.write_site(committed, root / "committed")
    (root / "empty-results").mkdir()
    empty = site_data.load(root / "empty-results")
    expected["empty"] = {p.slug: [d for d, _ in p.figures] for p in site.build_pages(empty)}
    site.write_site(empty, root / "empty")
    return root, expected


@pytest.fixture(scope="module")
def driver():
    with browser.chromium() as d:
        yield d


@pytest.mark.parametrize("which", ["sample", "committed", "empty"])
def test_pages_render_without_errors(sites, driver, which):
    root, expected = sites
    for slug, div_ids in expected[which].items():
        report = browser.inspect(driver, root / which / f"{slug}.html")
        assert report["errors"] == [], f"{which}/{slug}: console errors {report['errors']}"
        assert report["alert"] is None and not report["injected"], f"{which}/{slug}: injected markup ran"
        assert report["title"].endswith("kvbench")
        plots = {p["id"]: p for p in report["plots"]}
        assert sorted(plots) == sorted(div_ids), f"{which}/{slug}: plot divs {sorted(plots)} != {sorted(div_ids)}"
        for div_id, p in plots.items():
            assert p["drawn"] > 0, f"{which}/{slug}/{div_id} was not drawn"
            assert p["traces"] > 0 and p["with_points"] > 0, f"{which}/{slug}/{div_id} has no data: {p}"


def test_sample_site_has_plots_on_every_data_page(sites):
    _, expected = sites
    assert all(
        expected["sample"][slug] for slug in ("index", "history", "gpus", "capacity", "latency", "claims", "kernels")
    )
