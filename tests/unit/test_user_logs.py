"""kvbench against vLLM start-up logs as users paste them (tests/data/vllm-user-logs: consumer GPUs, cut-off args
lines, MTP and DFlash speculative decoding, starts that found no room), through the same code as
`capacity --from-log` (kvbench/cli/commands/fromlog_predict.py), with only the flags a user would pass (cases.toml).

check "kv": the KV accounting given the log's own pool, tokens and concurrency within 2%; "derivation": the whole
prediction (non-KV terms too) within 5% of the logged tokens where the log shows no pool; "failed": the log's pool
does not hold one request at max_model_len (vLLM refused to start). A case that misses is xfail with its reason.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kvbench.cli.commands.fromlog_hybrid import kv_terms
from kvbench.cli.commands.fromlog_predict import LogOverrides, log_prediction
from kvbench.core.logparse import parse_startup_log
from kvbench.specs.formats import get_format

LOGS = Path(__file__).parents[1] / "data" / "vllm-user-logs"
CASES = tomllib.loads((LOGS / "cases.toml").read_text())
GiB = 2**30


def predict(name: str):
    case = CASES[name]
    log = parse_startup_log((LOGS / name).read_text())
    flags = LogOverrides(
        model=case["model"],
        gpu=case["gpu"],
        vllm_version=case.get("vllm_version"),
        utilization=case.get("utilization"),
        max_num_batched_tokens=case.get("max_num_batched_tokens"),
        prefix_caching=case.get("prefix_caching"),
        tp=case.get("tensor_parallel_size"),
        kv_dtype=case.get("kv_dtype"),
        speculative=case.get("speculative"),
    )
    return log, log_prediction(log, LOGS / name, flags)


def _cases():
    for name, case in CASES.items():
        marks = [pytest.mark.xfail(strict=True, reason=case["xfail"])] if "xfail" in case else []
        yield pytest.param(name, id=Path(name).stem, marks=marks)


def test_every_log_has_a_case_and_the_set_is_what_the_issue_asks():
    files = {p.name for p in LOGS.glob("*.txt")}
    capacity = {n for n in files if parse_startup_log((LOGS / n).read_text()).has_capacity}
    assert set(CASES) == capacity and len(capacity) >= 9
    assert all(CASES[n]["source"].startswith("https://") for n in CASES)
    lines = {n: parse_startup_log((LOGS / n).read_text()).args_line for n in CASES}
    cut = [n for n, line in lines.items() if line is not None and line.cut]
    assert len(cut) >= 4, cut
    speculative = [n for n in CASES if "mtp" in n or "dflash" in n]
    assert len(speculative) >= 4


@pytest.mark.parametrize("name", list(_cases()))
def test_user_log(name):
    case = CASES[name]
    log, pred = predict(name)
    if case["check"] == "kv":
        assert log.available_kv_gib and log.kv_tokens
        row, _ = kv_terms(
            log, pred, get_format(pred.row.dtype), (log.available_kv_gib * GiB, "log"), pred_version(pred)
        )
        assert row.kv_tokens == pytest.approx(log.kv_tokens, rel=0.02)
        if log.max_concurrency is not None:  # a page may quote the token line alone
            assert row.max_concurrency == pytest.approx(log.max_concurrency, rel=0.02)
    elif case["check"] == "derivation":
        assert log.available_kv_gib is None and log.kv_tokens
        assert pred.row.kv_tokens == pytest.approx(log.kv_tokens, rel=0.05)
    else:
        row, _ = kv_terms(
            log, pred, get_format(pred.row.dtype), (log.available_kv_gib * GiB, "log"), pred_version(pred)
        )
        assert row.max_concurrency < 1, row.max_concurrency


def pred_version(pred) -> str:
    return pred.inputs.value("vllm_version")


def test_a_cut_args_line_is_completed_by_the_engine_line():
    """Issue 642: the args line stops after 'served_model_name', the engine line says TP 2, fp8_e5m2, MTP 3."""
    log, pred = predict("club-3090-issue-642-qwen3.6-27b-int4-mtp3-2x3090.txt")
    inputs = pred.inputs
    assert log.args_line.cut and log.args_line.last_key == "quantization"
    assert inputs["tensor_parallel_size"].value == 2 and inputs["tensor_parallel_size"].source == "engine line"
    assert inputs["kv_cache_dtype"].value == "fp8_e5m2" and inputs["kv_cache_dtype"].source == "engine line"
    assert pred.speculative.method == "mtp" and pred.speculative.num_tokens == 3
    assert inputs["max_model_len"].source == "args" and inputs["vllm_version"].value == "0.24.0"
    assumed = {i.name for i in inputs.assumed()}
    assert {"gpu_memory_utilization", "max_num_batched_tokens", "block_size"} <= assumed
    assert all("cut after 'quantization'" in inputs[n].source for n in ("gpu_memory_utilization", "block_size"))
    # MTP: the conv state keeps 3 more positions, so the raised block is 1,600 tokens, not 1,568
    assert pred.row.block_size == 1600
