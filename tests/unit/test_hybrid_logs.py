"""kvbench's KV accounting (kvbench/vllm_accounting.py) against real vLLM start-up logs, given each log's own pool.

The pool vLLM found ("Available KV cache memory") is taken from the log, so what is tested is the accounting
alone: per-layer specs, block size raised to the Mamba page, groups, num_blocks, the per-request cap and the
token form of the release. Tokens and concurrency must agree within 2%, or the case is xfail with its reason.
test_reference_logs.py tests the pool prediction itself.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kvbench.capacity import budget_from_bytes, capacity_row, rank_model
from kvbench.commands.fromlog import LogOverrides, predict_for_log
from kvbench.formats import get_format
from kvbench.models import load_model
from kvbench.startuplog import parse_startup_log

DATA = Path(__file__).parents[1] / "data"
HYBRID = DATA / "vllm-hybrid-logs"
REFERENCE = DATA / "vllm-startup-logs"
HYBRID_CASES = tomllib.loads((HYBRID / "cases.toml").read_text())
REFERENCE_CASES = tomllib.loads((REFERENCE / "cases.toml").read_text())
TOLERANCE = 0.02
GiB = 2**30


def _hybrid_cases():
    for name, case in HYBRID_CASES.items():
        marks = [pytest.mark.xfail(strict=True, reason=case["xfail"])] if "xfail" in case else []
        yield pytest.param(name, case, id=Path(name).stem, marks=marks)


def _row(spec, case: dict, context: int, pool: float, log_dtype: str = "auto"):
    fmt = get_format(case.get("kv_cache_dtype", log_dtype))
    return capacity_row(
        rank_model(spec, case.get("tensor_parallel_size", 1)),
        fmt,
        context,
        budget_from_bytes(pool),
        max_num_batched_tokens=case.get("max_num_batched_tokens", 8192),
        vllm_version=case["vllm_version"],
        mamba_cache_mode=case.get("mamba_cache_mode"),
    )


@pytest.mark.parametrize(("name", "case"), list(_hybrid_cases()))
def test_hybrid_log_tokens_and_concurrency(name, case):
    log = parse_startup_log((HYBRID / name).read_text())
    spec = load_model(case["model"])
    context = log.tokens_per_request
    pool_gib = log.available_kv_gib or case.get("pool_gib")
    if pool_gib is not None:
        row = _row(spec, case, context, pool_gib * GiB, log.args.get("kv_cache_dtype", "auto"))
        assert row.max_concurrency == pytest.approx(log.max_concurrency, rel=TOLERANCE)
    else:  # the pool the log's concurrency implies: tests the group count, block size and token form
        probe = _row(spec, case, context, 1e12)
        blocks = round(log.max_concurrency * probe.blocks_per_request)
        row = _row(spec, case, context, blocks * probe.pool_block_bytes)
    assert row.kv_tokens == pytest.approx(log.kv_tokens, rel=TOLERANCE)
    if "block_size" in case:
        assert row.block_size == case["block_size"]


def _reference_cases():
    for path in sorted(REFERENCE.glob("*.txt")):
        log = parse_startup_log(path.read_text())
        if log.available_kv_gib and log.kv_tokens and log.max_concurrency:
            yield pytest.param(path, id=path.stem)


@pytest.mark.parametrize("path", list(_reference_cases()))
def test_reference_log_accounting_given_its_pool(path):
    """Every sliding-window / chunked / MLA / multimodal reference log (Gemma 2/3, gpt-oss, Llama 4 Scout,
    DeepSeek-V2, Kimi-VL, LLaVA...) agrees once the pool is the log's: the xfails of test_reference_logs.py
    are pool (non-KV memory) misses, not KV accounting."""
    case = REFERENCE_CASES.get(path.name, {})
    log = parse_startup_log(path.read_text())
    flags = LogOverrides(
        model=case.get("model"),
        gpu=case.get("gpu"),
        context=case.get("max_model_len"),
        utilization=case.get("utilization"),
        weights=case.get("weights"),
        vllm_version=case.get("vllm_version", REFERENCE_CASES["default_vllm_version"]),
    )
    spec, card, est, _, _ = predict_for_log(log, path, flags)
    part = rank_model(spec, est.tensor_parallel_size, est.stages[0].layers, est.dtype)
    dtype = log.args.get("kv_cache_dtype", "auto")
    row = capacity_row(
        part,
        get_format(dtype),
        log.tokens_per_request,
        budget_from_bytes(log.available_kv_gib * GiB),
        card,
        scheduler=est.scheduler,
        vllm_version=est.release.version,
    )
    assert row.kv_tokens == pytest.approx(log.kv_tokens, rel=TOLERANCE)
    assert row.max_concurrency == pytest.approx(log.max_concurrency, rel=TOLERANCE)
