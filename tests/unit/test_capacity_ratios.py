"""The vs-auto column is vLLM's own ratio at the context asked (issue 41 part 6; vLLM issue 55196): 2x for fp8 on
dense attention, less on a Gated DeltaNet / Mamba hybrid, whose recurrent state does not shrink with the KV dtype
and pins the page size, down to 1.00x at a context one attention block holds."""

from __future__ import annotations

import json

import pytest
from support import cli


def _ratios(capsys, model: str, context: int) -> dict[str, float]:
    code, out, err = cli(
        capsys,
        "capacity",
        "--model",
        model,
        "--gpu",
        "h100-sxm",
        "--context",
        str(context),
        "--kv-dtype",
        "auto,fp8",
        "--kv-budget-gb",
        "40",
        "--json",
    )
    assert code == 0, err
    return {r["dtype"]: r["ratio_vs_auto"] for r in json.loads(out)["rows"]}


def test_dense_attention_is_twice_at_any_context(capsys):
    for context in (512, 32768):
        assert _ratios(capsys, "llama-3.1-8b", context)["fp8"] == pytest.approx(2.0, rel=0.01)


def test_a_hybrids_fp8_ratio_follows_the_context(capsys):
    short = _ratios(capsys, "qwen3.5-27b", 512)["fp8"]
    long = _ratios(capsys, "qwen3.5-27b", 32768)["fp8"]
    assert short == pytest.approx(1.0, abs=0.005)  # one block per group either way: the pool holds as many requests
    assert 1.6 < long < 2.0  # the state pages stay, the attention pages halve


def test_the_claims_check_uses_the_same_ratio():
    from kvbench.analysis.claims import evaluate, load_claims
    from kvbench.specs.capacity import budget_from_bytes, capacity_table
    from kvbench.specs.formats import get_format
    from kvbench.specs.models import load_model

    claim = next(c for c in load_claims()["claims"] if c["id"] == "4x-users")
    rows = capacity_table(
        load_model(claim["model"]),
        [get_format(claim["dtype"])],
        claim["context"],
        budget_from_bytes(claim["kv_budget_gb"] * 1e9),
    )
    verdict = next(v for v in evaluate(load_claims()) if v.id == "4x-users")
    assert verdict.derived == pytest.approx(rows[0].ratio_vs_auto)
