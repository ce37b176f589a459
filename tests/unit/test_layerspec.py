"""Per-layer KV specs of the 2026 families (kvbench/specs/layerspec.py) and vLLM's accounting of them
(kvbench/specs/vllm_accounting.py), against values worked from vLLM 0.32's source by hand."""

from __future__ import annotations

import math

import pytest

from kvbench.specs.capacity import budget_from_bytes, capacity_row, rank_model
from kvbench.specs.formats import get_format
from kvbench.specs.models import load_model

GiB = 2**30


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("qwen3.5-27b", {"mamba": 48, "full": 16}),
        ("qwen3.6-27b-nvfp4", {"mamba": 48, "full": 16}),
        ("qwen3.5-35b-a3b", {"mamba": 30, "full": 10}),
        ("qwen3.5-397b-a17b", {"mamba": 45, "full": 15}),
        ("qwen3-next-80b-a3b", {"mamba": 36, "full": 12}),
        ("nemotron-h-56b", {"mamba": 54, "full": 10}),
        ("nemotron-3-nano-30b-a3b", {"mamba": 23, "full": 6}),
        ("gpt-oss-20b", {"sliding": 12, "full": 12}),
        ("gpt-oss-120b", {"sliding": 18, "full": 18}),
        ("gemma-4-26b-a4b", {"sliding": 25, "full": 5}),
        ("llama-4-scout", {"chunked": 36, "full": 12}),
        ("deepseek-v3", {"mla": 61}),
        ("deepseek-v3.2", {"mla": 61}),
        ("deepseek-v4-flash", {"dsv4": 43}),
    ],
)
def test_layer_kinds_per_family(name, expected):
    counts: dict[str, int] = {}
    for kind, n in load_model(name).layer_counts().items():
        counts[kind.kind] = counts.get(kind.kind, 0) + n
    assert counts == expected


def test_gdn_state_bytes_per_rank():
    # Qwen3.6-27B: conv (4-1) x (2*16*128 + 48*128) bf16 + 48 x 128 x 128 fp32 (mamba_ssm_dtype)
    layer = next(k for k in load_model("qwen3.6-27b-nvfp4").layer_counts() if k.kind == "mamba")
    assert layer.state.bytes(2.0) == 3 * 10240 * 2 + 48 * 128 * 128 * 4
    tp4 = next(k for k in rank_model(load_model("qwen3.6-27b-nvfp4"), 4).layers if k.kind == "mamba")
    assert tp4.state.bytes(2.0) == 3 * 2560 * 2 + 12 * 128 * 128 * 4


def test_nemotron_mamba2_state_and_group_replication():
    layer = next(k for k in load_model("nemotron-h-56b").layers if k.kind == "mamba")
    # conv_dim = 256*64 + 2*8*256, ssm 256 x 64 x 256 in float32 (NemotronH default mamba_ssm_cache_dtype)
    assert layer.state.bytes(2.0) == (16384 + 4096) * 3 * 2 + 256 * 64 * 256 * 4
    # TP 16 > n_groups 8: groups replicated up to 16 (extra_groups_for_head_shards)
    tp16 = next(k for k in rank_model(load_model("nemotron-h-56b"), 16).layers if k.kind == "mamba")
    assert tp16.state.bytes(2.0) == (16384 + 2 * 16 * 256) // 16 * 3 * 2 + 16 * 64 * 256 * 4


def test_nemotron_3_nano_weights_are_about_32b_params():
    spec = load_model("nemotron-3-nano-30b-a3b")
    assert 30e9 < spec.param_count < 33e9
    assert spec.weight_bytes / GiB < 62


