"""A damaged file is named with its path and skipped or refused, never believed: a truncated or `{}` asv
result cannot move a regression baseline, a run record with a string, a zero or binary bytes where a
number belongs is one line and exit 2 (or a warning where other records can go on, and exit 2 at the end), never a
traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import committed_results, kvbench, kvbench_here

from kvbench import records

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = committed_results()
# a kvbench.run/1 record (older records must stay readable): a committed one, its requests cut to 3 per phase
RECORD = ROOT / "tests" / "data" / "v1-record.json"


def one_line(out, code=2) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code and len(lines) == 1 and "Traceback" not in out.stderr, (
        out.returncode,
        out.stderr[-2000:],
    )
    return lines[0]


@pytest.fixture
def history(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(COMMITTED, results, ignore=shutil.ignore_patterns("logs", "peer"))
    shutil.copy(ROOT / "asv.conf.json", tmp_path / "asv.conf.json")
    return results, tmp_path / "asv.conf.json"


def _newest_point(results: Path) -> Path:
    files = [p for p in (results / "cpu-amd-epyc").glob("*.json") if p.name != "machine.json"]
    return max(files, key=lambda p: json.loads(p.read_text())["date"])


@pytest.mark.parametrize("damage", ["truncated", "empty object", "string value"])
def test_a_damaged_asv_point_is_named_and_the_gate_refuses_to_judge(history, damage):
    results, conf = history
    point = _newest_point(results)
    text = point.read_text()
    if damage == "truncated":
        point.write_text(text[: len(text) // 2])
    elif damage == "empty object":
        point.write_text("{}")
    else:
        doc = json.loads(text)
        key = next(k for k in doc["results"] if "output_throughput" in k)
        doc["results"][key][0] = ["fast", "faster", "fastest"]
        point.write_text(json.dumps(doc))
    gate = kvbench_here("regress", "--results", str(results), "--config", str(conf))
    line = one_line(gate)
    assert str(point) in line and "corrupt asv result" in line and "regression" not in gate.stdout
    shown = kvbench("history", "show", "--config", str(conf), cwd=conf.parent)
    assert shown.returncode == 0 and str(point.name) in shown.stderr and "corrupt" in shown.stderr


def test_the_dashboard_names_a_damaged_point(history, tmp_path):
    from kvbench.dashboards.data import load

    results, conf = history
    point = _newest_point(results)
    point.write_text("{}")
    data = load(results, asv_conf=conf)
    assert any(str(point) in p for p in data.problems)


def _damaged_records(tmp_path: Path) -> dict[str, Path]:
    doc = json.loads(RECORD.read_text())
    runs = tmp_path / "results" / "cpu-x" / "runs"
    runs.mkdir(parents=True)
    cases = {}
    for name, change in {
        "string tokens": lambda d: d["dtypes"][0]["capacity"]["engine"].update(kv_tokens="lots"),
        "zero tokens": lambda d: d["dtypes"][0]["capacity"]["engine"].update(kv_tokens=0),
        "string ttft": lambda d: d["dtypes"][0]["phases"][-1]["summary"]["ttft_ms"].update(p95="slow"),
        "bad date": lambda d: d.update(created_at="yesterday"),
    }.items():
        damaged = json.loads(json.dumps(doc))
        change(damaged)
        path = runs / f"{name.replace(' ', '-')}.json"
        path.write_text(json.dumps(damaged))
        cases[name] = path
    binary = runs / "binary.json"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" + bytes(range(256)))
    cases["binary"] = binary
    return cases


def test_damaged_records_are_one_line_in_report_and_skipped_by_claims_and_compare(tmp_path):
    cases = _damaged_records(tmp_path)
    for name, path in cases.items():
        line = one_line(kvbench_here("report", str(path)))
        assert str(path) in line, name
    run_id = json.loads(RECORD.read_text())["run_id"]
    shutil.copy(RECORD, tmp_path / "results" / "cpu-x" / "runs" / f"{run_id}.json")
    # what can be shown without the damaged records is shown; then exit 2 naming how many were left out
    claims = kvbench_here("claims", "--results", str(tmp_path / "results"))
    assert claims.returncode == 2 and all(str(p) in claims.stderr for p in cases.values())
    assert claims.stdout and f"{len(cases)} run records could not be read" in claims.stderr.splitlines()[-1]
    compare = kvbench_here("compare", run_id, run_id, "--results", str(tmp_path / "results"))
    assert compare.returncode == 2 and compare.stdout, compare.stderr[-2000:]
    assert "skipped" in compare.stderr and "Traceback" not in compare.stderr


def test_v1_records_read_as_v2_with_their_requests_still_reachable():
    record = records.read_record(RECORD)
    assert record.schema_ == records.SCHEMA_V1 and record.dtypes and record.definitions
    fixed = record.dtypes[0].phase(records.PhaseKind.FIXED)
    assert fixed is not None and fixed.requests > 0 and fixed.concurrency
    frame = records.samples_frame([RECORD])
    assert len(frame) == sum(p.requests for d in record.dtypes for p in d.phases)
    assert {"ttft_s", "chunk_arrivals_s", "kv_cache_dtype", "phase"} <= set(frame.columns)
