"""kvbench's CPU emulated KV backend serving nvfp4 in a real vllm-cpu server: verify mode while the pool is full
and while prefix-cache blocks are reused; every other dtype stock with the plugin installed; stock vllm-cpu's nvfp4
refused before any server starts. (`tests/e2e/test_run_vllm.py` runs the CPU default's path with nvfp4 through
`kvbench run`, and checks its answers against plain transformers.)"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import aiohttp
import pytest
from support import CPU, CPU_ARGS, KVBENCH

from kvbench import records
from kvbench.harness.client.workload import Workload, make_prompts
from kvbench.harness.server.lifecycle import ServerConfig, VllmServer
from kvbench.kernels.vllm_plugin import ACTIVE_MARK, ENV_SWITCH, ENV_VERIFY


def _server(model: Path, dtype: str, log: Path, **env) -> VllmServer:
    cfg = ServerConfig(
        model=str(model),
        kv_cache_dtype=dtype,
        max_model_len=CPU["max_model_len"],
        extra_args=CPU_ARGS,
        env={"HF_HUB_OFFLINE": "1", **env},
        startup_timeout_s=CPU["startup_timeout_s"],
    )
    return VllmServer(cfg, log).start()


async def _complete(base_url: str, model: str, prompts: list[list[int]], max_tokens: int, logprobs=None) -> list[dict]:
    """All prompts at once (greedy, exact output length), each answer's choice."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:

        async def one(ids):
            body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            if logprobs is not None:
                body |= {"logprobs": logprobs, "return_token_ids": True}
            async with session.post(f"{base_url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                return (await resp.json())["choices"][0]

        return await asyncio.gather(*(one(ids) for ids in prompts))


def _prompts(model: Path, n: int, tokens: int, stream: int) -> list[list[int]]:
    w = Workload(prompt_tokens=tokens, output_tokens=1, num_requests=n)
    return [list(p.content) for p in make_prompts(w, model, stream=stream)]


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.vllm
def test_verify_mode_holds_with_the_pool_full_and_prefix_blocks_reused(tiny_model, tmp_path):
    log = tmp_path / "vllm-nvfp4-verify.log"
    server = _server(tiny_model, "nvfp4", log, **{ENV_VERIFY: "1"})
    try:
        server.wait_ready()
        cap = server.capacity()
        assert cap.kv_tokens == 29056  # 4 MiB of 18-byte rows: 3.55x auto's 8,192 (2.00x before the backend)
        fits = int(cap.kv_tokens // CPU["max_model_len"])
        # 1. more requests than the pool holds, all at once: admission waits and preemption, every page in use
        full = _prompts(tiny_model, fits + 24, 384, stream=1)
        answers = asyncio.run(_complete(server.base_url, str(tiny_model), full, 128))
        assert all(a["finish_reason"] == "length" for a in answers)
        # 2. a shared 256-token prefix: the first request caches it, the rest hit it (blocks reused, not rewritten)
        prefix = _prompts(tiny_model, 1, 256, stream=2)[0]
        tails = _prompts(tiny_model, 12, 128, stream=3)
        asyncio.run(_complete(server.base_url, str(tiny_model), [prefix + tails[0]], 8))
        asyncio.run(_complete(server.base_url, str(tiny_model), [prefix + t for t in tails[1:]], 8))
        import urllib.request

        metrics = urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10).read().decode()
        assert _metric(metrics, "vllm:prefix_cache_hits_total") >= 256 * 11
        assert server.alive()
    finally:
        server.stop()
    text = log.read_text(errors="replace")
    assert f"{ACTIVE_MARK} v2 active: nvfp4" in text and "verify mode on" in text
    verify = [line for line in text.splitlines() if f"{ACTIVE_MARK} verify:" in line]
    assert verify and all(line.endswith("0 mismatches") for line in verify)
    counts = [dict(re.findall(r"'(\w+)': (\d+)", line)) for line in verify]
    assert max(int(c["steps"]) for c in counts) > 200 and max(int(c["rows_written"]) for c in counts) > 10_000
    assert "differ from the reference writer" not in text and "not a decode of the pages" not in text
    assert "do not decode to the reference round trip" not in text


@pytest.mark.vllm
def test_auto_is_byte_for_byte_stock_with_the_plugin_installed(vllm_servers, tiny_model, tmp_path):
    with_plugin = vllm_servers.get("auto")  # kvbench is installed: its plugin registered CPU_ATTN's override
    prompts = _prompts(tiny_model, 8, 384, stream=4)
    got = asyncio.run(_complete(with_plugin.base_url, str(tiny_model), prompts, 32, logprobs=1))
    stock = _server(tiny_model, "auto", tmp_path / "vllm-auto-stock.log", **{ENV_SWITCH: "0"})
    try:
        stock.wait_ready()
        want = asyncio.run(_complete(stock.base_url, str(tiny_model), prompts, 32, logprobs=1))
    finally:
        stock.stop()
    assert [a["token_ids"] for a in got] == [a["token_ids"] for a in want]
    assert [a["logprobs"]["token_logprobs"] for a in got] == [a["logprobs"]["token_logprobs"] for a in want]
    assert ACTIVE_MARK not in (tmp_path / "vllm-auto-stock.log").read_text()


def test_stock_vllm_cpu_nvfp4_is_unsupported_before_any_server_starts(tiny_model, tmp_path):
    pytest.importorskip("vllm")
    env = {**os.environ, ENV_SWITCH: "0", "COLUMNS": "200"}
    t0 = time.monotonic()
    out = subprocess.run(
        [*KVBENCH, "run", "--model", str(tiny_model), "--kv-dtypes", "nvfp4", "--no-eval", "--results", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    elapsed = time.monotonic() - t0
    doc = records.load_record(records.find_records(tmp_path)[0])
    (d,) = doc["dtypes"]
    assert d["status"] == "unsupported" and not d["emulated"] and not d.get("server")
    assert "vllm-cpu 0.32.0 has no NVFP4 KV cache" in d["error"] and f"switched off ({ENV_SWITCH}=0)" in d["error"]
    assert not list(tmp_path.glob("*/logs/*/vllm-*.log"))  # no server was started for it
    took = datetime.fromisoformat(doc["finished_at"]) - datetime.fromisoformat(doc["created_at"])
    assert took.total_seconds() < 5, took  # recorded at once, not after a start-up and a segfault
    assert out.returncode == 1 and "unsupported" in out.stdout, (elapsed, out.stdout[-1500:])


def test_the_stock_bug_reproduces_at_op_level_in_seconds():
    """vllm-cpu's own cache-write op, called as its attention backend calls it, writes past an nvfp4 page
    (scripts/vllm_cpu_nvfp4_bug.py: no server, but vLLM's code)."""
    pytest.importorskip("vllm")
    script = Path(__file__).resolve().parents[2] / "scripts" / "vllm_cpu_nvfp4_bug.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr  # 1: reproduced
    assert "REPRODUCED" in out.stdout and "past the allocation's end" in out.stdout
