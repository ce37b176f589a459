"""A full disk never loses the measurement (issue 24): a results folder without room is refused before anything
runs; ENOSPC at a flush keeps the summary without its samples, or writes it to the temp folder, says where, and
exits non-zero; SIGHUP keeps the partial record as SIGINT and SIGTERM do. Against the fake server."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest
from support import cpu_plan

from kvbench import records
from kvbench.core.errors import KvbenchError, UsageError
from kvbench.harness.run.runner import execute
from kvbench.testing.fakeserver import FakeConfig, FakeServer

Usage = namedtuple("Usage", "total used free")


def plan(tmp_path, model, url, **kw):
    p = cpu_plan(
        tmp_path / "results",
        model=str(model),
        machine="cpu-test",
        endpoints={None: url},
        concurrency=[2],
        num_requests=6,
        **kw,
    )
    p.agreement_prompts = p.canaries = 0
    return p


def test_a_results_folder_without_room_is_refused_before_anything_runs(tmp_path, monkeypatch, tiny_model):
    monkeypatch.setattr("shutil.disk_usage", lambda _: Usage(10 << 30, (10 << 30) - (1 << 20), 1 << 20))
    with FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512)) as srv:
        with pytest.raises(UsageError) as exc:
            plan(tmp_path, tiny_model, srv.base_url)
    assert "MiB free" in str(exc.value) and "--results" in str(exc.value) and "\n" not in str(exc.value)


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_enospc_at_a_flush_keeps_the_summary_and_says_where(tmp_path, monkeypatch, tiny_model):
    import pyarrow.parquet as pq

    with FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512)) as srv:
        p = plan(tmp_path, tiny_model, srv.base_url)
        monkeypatch.setattr(pq, "write_table", _full)  # every Parquet write meets a full disk
        with pytest.raises(KvbenchError) as exc:
            execute(p)
    paths = records.find_records(tmp_path / "results")
    assert len(paths) == 1 and str(paths[0]) in str(exc.value) and "full" in str(exc.value)
    assert exc.value.exit_code != 0
    doc = json.loads(paths[0].read_text())
    d = doc["dtypes"][0]
    assert d["status"] == "ok" and d["phases"][0]["summary"]["completed"] == 6  # the measurement is kept
    assert doc["samples"] is None and not list(paths[0].parent.glob("*.parquet"))


def test_when_no_write_fits_under_results_the_record_goes_to_the_temp_folder(tmp_path, monkeypatch, tiny_model):
    spare = tmp_path / "spare"
    spare.mkdir()
    real = records.storage.replace_atomic

    def full_under_results(path, write):
        if "results" in Path(path).parts:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, write)

    with FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512)) as srv:
        p = plan(tmp_path, tiny_model, srv.base_url)
        monkeypatch.setattr(records.storage, "replace_atomic", full_under_results)
        monkeypatch.setattr("tempfile.tempdir", str(spare))
        with pytest.raises(KvbenchError) as exc:
            execute(p)
    (kept,) = list(spare.glob("*.json"))
    assert str(kept) in str(exc.value)
    doc = json.loads(kept.read_text())
    assert doc["dtypes"][0]["phases"][0]["summary"]["completed"] == 6 and doc["status"] == "complete"


def test_sighup_keeps_the_partial_record(tmp_path, tiny_model):
    # A long phase against a slow fake server; SIGHUP (a closed terminal) arrives mid-load.
    with FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512, ttft_s=0.02, itl_s=0.002)) as srv:
        env = {**os.environ, "COLUMNS": "200"}
        env.pop("OPENAI_API_KEY", None)
        cmd = [sys.executable, "-m", "kvbench", "run", "--endpoint", srv.base_url, "--model", str(tiny_model)]
        cmd += ["--no-search", "--no-sweep", "--no-eval", "--repeat", "1", "--num-requests", "2000"]
        cmd += ["--concurrency", "2", "--results", str(tmp_path)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:

            def streamed() -> int:  # load requests stream (many writes); agreement requests answer in one
                return sum(1 for e in srv.log() if len(e["writes_s"]) > 1)

            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and streamed() < 20 and proc.poll() is None:
                time.sleep(0.5)
            assert streamed() >= 20, "the load never started"
            proc.send_signal(signal.SIGHUP)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err[-2000:]
    (path,) = records.find_records(tmp_path)
    doc = json.loads(path.read_text())
    assert doc["status"] == "interrupted" and "SIGHUP" in doc["stopped"]["detail"]
    assert doc["dtypes"][0]["phases"] and doc["dtypes"][0]["phases"][0]["summary"]["completed"] > 0
