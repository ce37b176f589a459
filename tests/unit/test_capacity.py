"""Capacity model against hand-computed cases."""

import math

import pytest

from kvbench.core.units import GB, GiB
from kvbench.specs.capacity import budget_from_bytes, budget_from_gpu, capacity_row, capacity_table
from kvbench.specs.formats import get_format, parse_format_list
from kvbench.specs.gpus import get_gpu
from kvbench.specs.models import load_model
from kvbench.specs.vllm_memory import release, scheduler_knobs

LLAMA = load_model("llama-3.1-8b")


def test_article_case_56gb_4k():
    rows = capacity_table(LLAMA, parse_format_list("auto,fp8,nvfp4"), 4096, budget_from_bytes(56 * GB))
    auto, fp8, nvfp4 = rows
    # per user: 4096 tokens x 32 layers x {4096, 2048, 1152} B
    assert auto.bytes_per_user == 536_870_912
    assert fp8.bytes_per_user == 268_435_456
    assert nvfp4.bytes_per_user == 150_994_944
    assert (auto.users, fp8.users, nvfp4.users) == (104, 208, 370)
    # the article's formula with 0.5 B/elem for NVFP4
    assert nvfp4.naive_users == pytest.approx(56e9 / (2 * 32 * 8 * 128 * 4096 * 0.5))
    assert nvfp4.ratio_vs_auto == pytest.approx(nvfp4.max_concurrency / auto.max_concurrency)


def test_vllm_style_tokens_and_concurrency():
    # 1 GiB, block 128, context 1000 (not a multiple of the block): 8 blocks per request.
    row = capacity_row(LLAMA, get_format("auto"), 1000, budget_from_bytes(2**30), block_size=128)
    pool_block = 32 * 128 * 4096
    assert row.pool_block_bytes == pool_block
    assert row.num_blocks == 2**30 // pool_block == 64
    assert row.blocks_per_request == 8
    assert row.max_concurrency == 64 / 8
    assert row.kv_tokens == int(8 * 1000)


def test_sliding_window_caps_blocks():
    mistral = load_model("mistral-7b")
    row = capacity_row(mistral, get_format("auto"), 32768, budget_from_bytes(50 * GB), get_gpu("h100-sxm"))
    in_flight = 2 * scheduler_knobs(release(), get_gpu("h100-sxm")).max_num_batched_tokens
    assert row.blocks_per_request == math.ceil((4096 - 1 + in_flight) / 16) + 1 == 1281
    # a short context is never rounded past itself
    short = capacity_row(mistral, get_format("auto"), 1024, budget_from_bytes(50 * GB), get_gpu("h100-sxm"))
    assert short.blocks_per_request == 1024 // 16 + 1


def test_hybrid_groups_gpt_oss():
    oss = load_model("gpt-oss-120b")
    row = capacity_row(oss, get_format("auto"), 131072, budget_from_bytes(60 * GB), get_gpu("h200"))
    # 2 groups of 18 layers: one full (8192 blocks), one sliding-128 (1033 blocks)
    assert row.pool_block_bytes == 18 * 16 * (2 * 8 * 64 * 2)
    assert row.blocks_per_request == 8192 + (math.ceil((127 + 2 * 8192) / 16) + 1)


def test_budget_from_gpu_uses_torch_total_and_profiled_terms():
    h100 = get_gpu("h100-sxm")
    b = budget_from_gpu(h100, LLAMA, utilization=0.9, vllm_version="0.19.0")
    rank = b.estimate.stages[0]
    # vLLM's basis is the total torch reports (79.19 GiB), not the driver's 81,559 MiB
    assert rank.total.bytes == 79.19 * GiB
    expected = 79.19 * GiB * 0.9 - rank.weights.bytes - rank.activation.bytes - rank.non_torch.bytes
    assert b.kv_bytes == pytest.approx(expected)
    assert rank.activation.bytes > 1.5 * GiB and rank.non_torch.bytes > 0
    # --overhead-gb 0 means zero overhead, not "use the model"
    zero = budget_from_gpu(h100, LLAMA, utilization=0.9, overhead_bytes=0.0, vllm_version="0.19.0")
    assert zero.kv_bytes == pytest.approx(79.19 * GiB * 0.9 - rank.weights.bytes)
    spec = budget_from_gpu(h100, LLAMA, utilization=0.9, overhead_bytes=0.0, memory_basis="spec")
    assert spec.kv_bytes == pytest.approx(80e9 * 0.9 - LLAMA.weight_bytes - 128256 * 0 - rope_bytes(LLAMA))
    assert "GiB" in b.derivation and "GB" in b.derivation


def rope_bytes(model):
    return model.max_position_embeddings * model.rotary_dim * 2


def test_scheduler_defaults_by_device():
    v032 = release("0.32.0")
    assert scheduler_knobs(v032, get_gpu("a100-80gb")).max_num_seqs == 256  # vLLM keeps A100 off the large defaults
    assert scheduler_knobs(v032, get_gpu("h100-sxm")).max_num_seqs == 1024
    assert scheduler_knobs(v032, get_gpu("b200")).max_num_batched_tokens == 16384
    assert scheduler_knobs(release("0.19.0"), get_gpu("b200")).max_num_batched_tokens == 8192  # before 0.32's rule
    assert scheduler_knobs(v032, get_gpu("l40s")).max_num_seqs == 256
