"""kvbench's KV accounting (kvbench/specs/vllm_accounting.py) against real vLLM start-up logs, given each log's own
pool.

The pool vLLM found ("Available KV cache memory") is taken from the log, so what is tested is the accounting
alone: per-layer specs, block size raised to the Mamba page, groups, num_blocks, the per-request cap and the
token form of the release. Tokens and concurrency must agree within 2%, or the case is xfail with its reason.
test_reference_logs.py tests the pool prediction itself.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from support import predict_reference_log

from kvbench.core.logparse import parse_startup_log
from kvbench.specs.capacity import budget_from_bytes, capacity_row, rank_model
from kvbench.specs.formats import get_format
from kvbench.specs.layerspec import with_mamba_ssm_dtype
from kvbench.specs.models import load_model

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
    if "mamba_ssm_dtype" in case:
        spec = with_mamba_ssm_dtype(spec, case["mamba_ssm_dtype"])
    return capacity_row(
        rank_model(spec, case.get("tensor_parallel_size", 1)),
        fmt,
        context,
        budget_from_bytes(pool),
        block_size=case.get("base_block_size", 16),
        max_num_batched_tokens=case.get("max_num_batched_tokens", 8192),
        vllm_version=case["vllm_version"],
        mamba_cache_mode=case.get("mamba_cache_mode"),
    )


@pytest.mark.parametrize(("name", "case"), list(_hybrid_cases()))
def test_hybrid_log_tokens_and_concurrency(name, case):
    log = parse_startup_log((HYBRID / name).read_text())
    model = case["model"]
    spec = load_model(str(HYBRID / model) if model.endswith(".json") else model)
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
    log, (spec, card, est, _, _) = predict_reference_log(path, REFERENCE_CASES)
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


def _from_log(tmp_path, text: str | None, *extra: str):
    import json

    from typer.testing import CliRunner

    from kvbench.cli.app import app

    path = HYBRID / "club-3090-issue-652-qwen3.6-35b-a3b-nvfp4-rtx5090.txt"
    if text is not None:
        path = tmp_path / "log.txt"
        path.write_text(text)
    out = CliRunner().invoke(app, ["capacity", "--from-log", str(path), *extra])
    return out, (json.loads(out.output) if out.exit_code == 0 and "--json" in extra else None)


def test_from_log_compares_the_hybrid_terms(tmp_path):
    flags = ("--model", "qwen3.6-35b-a3b-nvfp4", "--gpu", "rtx-5090", "--vllm-version", "0.24.0", "--json")
    out, data = _from_log(tmp_path, None, *flags)
    assert out.exit_code == 0, out.output
    terms = {t["term"]: t for t in data["kv_terms"]}
    assert terms["attention block size (tokens)"]["predicted"] == 2096
    assert terms["KV-cache groups"]["predicted"] == 4
    assert terms["reported token form"]["logged"] == terms["reported token form"]["predicted"] == "new"
    for term in ("KV tokens (group)", "max concurrency (x)"):
        assert terms[term]["predicted"] == pytest.approx(terms[term]["logged"], rel=TOLERANCE)
    # --kv-budget-gb is honoured: it replaces the pool of the KV accounting
    out, data = _from_log(tmp_path, None, *flags, "--kv-budget-gb", "3")
    pool = next(t for t in data["kv_terms"] if t["term"].startswith("KV pool"))
    assert pool["predicted"] == pytest.approx(3e9 / GiB, abs=0.01) and "--kv-budget-gb" in pool["how"]


def test_from_log_block_and_padding_lines_and_a_cut_settings_line(tmp_path):
    text = (
        "INFO non-default args: {'model_tag': 'Qwen/Qwen3.5-27B', 'max_model_len': 32768, 'tensor_par\n"
        "INFO Setting attention block size to 784 tokens to ensure that attention page size is >= mamba page size.\n"
        "INFO Padding mamba page size by 0.13% to ensure that mamba page size and attention page size are equal.\n"
        "INFO [kv_cache_utils.py:1319] GPU KV cache size: 290,864 tokens\n"
        "INFO [kv_cache_utils.py:1324] Maximum concurrency for 32,768 tokens per request: 33.04x\n"
    )
    # the cut line is read as far as it goes: the model and max_model_len before the cut, the rest assumed and named
    out, data = _from_log(tmp_path, text, "--gpu", "h200", "--vllm-version", "0.19.0", "--json")
    assert out.exit_code == 0, out.output
    assert data["inputs"]["max_model_len"] == {"value": 32768, "source": "args", "logged": None, "assumed": False}
    tp = data["inputs"]["tensor_parallel_size"]
    assert tp["assumed"] and tp["value"] == 1 and "cut after 'max_model_len'" in tp["source"]
    assert {"tensor_parallel_size", "kv_cache_dtype"} <= set(data["assumed"])
    assert data["args_line"] == {
        "whole": False,
        "last_key": "max_model_len",
        "keys_read": ["model_tag", "max_model_len"],
        "unreadable": [],
    }
    out, data = _from_log(
        tmp_path, text, "--gpu", "h200", "--model", "qwen3.5-27b", "--vllm-version", "0.19.0", "--json"
    )
    assert out.exit_code == 0, out.output
    terms = {t["term"]: t for t in data["kv_terms"]}
    assert terms["attention block size (tokens)"]["logged"] == terms["attention block size (tokens)"]["predicted"]
    assert terms["Mamba page padding (%)"]["logged"] == pytest.approx(terms["Mamba page padding (%)"]["predicted"])
    assert "cut after 'max_model_len'" in data["settings_cut"]
