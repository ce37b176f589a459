"""GPU planning: GPUs per dtype, tensor parallelism when weights do not fit, scheduler caps, cost."""

import math

from kvbench.capacity import budget_from_bytes, capacity_row
from kvbench.formats import get_format
from kvbench.gpus import get_gpu
from kvbench.models import load_model
from kvbench.plan import plan_row

LLAMA = load_model("llama-3.1-8b")


def test_article_buying_question_on_56gb():
    h100 = get_gpu("h100-sxm")
    fp16 = plan_row(LLAMA, get_format("auto"), h100, 400, 4096, 0.92, kv_budget_gb=56, price_per_hour=2.65)
    nvfp4 = plan_row(LLAMA, get_format("nvfp4"), h100, 400, 4096, 0.92, kv_budget_gb=56, price_per_hour=2.65)
    assert (fp16.tensor_parallel, fp16.gpus, fp16.users_per_replica) == (1, 4, 104)
    assert (nvfp4.gpus, nvfp4.users_per_replica) == (2, 370)
    assert nvfp4.usd_per_hour == 2 * 2.65


def test_model_too_big_for_one_gpu_uses_tensor_parallel():
    big = load_model("llama-3.1-70b")  # 141 GB of bf16 weights
    row = plan_row(big, get_format("fp8"), get_gpu("h100-sxm"), 10, 4096, 0.92)
    assert row.tensor_parallel >= 2 and row.gpus == row.tensor_parallel * row.replicas


def test_scheduler_cap_binds_on_a100():
    row = plan_row(LLAMA, get_format("nvfp4"), get_gpu("a100-80gb"), 1000, 1024, 0.92)
    kv = capacity_row(LLAMA, get_format("nvfp4"), 1024, budget_from_bytes(row.kv_budget_bytes), get_gpu("a100-80gb"))
    assert kv.users > 256
    assert row.limited_by == "max_num_seqs" and row.users_per_replica == 256
    assert row.replicas == math.ceil(1000 / 256)


def test_unsupported_dtype_is_reported():
    row = plan_row(load_model("deepseek-v3"), get_format("nvfp4"), get_gpu("h200"), 10, 4096, 0.92)
    assert not row.supported and "MLA" in row.reason and row.gpus is None


def test_budget_too_small_everywhere():
    row = plan_row(LLAMA, get_format("auto"), get_gpu("h100-sxm"), 10, 4096, 0.92, kv_budget_gb=0.0001)
    assert not row.supported and row.gpus is None and "no KV room" in row.reason
