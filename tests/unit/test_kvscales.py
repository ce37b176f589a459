"""KV scales as an axis (issue 43 part 4): where each dtype's scales come from, what a checkpoint's k_scale /
v_scale tensors hold (read from safetensors headers, weights untouched), the problems a run must say (zero,
NaN, negative, missing, not loaded: llm-compressor issue 2853), kvbench's calibrated copy in the form vLLM 0.32
loads, and the --kv-scales variants a run expands to."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import save_file

from kvbench.core import kvscales
from kvbench.core.errors import UsageError
from kvbench.harness.run import runfindings
from kvbench.harness.server import kvcalibrate, scales
from kvbench.records import parse_record
from kvbench.records.findings import FindingKind
from kvbench.tinymodel.build import committed_dir


def checkpoint(tmp_path, k: dict[int, float], v: dict[int, float], qcfg: dict | None = None, layers: int = 2):
    """A two-layer checkpoint folder holding only the given scale tensors (and one weight)."""
    folder = tmp_path / "ck"
    folder.mkdir()
    cfg = {"num_hidden_layers": layers, "model_type": "llama"}
    if qcfg is not None:
        cfg["quantization_config"] = qcfg
    (folder / "config.json").write_text(json.dumps(cfg))
    tensors = {"model.embed_tokens.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}
    for side, values in (("k", k), ("v", v)):
        for i, x in values.items():
            tensors[f"model.layers.{i}.self_attn.{side}_scale"] = torch.tensor(x, dtype=torch.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


CT = {"quant_method": "compressed-tensors", "kv_cache_scheme": dict(kvcalibrate.KV_CACHE_SCHEME)}


def test_a_checkpoint_with_zero_nan_and_missing_scales_is_a_finding(tmp_path):
    folder = checkpoint(tmp_path, {0: 0.02, 1: 0.0}, {0: math.nan}, CT)
    ck = kvscales.read_checkpoint(folder)
    assert ck.kv_method == "compressed-tensors kv_cache_scheme" and ck.k == {0: pytest.approx(0.02), 1: 0.0}
    assert ck.problems == [
        "k_scale is zero in 1 of 2 layers (1)",
        "v_scale is not finite in 1 of 1 layers (0)",
        "no v_scale for 1 of 2 layers (1) (vLLM keeps 1.0 there)",
    ]
    block = scales.block("fp8", str(folder), [])
    assert block["source"] == kvscales.CHECKPOINT and block["problems"] == ck.problems
    assert block["checkpoint"]["k_scale"]["values"] == [pytest.approx(0.02), 0.0]
    doc = {
        "schema": "kvbench.run/2",
        "run_id": "r",
        "created_at": "2026-12-06T00:00:00+00:00",
        "machine": "m",
        "dtypes": [{"kv_cache_dtype": "fp8", "status": "ok", "scales": block}],
    }
    found = runfindings.scale_problems(parse_record(doc))
    assert [f.kind for f in found] == [FindingKind.SCALES] * 3
    assert found[0].text == "fp8: KV scales: k_scale is zero in 1 of 2 layers (1)" and found[0].dtype == "fp8"


def test_good_scales_are_no_finding_and_scales_without_a_kv_method_are_not_loaded(tmp_path):
    good = kvscales.read_checkpoint(checkpoint(tmp_path, {0: 0.02, 1: 0.03}, {0: 0.01, 1: 0.01}, CT))
    assert good.problems == [] and good.has_scales
    other = tmp_path / "other"
    other.mkdir()
    loose = kvscales.read_checkpoint(checkpoint(other, {0: 0.02, 1: 0.03}, {0: 0.01, 1: 0.01}))
    assert loose.kv_method is None and "no KV-cache method in quantization_config" in loose.problems[0]
    block = scales.block("fp8", loose.folder, [])
    assert block["source"] == kvscales.UNIT and "no KV-cache method to load them" in block["why"]


def test_each_dtype_says_where_its_scales_come_from():
    plain = str(committed_dir())  # the tiny model: no quantization_config, no scale tensors
    assert scales.block("auto", plain, [])["source"] == kvscales.NONE
    assert scales.block("bfloat16", plain, [])["source"] == kvscales.NONE
    for dtype in ("fp8", "fp8_e5m2", "nvfp4", "nvfp4_4over6"):
        block = scales.block(dtype, plain, [])
        assert block["source"] == kvscales.UNIT and block["checkpoint"] is None and block["problems"] == [], dtype
    for dtype in ("int8_per_token_head", "fp8_per_token_head", "turboquant_k8v4", "ultraquant_4bit", "fp8_ds_mla"):
        assert scales.block(dtype, plain, [])["source"] == kvscales.DYNAMIC, dtype
    assert scales.block("fp8", None, None)["why"].startswith("vLLM's 1.0 (the served checkpoint was not read")


def test_vllms_own_lines_about_scales_are_kept_once():
    lines = [
        "INFO 12-06 [cache.py:360] Using fp8 data type to store kv cache. It reduces the GPU memory footprint and "
        "boosts the performance. Meanwhile, it may cause accuracy drop without a proper scaling factor",
        "WARNING 12-06 [kv_cache.py:164] Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended",
        "WARNING 12-06 [kv_cache.py:164] Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended",
        "INFO 12-06 [api_server.py:1] Started server process",
    ]
    assert len(kvscales.log_evidence(lines)) == 2
    assert scales.block("fp8", None, lines)["log"] == kvscales.log_evidence(lines)


def test_kvbench_calibrates_into_a_copy_vllm_loads_and_unit_strips_it(tmp_path):
    src = committed_dir()
    layer_scales = kvcalibrate.scales({0: [10.0, 7.0], 1: [11.2, 5.6]}, "fp8")
    assert layer_scales[0] == pytest.approx([10 / 448, 7 / 448])
    assert kvcalibrate.scales({0: [12.0, 6.0]}, "nvfp4")[0] == pytest.approx([12 / 2688, 6 / 2688])
    with pytest.raises(ValueError, match="takes no calibrated tensor scale"):
        kvcalibrate.scales({0: [1.0, 1.0]}, "int8_per_token_head")
    copy = kvcalibrate.write_copy(src, tmp_path / "cal", layer_scales)
    ck = kvscales.read_checkpoint(copy)
    assert ck.kv_method == "compressed-tensors kv_cache_scheme" and ck.problems == []
    assert ck.k == {0: pytest.approx(10 / 448), 1: pytest.approx(11.2 / 448)}
    assert (copy / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    cfg = json.loads((copy / "config.json").read_text())
    assert cfg["quantization_config"]["config_groups"] == {}  # no weight is quantized
    assert scales.block("fp8@calibrated", str(copy), [])["source"] == kvscales.CHECKPOINT
    assert scales.block("fp8@calibrated", str(copy), [])["variant"] == "calibrated"
    unit = kvcalibrate.unscaled(copy, tmp_path / "cache")
    back = kvscales.read_checkpoint(unit)
    assert not back.has_scales and back.kv_method is None and back.problems == []
    assert "quantization_config" not in json.loads((unit / "config.json").read_text())
    shutil.rmtree(copy)


def test_kv_scales_expand_only_the_tensor_scaled_dtypes():
    got = scales.expand(["auto", "fp8", "int8_per_token_head", "nvfp4", "fp8_inc"], ["checkpoint", "calibrated"])
    assert [label for label, _, _ in got] == [
        "auto",
        "fp8",
        "fp8@calibrated",
        "int8_per_token_head",
        "nvfp4",
        "nvfp4@calibrated",
        "fp8_inc",  # tensor-scaled, but kvbench has no codec to calibrate it with
    ]
    assert kvscales.base_dtype("nvfp4@calibrated") == "nvfp4" and kvscales.variant_of("nvfp4") is None
    assert scales.convention("fp8_e4m3") == "fp8" and scales.convention("nvfp4_4over6") == "nvfp4_4over6"
    assert scales.convention("turboquant_k8v4") is None


def test_the_kv_scales_flag_is_checked():
    from kvbench.harness.run.settings import RunSettings

    s = RunSettings.for_machine(False, kv_scales="unit,calibrated")
    assert s.kv_scales == ["unit", "calibrated"]
    with pytest.raises(UsageError, match="unknown --kv-scales variant 'measured'; choose from: calibrated"):
        RunSettings.for_machine(False, kv_scales="unit,measured")
    with pytest.raises(UsageError, match="drop it with --endpoint"):
        RunSettings.for_machine(False, kv_scales="calibrated", endpoints="http://127.0.0.1:9/")


def test_a_run_plans_one_server_per_dtype_and_variant_and_all_is_vllms_menu(tmp_path):
    """--kv-scales unit,calibrated on the tiny model (no scales: unit is the model as given) adds one
    dtype@calibrated server per tensor-scaled dtype, each planned as its dtype (emulated where nvfp4 is), with the
    tasks whose held-out items calibrate it; --kv-dtypes all is every --kv-cache-dtype the installed vLLM accepts."""
    from support import cpu_plan

    from kvbench.harness.server.vllm_info import accepted_kv_dtypes

    plan = cpu_plan(
        tmp_path, kv_dtypes=["auto", "fp8", "nvfp4", "int8_per_token_head"], kv_scales=["unit", "calibrated"]
    )
    assert plan.kv_dtypes == ["auto", "fp8", "fp8@calibrated", "nvfp4", "nvfp4@calibrated", "int8_per_token_head"]
    assert set(plan.emulated) == {"nvfp4", "nvfp4@calibrated", "int8_per_token_head"}
    assert plan.calibration_tasks == ["kvbench_needle_512", "kvbench_manykeys_512", "kvbench_track_512"]
    assert plan.as_dict()["kv_scales"] == ["unit", "calibrated"]
    everything = cpu_plan(tmp_path, kv_dtypes="all")
    assert sorted(everything.kv_dtypes) == sorted(accepted_kv_dtypes()) and everything.kv_dtypes[0] == "auto"
    assert not set(everything.unsupported) & set(everything.emulated)
    from kvbench.harness.run.settings import RunSettings

    with pytest.raises(UsageError, match="--kv-dtypes all is every dtype the installed vLLM accepts: give it alone"):
        RunSettings.for_machine(False, kv_dtypes="all,fp8")
