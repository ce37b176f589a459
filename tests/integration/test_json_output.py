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
from support import KVBENCH, committed_results

ROOT = Path(__file__).resolve().parents[2]
RECORD = sorted((committed_results() / "cpu-amd-epyc" / "runs").glob("*.json"))[-1]
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


@pytest.fixture(scope="module")
def shipped_tree(tmp_path_factory):
    """A folder holding the committed results/ and asv.conf.json: the commands read what the repository ships,
    not what a `make run` added to the checkout since (issue 36)."""
    import shutil

    root = tmp_path_factory.mktemp("shipped")
    shutil.copytree(committed_results(), root / "results")
    shutil.copy(ROOT / "asv.conf.json", root / "asv.conf.json")
    return root


@pytest.mark.parametrize("name", list(COMMANDS))
def test_json_is_one_document_on_stdout(name, capfd, monkeypatch, shipped_tree):
    """In this process, with stdout captured at the file descriptor (capfd): what kvbench, its libraries and any
    child process write to fd 1 is there, as in a pipe."""
    from kvbench.cli.app import main

    monkeypatch.chdir(shipped_tree)
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exc:
        main([*COMMANDS[name], "--json"])
    out = capfd.readouterr()
    assert exc.value.code in (0, 1), out.err[-2000:]  # regress and claims --strict may exit 1 with a verdict
    doc = json.loads(out.out)  # raises if anything but one JSON document is on stdout
    assert isinstance(doc, (dict, list)) and doc


def test_a_pipe_into_json_tool_reads_it():
    """The same through a real pipe: `kvbench capacity ... --json | python -m json.tool`."""
    env = {**os.environ, "COLUMNS": "200"}
    kv = subprocess.Popen([*KVBENCH, *COMMANDS["capacity"], "--json"], cwd=ROOT, stdout=subprocess.PIPE, env=env)
    tool = subprocess.run([sys.executable, "-m", "json.tool"], stdin=kv.stdout, capture_output=True, text=True)
    kv.stdout.close()
    assert kv.wait(timeout=120) == 0 and tool.returncode == 0, tool.stderr
    assert json.loads(tool.stdout)["rows"]
