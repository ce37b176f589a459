"""Every `--json` prints exactly one JSON document on stdout (progress and notes go to stderr), so
`kvbench ... --json | python -m json.tool` and `| jq` work. `kvbench run --json` is checked against the
fake server and real vLLM in test_endpoint.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORD = sorted((ROOT / "results" / "cpu-amd-epyc" / "runs").glob("*.json"))[-1]
LOG = ROOT / "tests" / "data" / "vllm-startup-logs" / "meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.txt"

COMMANDS = {
    "capacity": ["capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", "4096"],
    "capacity --from-log": ["capacity", "--from-log", str(LOG)],
    "plan": ["plan", "--model", "llama-3.1-8b", "--users", "32", "--context", "8192", "--gpus", "h100-sxm,h200"],
    "claims": ["claims"],
    "report": ["report", str(RECORD)],
    "history show": ["history", "show"],
    "regress": ["regress"],
    "compare": ["compare", "0.31.0", "0.32.0"],
    "kernels": ["kernels"],
    "accuracy": ["accuracy", "--no-real", "--formats", "fp8,nvfp4", "--scales", "1", "--context", "256", "--no-record"],
    "nightly --dry-run": ["nightly", "--dry-run", "--gpu", "h100-sxm"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_json_is_one_document_on_stdout(name):
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "kvbench", *COMMANDS[name], "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode in (0, 1), out.stderr[-2000:]  # regress and claims --strict may exit 1 with a verdict
    doc = json.loads(out.stdout)  # raises if anything but one JSON document is on stdout
    assert isinstance(doc, (dict, list)) and doc
    tool = subprocess.run([sys.executable, "-m", "json.tool"], input=out.stdout, capture_output=True, text=True)
    assert tool.returncode == 0
