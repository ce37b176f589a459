"""scripts/ensure-chromium, which `make test` runs first (issue 42): the browser tests never skip in silence.
Present, it does nothing; absent and not installable, it stops with the command to run; skipped only on
purpose (KVBENCH_SKIP_BROWSER=1), saying so. (Installing is .ci/run's path and not run here.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure-chromium"


def ensure(**env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "KVBENCH_NO_INSTALL": "1", **env}
    return subprocess.run([str(SCRIPT)], env=full, capture_output=True, text=True, timeout=30)


def test_a_present_browser_needs_nothing():
    out = ensure(KVBENCH_CHROMIUM="/bin/sh", KVBENCH_CHROMEDRIVER="/bin/sh")
    assert out.returncode == 0 and not out.stdout and not out.stderr


def test_an_absent_browser_stops_make_test_with_the_command(tmp_path):
    out = ensure(KVBENCH_CHROMIUM=str(tmp_path / "chromium"), KVBENCH_CHROMEDRIVER="/bin/sh")
    assert out.returncode == 1 and "apt-get install -y chromium chromium-driver" in out.stderr
    assert "KVBENCH_SKIP_BROWSER=1" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_skipping_the_browser_is_said():
    out = ensure(KVBENCH_CHROMIUM="/nonexistent/chromium", KVBENCH_SKIP_BROWSER="1")
    assert out.returncode == 0 and "the browser tests will skip" in out.stderr
