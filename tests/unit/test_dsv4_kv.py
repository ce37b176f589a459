"""DeepSeek V4's KV layout (kvbench/specs/dsv4_kv.py) held to vLLM 0.32 itself: the per-layer specs come from vLLM's own
cache classes (DeepseekV4SWACache, CompressorStateCache, DeepseekV4IndexerCache, DeepseekV4Attention.
get_kv_cache_spec), built the way models/deepseek_v4/attention.py builds them for each layer of the shipped
DeepSeek-V4-Flash config, then grouped, pooled and counted by vLLM's own kv_cache_utils functions
(get_kv_cache_groups, get_kv_cache_config_from_groups, get_max_concurrency_for_kv_cache_config). kvbench's
accounting must give the same pool block, block count, concurrency and tokens."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from kvbench.specs.formats import get_format
from kvbench.specs.models import load_model
from kvbench.specs.speculative import parse_speculative, with_speculative
from kvbench.specs.vllm_accounting import account

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.models.deepseek_v4.attention")

GiB = 2**30


def vllm_specs(cfg: dict, mtp_layers: int = 0) -> dict:
    """{layer name: vLLM's KVCacheSpec} for every cache DeepSeek V4's layers register, from vLLM's classes."""
    from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention, DeepseekV4IndexerCache
    from vllm.models.deepseek_v4.compressor import CompressorStateCache
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    vc = VllmConfig()
    # _resolve_dsv4_kv_cache_dtype writes the canonical fp8_ds_mla back onto the cache config
    cache = CacheConfig(cache_dtype="fp8_ds_mla", block_size=256)
    vc.cache_config = cache
    head, index = cfg["head_dim"], cfg["index_head_dim"]
    n = cfg["num_hidden_layers"]
    ratios = [max(1, r) for r in cfg["compress_ratios"][:n]] + [1] * mtp_layers  # the MTP layer: ratio 1
    specs = {}
    with set_current_vllm_config(vc):
        for i, r in enumerate(ratios):
            p = f"model.layers.{i}.attn"
            if r > 1:  # DeepseekV4Attention.get_kv_cache_spec, with the fp8_ds_mla layout's attributes
                me = NS(compress_ratio=r, kv_cache_dtype="fp8_ds_mla", head_dim=head, kv_cache_torch_dtype=torch.uint8)
                specs[p] = DeepseekV4Attention.get_kv_cache_spec(me, vc)
            if r == 4:  # DeepseekV4Indexer: fp8 key + fp32 scale per 128 values, and its compressor
                key = DeepseekV4IndexerCache(
                    head_dim=index + index // 128 * 4,
                    dtype=torch.uint8,
                    prefix=f"{p}.indexer.k_cache",
                    cache_config=cache,
                    compress_ratio=r,
                )
                specs[key.prefix] = key.get_kv_cache_spec(vc)
                state = CompressorStateCache(4 * index, torch.float32, r, f"{p}.indexer.compressor.state_cache")
                specs[state.prefix] = state.get_kv_cache_spec(vc)
            swa = DeepseekV4SWACache(
                head_dim=head,
                window_size=cfg["sliding_window"],
                dtype=torch.uint8,
                prefix=f"{p}.swa_cache",
                cache_config=cache,
            )
            specs[swa.prefix] = swa.get_kv_cache_spec(vc)
            if r > 1:  # DeepseekCompressor: state_dim = 2 x coff x head_dim
                coff = 2 if r == 4 else 1
                state = CompressorStateCache(2 * coff * head, torch.float32, r, f"{p}.compressor.state_cache")
                specs[state.prefix] = state.get_kv_cache_spec(vc)
    return specs


def vllm_capacity(specs: dict, context: int, in_flight: int, pool_bytes: int):
    from vllm.v1.core import kv_cache_utils as U
    from vllm.v1.kv_cache_layout import KVCacheLayout

    # DeepseekV4IndexerBackend.supported_kv_cache_layouts: block-outermost BLHNC first
    cache_config = NS(
        get_resolved_kv_cache_layout=lambda: KVCacheLayout.BLHNC,
        num_gpu_blocks_override=None,
        prefix_cache_retention_interval=None,
    )
    vc = NS(
        scheduler_config=NS(disable_hybrid_kv_cache_manager=False),
        cache_config=cache_config,
        speculative_config=None,
        attention_config=NS(hisparse_config=None),
        model_config=NS(max_model_len=context),
        parallel_config=NS(decode_context_parallel_size=1),
        max_in_flight_tokens=in_flight,
    )
    groups = U.get_kv_cache_groups(vc, dict(specs))
    config = U.get_kv_cache_config_from_groups(vc, groups, pool_bytes)
    conc = U.get_max_concurrency_for_kv_cache_config(vc, config)
    return len(groups), U._get_kv_cache_bytes_per_block(groups, KVCacheLayout.BLHNC), config.num_blocks, conc


@pytest.fixture(scope="module")
def flash():
    import json

    from kvbench.core.datafiles import data_path

    cfg = json.loads(data_path("models/deepseek-v4-flash.json").read_text())
    return cfg, vllm_specs(cfg), vllm_specs(cfg, mtp_layers=1)


@pytest.mark.parametrize("context", [4096, 30000, 131072, 1048576])
@pytest.mark.parametrize("in_flight", [8192, 16384])
@pytest.mark.parametrize("mtp", [False, True])
def test_deepseek_v4_flash_matches_vllms_own_groups(flash, context, in_flight, mtp):
    _, specs, specs_mtp = flash
    pool = int(32.08 * GiB)
    groups, block_bytes, num_blocks, conc = vllm_capacity(specs_mtp if mtp else specs, context, in_flight, pool)
    model = load_model("deepseek-v4-flash")
    if mtp:
        model = with_speculative(model, parse_speculative("mtp:1", model))
    acc = account(model, get_format("fp8"), context, pool, 256, in_flight, "0.32.0")
    assert (len(acc.cache_groups), acc.pool_block_bytes, acc.num_blocks) == (groups, block_bytes, num_blocks)
    assert acc.max_concurrency == pytest.approx(conc, rel=1e-12)
    assert acc.kv_tokens == int(conc * context)


def test_the_five_groups_and_the_per_request_state_blocks():
    """Issue 51041's "5-group hybrid layout": the compressor states' tiny blocks dominate a short request."""
    acc = account(load_model("deepseek-v4-flash"), get_format("auto"), 4096, 32.08 * GiB, 16, 16384, "0.32.0")
    assert acc.block_size == 256 and len(acc.cache_groups) == 5 and acc.pool_block_bytes == 1_002_240
    assert [g.blocks_per_request for g in acc.cache_groups] == [65, 65, 16, 1025, 513]


def test_dtypes_deepseek_v4_refuses_and_accepts():
    model = load_model("deepseek-v4-flash")
    for ok in ("auto", "fp8", "fp8_ds_mla"):
        assert get_format(ok).unsupported_reason(model) is None
    for refused in ("nvfp4", "nvfp4_ds_mla", "int8_per_token_head"):
        assert "fp8_ds_mla layout" in get_format(refused).unsupported_reason(model)


def test_deepseek_v4_flash_weights_per_rank_with_mxfp4_experts():
    """expert_dtype "fp4" (the default): MXFP4 routed experts, the rest block-scaled fp8. uv-xiao/pto-cu's 2x H200
    starts (tests/data/vllm-user-logs) logged 'Model loading took 74.08 GiB' per rank at TP 2; counting the experts
    as fp8 gave 137 GiB."""
    from kvbench.specs.weights import weight_bytes_per_rank, weight_plan

    model = load_model("deepseek-v4-flash")
    (per_rank,) = weight_bytes_per_rank(model, weight_plan(model), tp=2)
    assert "MXFP4 experts" in model.weight_format
    assert per_rank / GiB == pytest.approx(74.08, rel=0.05)