def test_hybrid_block_raise_padding_groups_and_token_forms():
    spec = load_model("qwen3.6-27b-nvfp4")
    budget = budget_from_bytes(100 * GiB)
    new = capacity_row(spec, get_format("auto"), 32768, budget, block_size=16, vllm_version="0.32.0")
    acc = new.accounting
    # attention 1 token = 2 x 4 x 256 x 2 B = 4096 B; state 3,207,168 B -> 16 x cdiv(3207168, 16 x 4096) = 784
    assert acc.block_size == 784 and acc.raised_from == 16
    assert acc.page_bytes == 784 * 4096 and acc.mamba_page_bytes == 3207168
    assert acc.group_size == 16 and acc.num_groups == 4
    assert acc.num_blocks == int(100 * GiB // (16 * 784 * 4096))
    # 1 full group x cdiv(32768, 784) + 3 GDN groups x 2 pages (align mode: 0.32 prefix caching on hybrids)
    assert acc.blocks_per_request == math.ceil(32768 / 784) + 3 * 2
    assert new.kv_tokens == int(acc.max_concurrency * 32768)
    old = capacity_row(spec, get_format("auto"), 32768, budget, block_size=16, vllm_version="0.19.0")
    # 0.19: GPU KV cache size = num_blocks // len(groups) x block size; mamba_cache_mode none (1 page)
    assert old.kv_tokens == old.accounting.num_blocks // 4 * 784
    assert old.blocks_per_request == math.ceil(32768 / 784) + 3
    fp8 = capacity_row(spec, get_format("fp8"), 32768, budget, block_size=16, vllm_version="0.32.0")
    assert fp8.block_size == 1568  # the attention page halves, so its block doubles
    assert 1.5 < fp8.max_concurrency / new.max_concurrency < 2.0  # the state does not shrink with fp8


def test_sliding_cap_in_flight_tokens_per_release():
    spec = load_model("gpt-oss-20b")
    budget = budget_from_bytes(40 * GiB)
    fmt = get_format("auto")
    new = capacity_row(spec, fmt, 32768, budget, max_num_batched_tokens=8192, vllm_version="0.32.0")
    old = capacity_row(spec, fmt, 32768, budget, max_num_batched_tokens=8192, vllm_version="0.19.0")
    # 0.32: window - 1 + 2 x 8192 in-flight tokens (async scheduling); before: one batch
    assert new.blocks_per_request == 2048 + math.ceil((127 + 16384) / 16) + 1
    assert old.blocks_per_request == 2048 + math.ceil((127 + 8192) / 16) + 1


def test_chunked_local_cap():
    spec = load_model("llama-4-scout")
    row = capacity_row(
        spec,
        get_format("auto"),
        131072,
        budget_from_bytes(40 * GiB),
        max_num_batched_tokens=8192,
        vllm_version="0.32.0",
    )
    # 36 chunked + 12 full -> group size 12: 3 chunked groups capped at chunk + in-flight, 1 full group
    assert row.blocks_per_request == 3 * math.ceil((8192 + 16384) / 16) + 131072 // 16


def test_sparse_mla_indexer_and_fp8_ds_mla():
    v32 = load_model("deepseek-v3.2")
    layer = v32.layers[0]
    assert layer.index_bytes == 128 + 4
    assert get_format("auto").bytes_per_token_per_layer(v32, layer) == 576 * 2 + 132
    assert get_format("fp8").bytes_per_token_per_layer(v32, layer) == 656 + 132
    v3 = load_model("deepseek-v3")
    assert get_format("fp8").bytes_per_token_per_layer(v3, v3.layers[0]) == 576


def test_per_token_head_dtypes():
    spec = load_model("llama-3.1-8b")
    layer = spec.layers[0]
    for name, per_head in (("int8_per_token_head", 2 * 128 + 8), ("int4_per_token_head", 128 + 8)):
        assert get_format(name).bytes_per_token_per_layer(spec, layer) == 8 * per_head


def test_gemma4_global_layers_have_their_own_heads():
    spec = load_model("gemma-4-26b-a4b")
    glob = next(k for k in spec.layer_counts() if k.kind == "full")
    assert (glob.kv_heads, glob.head_dim) == (2, 512)
    row = capacity_row(spec, get_format("auto"), 32768, budget_from_bytes(40 * GiB), vllm_version="0.32.0")
    # pages unified: sliding 8x256 vs global 2x512 per token -> the global layers' block doubles
    assert row.accounting.block_sizes[glob] == 32


def test_not_honoured_check_uses_the_models_own_ratio():
    from kvbench.specs.capacity import expected_ratio

    fp8, auto = get_format("fp8"), get_format("auto")
    dense = expected_ratio(load_model("llama-3.1-8b"), fp8, auto, 8192, 40 * GiB)
    hybrid = expected_ratio(load_model("qwen3.6-27b-nvfp4"), fp8, auto, 8192, 40 * GiB)
    assert dense == pytest.approx(2.0, rel=0.01)
    assert hybrid < 1.6  # the GDN state takes the same pages whatever the KV dtype


@pytest.mark.parametrize(
    ("name", "billions"),
    [("qwen3.5-27b", 27), ("qwen3.5-35b-a3b", 35), ("qwen3.5-397b-a17b", 397), ("qwen3-next-80b-a3b", 80)],
)
def test_gated_deltanet_parameter_counts_match_the_names(name, billions):
    # GDN layers' projections (not attention's) and the gated q_proj of the attention layers
    assert load_model(name).param_count / 1e9 == pytest.approx(billions, rel=0.03)
