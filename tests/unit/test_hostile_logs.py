"""Logs that lie (issue 24): a log holding two start-ups (a restarted container) is split at each start banner
and read one start-up at a time, never mixed; lines built to make the capacity patterns backtrack are read in
linear time; a "log" that never ends is refused in one line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support import cli
from typer.testing import CliRunner

from kvbench.cli.app import app
from kvbench.core.logparse import engine_failure, parse_capacity, parse_startup_log, split_startups, startup_error

LOGS = Path(__file__).parents[1] / "data" / "vllm-startup-logs"
FIRST = LOGS / "microsoft-phi-2--h100-80gb--tp1pp1dp1--2048.txt"
SECOND = LOGS / "meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.txt"
ARGS = ["capacity", "--vllm-version", "0.19.0", "--json"]


def from_log(path: Path, *extra: str):
    out = CliRunner().invoke(app, [*ARGS, "--from-log", str(path), *extra], env={"COLUMNS": "250"})
    return out, (json.loads(out.stdout) if out.exit_code == 0 else None)


# -- 8. a log of two start-ups -----------------------------------------------------------------------------


def test_a_log_of_two_startups_is_read_as_its_last_complete_one(tmp_path):
    both = tmp_path / "restarted.log"
    both.write_text(FIRST.read_text() + SECOND.read_text())
    assert len(split_startups(both.read_text())) == 2
    out, doc = from_log(both)
    assert out.exit_code == 0, out.output
    _, alone = from_log(SECOND)
    assert doc["terms"] == alone["terms"]  # not a mix of the two: every term is the second start-up's
    assert doc["startups"] == 2 and doc["start"] == 2 and "last complete" in doc["start_note"]
    out, first = from_log(both, "--start", "1")
    _, first_alone = from_log(FIRST)
    assert out.exit_code == 0 and first["terms"] == first_alone["terms"] and first["start"] == 1


def test_an_incomplete_last_startup_is_skipped_and_a_bad_start_is_one_line(tmp_path, capsys):
    cut = SECOND.read_text().splitlines()
    incomplete = "\n".join(line for line in cut if "KV cache" not in line and "concurrency" not in line)
    both = tmp_path / "crashed-restart.log"
    both.write_text(FIRST.read_text() + incomplete + "\n")
    out, doc = from_log(both)
    _, first_alone = from_log(FIRST)
    assert out.exit_code == 0 and doc["start"] == 1 and doc["terms"] == first_alone["terms"]
    for bad in ("3", "0", "two"):
        code, _, err = cli(capsys, *ARGS, "--from-log", str(both), "--start", bad)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "--start" in err, err


def test_one_startup_logs_are_one_startup():
    for path in sorted(LOGS.glob("*.txt")):
        assert len(split_startups(path.read_text())) == 1, path.name


# -- 9. lines built to make the patterns backtrack -------------------------------------------------------------

HOSTILE = [
    "A" * 20_000,  # [A-Z]+ before " KV cache size" tried at every position: quadratic
    "A" * 20_000 + " KV cache size: 12 tokens",
    "G" * 20_000 + " KV cache size",
    "1" * 20_000 + " GiB for weights",
    "E" * 20_000 + "Error",
    "Maximum concurrency for " + "1" * 20_000,
    "Free memory on device (1/2 GiB) on startup. Desired GPU memory utilization is (0.9, 1 GiB). Actual usage is "
    + "1" * 20_000,
]


def test_hostile_lines_are_read_in_linear_time():
    lines = HOSTILE * 5
    text = "\n".join(lines)
    t0 = time.perf_counter()
    assert parse_capacity(lines) is None or parse_capacity(lines).kv_tokens == 12
    startup_error(lines)
    engine_failure(lines)
    parse_startup_log(text)
    split_startups(text)
    elapsed = time.perf_counter() - t0
    # linear: a few ms per line; the quadratic patterns took 12.5 s for one 20 kB upper-case line
    assert elapsed < 3.0, elapsed


def test_a_real_capacity_line_after_a_hostile_one_is_still_read():
    line = "(EngineCore pid=1) INFO [kv_cache_utils.py:1] GPU KV cache size: 476,016 tokens"
    cap = parse_capacity(["A" * 20_000, line, "Maximum concurrency for 8,192 tokens per request: 58.11x"])
    assert cap.device == "GPU" and cap.kv_tokens == 476_016 and cap.max_concurrency == pytest.approx(58.11)


def test_a_log_that_never_ends_is_one_line(tmp_path, capsys):
    for path in ("/dev/zero", str(tmp_path)):
        code, _, err = cli(capsys, *ARGS, "--from-log", path)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "--from-log" in err, (path, err)
