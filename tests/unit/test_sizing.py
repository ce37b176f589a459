"""`kvbench capacity` and `kvbench plan` size the non-KV memory through one mapping of their shared sizing flags
(kvbench.specs.capacity.Sizing), so the same flags give the same vLLM accounting in both."""

from __future__ import annotations

from dataclasses import fields

import pytest

from kvbench.cli.commands.capacity_settings import CapacitySettings
from kvbench.cli.commands.plan_settings import PlanSettings
from kvbench.specs.capacity import Sizing
from kvbench.specs.formats import get_format
from kvbench.specs.gpus import get_gpu
from kvbench.specs.models import load_model
from kvbench.specs.plan import Layout, plan_row
from kvbench.specs.vllm_memory import predict_non_kv

FLAGS = dict(
    gpu_memory_utilization=0.85,
    pipeline_parallel_size=2,
    weights="fp8",
    vllm_version="0.32.0",
    max_num_seqs=64,
    max_num_batched_tokens=4096,
)


@pytest.mark.parametrize("settings", [CapacitySettings, PlanSettings])
def test_both_commands_declare_every_sizing_setting(settings):
    assert {f.name for f in fields(Sizing)} <= set(settings.model_fields)


def test_the_same_flags_give_the_same_sizing_in_capacity_and_plan():
    cap = CapacitySettings(model="llama-3.1-8b", gpu="h100-sxm", context=4096, **FLAGS)
    plan = PlanSettings(users=10, model="llama-3.1-8b", context=4096, **FLAGS)
    assert Sizing.of(cap) == Sizing.of(plan) == Sizing(**FLAGS)


def test_sizing_passes_every_setting_to_the_prediction():
    spec, gpu = load_model("llama-3.1-8b"), get_gpu("h100-sxm")
    got = Sizing(**FLAGS).non_kv(spec, gpu, 2, 8192)
    want = predict_non_kv(
        spec,
        gpu,
        utilization=0.85,
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        weights="fp8",
        vllm_version="0.32.0",
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        max_model_len=8192,
    )
    assert got.as_dict() == want.as_dict()
    assert got.as_dict() != Sizing().non_kv(spec, gpu, 2, 8192).as_dict()  # the settings matter


def test_a_plan_row_sizes_with_its_layouts_sizing_and_its_own_utilization():
    spec, gpu, fmt = load_model("llama-3.1-8b"), get_gpu("h100-sxm"), get_format("fp8")
    layout = Layout((2,), Sizing(pipeline_parallel_size=2, weights="fp8", max_num_batched_tokens=4096))
    row = plan_row(spec, fmt, gpu, 100, 4096, 0.85, max_num_seqs=64, layout=layout)
    est = Sizing(**FLAGS).non_kv(spec, gpu, 2, 4096)
    assert row.gpus == row.replicas * 4  # TP 2 x PP 2
    assert row.kv_budget_bytes == min(s.kv_pool.bytes for s in est.stages) * 2
