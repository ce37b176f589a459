"""Speculative decoding as vLLM 0.32 sizes it (kvbench/specs/speculative.py): the drafter's KV layers and weights, the
recurrent state's extra conv positions and pages, and `capacity --speculative`."""

from __future__ import annotations

import json

import pytest
from support import cli

from kvbench.core.errors import UsageError
from kvbench.specs.capacity import budget_from_bytes, capacity_row, rank_model
from kvbench.specs.formats import get_format
from kvbench.specs.models import load_model
from kvbench.specs.speculative import parse_speculative, with_speculative

GiB = 2**30


def test_mtp_adds_the_configs_layers_and_grows_the_state():
    base = load_model("qwen3.5-27b")
    spec = parse_speculative("mtp:3", base)
    assert len(spec.layers) == base.mtp_layers == 1 and spec.layers[0].kind == "full" and spec.async_scheduling
    served = with_speculative(base, spec)
    assert served.num_layers == base.num_layers + 1 and served.speculative_tokens == 3
    gdn = next(k for k in served.layers if k.kind == "mamba")
    assert gdn.state.conv_len == next(k for k in base.layers if k.kind == "mamba").state.conv_len + 3
    assert served.params["speculative"] > 0
    # 17 full-attention layers now: group_size 17, 3 GDN groups; each GDN group keeps 2 + 3 pages (align)
    row = capacity_row(
        rank_model(served, 2),
        get_format("fp8"),
        262144,
        budget_from_bytes(11.05 * GiB),
        vllm_version="0.32.0",
        mamba_cache_mode="align",
    )
    assert row.accounting.group_size == 17 and row.block_size == 1600
    assert row.blocks_per_request == -(-262144 // 1600) + 3 * (2 + 3)


def test_deepseek_mtp_is_one_mla_layer():
    spec = parse_speculative("mtp", load_model("deepseek-v3"))
    assert [k.kind for k in spec.layers] == ["mla"] and spec.num_tokens == 1


def test_methods_without_a_drafter_and_estimates_say_so():
    base = load_model("llama-3.1-8b")
    ngram = parse_speculative("ngram:4", base)
    assert ngram.layers == () and not ngram.async_scheduling  # vLLM turns async scheduling off for ngram
    eagle = parse_speculative("eagle3:3", base)
    assert eagle.estimate and "estimate" in eagle.source and len(eagle.layers) == 1
    with pytest.raises(UsageError, match="no MTP layers"):
        parse_speculative("mtp", base)
    with pytest.raises(UsageError, match="draft_model:N@NAME"):
        parse_speculative("draft_model:4", base)
    with pytest.raises(UsageError, match="choose from"):
        parse_speculative("medusa2", base)
    with pytest.raises(UsageError, match="positive integer"):
        parse_speculative("mtp:0", load_model("qwen3.5-27b"))


def test_a_draft_model_brings_its_own_layers_and_head(capsys):
    base = load_model("llama-3.1-8b")
    spec = parse_speculative("draft_model:4", base, load_model("qwen3-0.6b"))
    assert len(spec.layers) == 28 and spec.extra_params > 0
    assert all(k.kv_heads is None or k.kv_heads != base.num_kv_heads for k in spec.layers)
    code, out, err = cli(
        capsys,
        "capacity",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--context",
        "8192",
        "--kv-dtype",
        "auto",
        "--speculative",
        "draft_model:4@qwen3-0.6b",
        "--json",
    )
    assert code == 0, err
    plain = cli(
        capsys,
        "capacity",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--context",
        "8192",
        "--kv-dtype",
        "auto",
        "--json",
    )[1]
    assert json.loads(out)["rows"][0]["kv_tokens"] < json.loads(plain)["rows"][0]["kv_tokens"]
