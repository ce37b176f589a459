"""`kvbench history upgrade`: a kvbench.run/1 record (every request inside one JSON) rewritten as kvbench.run/2
reads back the same, summary and samples, and its agreement outputs become the requests table's agreement rows;
a rewrite that would lose a sample is undone and named; a second pass finds nothing to do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from support import DATA, ROOT, kvbench_here

from kvbench import records
from kvbench.records import storage

V1 = DATA / "v1-record.json"


NVML = {  # what a GPU run's v1 record kept of NVML: fields, then one row per sample
    "available": True,
    "interval_s": 0.1,
    "fields": ["t", "gpu", "power_w", "memory_used_bytes"],
    "samples": [[0.0, 0, 301.5, 7.1e10], [0.1, 0, 305.25, 7.2e10]],
}


def project(tmp_path: Path) -> Path:
    """A checkout holding one v1 record (its first dtype with NVML samples, as a GPU run's); returns its path."""
    shutil.copy(ROOT / "asv.conf.json", tmp_path / "asv.conf.json")
    runs = tmp_path / "results" / "cpu-x" / "runs"
    runs.mkdir(parents=True)
    doc = json.loads(V1.read_text())
    doc["dtypes"][0]["telemetry"] = NVML
    path = runs / f"{doc['run_id']}.json"
    path.write_text(json.dumps(doc))
    return path


def upgrade(tmp_path: Path):
    out = kvbench_here("history", "upgrade", "--config", str(tmp_path / "asv.conf.json"), "--json")
    return out, json.loads(out.stdout)


def test_a_v1_record_becomes_v2_and_reads_back_the_same(tmp_path):
    path = project(tmp_path)
    before = records.read_record(path)
    old = {t: records.samples_frame([path], t) for t in ("requests", "series")}
    assert before.schema_ == records.SCHEMA_V1 and len(old["requests"]) > 0 and len(old["series"]) > 0

    out, rows = upgrade(tmp_path)
    assert out.returncode == 0, out.stderr
    assert [r["record"] for r in rows] == [str(path)] and rows[0]["outcome"].startswith("kvbench.run/2")
    doc = json.loads(path.read_text())
    assert doc["schema"] == records.SCHEMA and all(
        "requests" not in p or isinstance(p["requests"], int) for d in doc["dtypes"] for p in d["phases"]
    )
    after = records.read_record(path)
    strip = {"schema", "samples"}
    assert {k: v for k, v in after.as_doc().items() if k not in strip} == {
        k: v for k, v in storage._micro(before.as_doc()).items() if k not in strip
    }
    new = records.samples_frame([path], "requests")
    agreement = new[new.phase_kind == "agreement"]
    v1 = json.loads(V1.read_text())
    kept = sum(len((d.get("agreement") or {}).get("samples") or []) for d in v1["dtypes"])
    assert kept > 0 and len(agreement) == kept  # v1 kept them in the summary; v2 in the requests table
    measured = new[new.phase_kind != "agreement"].reset_index(drop=True)
    for col in ("ttft_s", "e2e_s", "completion_tokens", "ok", "kv_cache_dtype", "phase"):
        pd.testing.assert_series_equal(measured[col], old["requests"][col], check_dtype=False)
    series = records.samples_frame([path], "series")
    metrics, nvml = series[series.source == "metrics"], series[series.source == "nvml"]
    pd.testing.assert_series_equal(metrics["value"].reset_index(drop=True), old["series"]["value"])
    assert sorted(nvml.value) == [301.5, 305.25, 7.1e10, 7.2e10] and set(nvml.kv_cache_dtype) == {"auto"}
    assert after.samples.request_rows == len(new) and after.samples.series_rows == len(old["series"]) + 4

    again, rows = upgrade(tmp_path)
    assert again.returncode == 0 and rows == []  # nothing left to rewrite


@pytest.mark.parametrize(
    "lose, named",
    [(slice(1, None), "requests: "), (slice(None, -1), "the agreement outputs differ")],
    ids=["a-request", "an-agreement-output"],
)
def test_a_rewrite_that_loses_a_sample_is_undone_and_named(lose, named, tmp_path, monkeypatch):
    path = project(tmp_path)
    original = path.read_bytes()
    write = storage.SampleStore.write

    def lossy(self, record_file):
        self.requests = self.requests[lose]  # the measured requests come first, the agreement outputs last
        return write(self, record_file)

    monkeypatch.setattr(storage.SampleStore, "write", lossy)
    out, rows = upgrade(tmp_path)
    assert out.returncode == 1
    (row,) = rows
    assert row["outcome"].startswith(f"left as kvbench.run/1: {named}"), row
    assert path.read_bytes() == original  # the v1 file as it was
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no Parquet left beside it


def test_a_damaged_v1_record_is_named_and_the_others_are_upgraded(tmp_path):
    good = project(tmp_path)
    doc = json.loads(good.read_text())
    doc["dtypes"][0]["capacity"]["engine"]["kv_tokens"] = "lots"
    bad = good.with_name("20261129T000000Z-cpu-x-000000.json")
    bad.write_text(json.dumps(doc))
    damaged = bad.read_bytes()
    out, rows = upgrade(tmp_path)
    assert out.returncode == 1
    by = {Path(r["record"]).name: r["outcome"] for r in rows}
    assert by[good.name].startswith("kvbench.run/2")
    assert by[bad.name].startswith("left as it was: ") and "kv_tokens" in by[bad.name], by
    assert bad.read_bytes() == damaged and json.loads(good.read_text())["schema"] == records.SCHEMA
