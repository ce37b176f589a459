"""A CPU run of the user's own model sizes its KV cache from the model and the run (harness/server/kvbudget.py), bounded
by free memory and said in the plan's notes; --kv-cache-memory-bytes wins; the built-in model keeps its 4 MiB.
No vLLM here: the plan is built with the installed vLLM's dtype list stubbed, the sizing checked by arithmetic."""

from __future__ import annotations

import pytest

from kvbench.core.datafiles import load_toml

CPU = load_toml("run_defaults.toml")["cpu"]
MiB = 2**20


@pytest.mark.vllm
def test_run_on_the_gqa_model_completes_on_cpu(tmp_path, gqa_model):
    """A user's own model on the CPU default: another shape (Qwen3 attention, 8 KV heads, head_dim 128), its KV
    cache sized from it (4 sequences of 512 tokens = 16 MiB), auto and fp8 both measured."""
    import os
    import subprocess
    import sys

    from kvbench import records

    pytest.importorskip("vllm")
    args = ["--model", str(gqa_model), "--kv-dtypes", "auto,fp8", "--num-requests", "8", "--concurrency", "4"]
    lean = ["--no-search", "--no-sweep", "--repeat", "1", "--no-eval", "--results", str(tmp_path)]
    out = subprocess.run(
        [sys.executable, "-m", "kvbench", "run", *args, *lean],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "CPU KV cache: 16,777,216 bytes" in out.stderr  # printed before anything starts
    (path,) = records.find_records(tmp_path)
    doc = records.load_record(path)
    assert any("sized for 4 sequences" in n for n in doc["config"]["notes"])  # and recorded
    args = doc["config"]["extra_args"]
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(16 * MiB)
    by = {d["kv_cache_dtype"]: d for d in doc["dtypes"]}
    assert by["auto"]["status"] == by["fp8"]["status"] == "ok", doc["dtypes"]
    # 16 MiB / 8 KiB per token at bf16; fp8 halves the bytes per token
    assert by["auto"]["capacity"]["engine"]["kv_tokens"] == 2048
    assert by["fp8"]["capacity"]["engine"]["kv_tokens"] == 4096
    assert records.headline(by["fp8"])["completed"] == 8
