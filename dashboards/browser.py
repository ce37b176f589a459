"""Headless Chromium over the built site: console errors and rendered plots per page, and screenshots.

Uses Debian's `chromium` and `chromedriver` (never a downloaded browser: selenium-manager is bypassed by
giving both paths). The flags keep Chromium off the network, which is closed here anyway.

    python -m kvbench.dashboards.browser SITE_DIR --shots docs/   # screenshots of the overview and history pages
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--hide-scrollbars",
    "--disable-dev-shm-usage",
    "--allow-file-access-from-files",
)

# Every plotly div with its trace count and how many traces carry data points.
PLOTS_JS = """
// .plotly-graph-div: every figure div the page holds (plotly adds .js-plotly-plot only once it starts drawing)
return Array.from(document.querySelectorAll('.plotly-graph-div')).map(el => ({
  id: el.id,
  traces: (el.data || []).length,
  // _fullData: plotly's decoded view (el.data may hold base64 typed-array specs instead of arrays)
  with_points: (el._fullData || []).filter(t => t.visible !== false && \
((t.x && t.x.length) || (t.y && t.y.length))).length,
  drawn: el.querySelectorAll('.main-svg').length,
}));
"""


def available() -> str | None:
    """None when the browser test can run, else why not."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (apt-get install chromium chromium-driver)"
    if not Path(CHROMEDRIVER).exists():
        return f"{CHROMEDRIVER} is missing (apt-get install chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@contextmanager
def chromium(width: int = 1400, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="kvbench-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_argument(f"--window-size={width},{height}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for_plots(driver, timeout_s: float = 20.0) -> list[dict]:
    """Wait until every plot div has drawn its SVG (plotly draws after the page's load event)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ready = driver.execute_script("return document.readyState") == "complete"
        plots = driver.execute_script(PLOTS_JS)
        if (ready and all(p["drawn"] for p in plots)) or time.monotonic() > deadline:
            return plots
        time.sleep(0.1)


def inspect(driver, page: Path) -> dict:
    """Load one page from file:// and report {errors, plots, alert, title}."""
    driver.get(page.resolve().as_uri())
    plots = wait_for_plots(driver)
    alert = None
    try:
        alert = driver.switch_to.alert.text  # an injected alert() would be here
    except Exception:
        pass
    logs = driver.get_log("browser")
    errors = [entry["message"] for entry in logs if entry.get("level") == "SEVERE"]
    return {
        "errors": errors,
        "plots": plots,
        "alert": alert,
        "title": driver.title,
        "injected": driver.execute_script("return window.__kvbench_injected === true"),
    }


def screenshot(driver, page: Path, out: Path, full_height: bool = False) -> Path:
    driver.get(page.resolve().as_uri())
    wait_for_plots(driver)
    time.sleep(0.3)  # let plotly's transitions settle
    out.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", type=Path)
    ap.add_argument("--shots", type=Path, default=Path("docs"))
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1000)
    args = ap.parse_args(argv)
    why = available()
    if why:
        raise SystemExit(f"cannot drive Chromium: {why}")
    with chromium(args.width, args.height) as driver:
        for name, page in (("overview", "index"), ("history", "history")):
            out = screenshot(driver, args.site / f"{page}.html", args.shots / f"dashboard-{name}.png")
            print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
