"""The committed records of the real models (issue 46): one per registry model, its provenance the registry's,
SmolLM2's fidelity as the issue asks (>= 20,000 positions per dtype and condition, a KLD interval narrower than
+-10%, nvfp4 above fp8 above the floors), and Gemma-3-270M's engine-reported capacity equal to kvbench's capacity
model, per dtype, with its layer groups. Each test picks the newest record of its model: the number of records
committed does not matter."""

from __future__ import annotations

import json

import pytest
from support import committed_results

from kvbench import realmodels


def newest(model: str) -> dict:
    found = []
    for path in sorted(committed_results().glob("*/runs/*.json")):
        doc = json.loads(path.read_text())
        if (doc.get("model_provenance") or {}).get("model") == model:
            found.append(doc)
    if not found:  # a model added to the registry gets its record in a later commit; the lead's list says which
        pytest.skip(f"no committed record of {model} under results/*/runs/ yet: kvbench run --model {model}")
    return max(found, key=lambda d: d["created_at"])


@pytest.mark.parametrize("model", sorted(realmodels.catalog()))
def test_each_real_model_has_a_committed_record_with_its_provenance(model):
    doc = newest(model)
    prov, entry = doc["model_provenance"], realmodels.entry(model)
    assert prov["weights"] == entry["weights"] and prov["package"] == entry["distribution"]
    if "sha256" in entry:
        assert prov["sha256"] == entry["sha256"]
    assert doc["config"]["model_name"] == model
    assert {d["kv_cache_dtype"] for d in doc["dtypes"]} >= {"auto", "fp8", "nvfp4"}


def _fid(doc: dict, dtype: str) -> dict:
    return next(d for d in doc["dtypes"] if d["kv_cache_dtype"] == dtype).get("fidelity") or {}


def test_smollm2_fidelity_is_what_the_issue_asks():
    doc = newest("smollm2-135m-instruct")
    auto = _fid(doc, "auto")
    floor = max(auto["load"]["mean_kld"], 0.0)  # batch variance: auto at load vs auto at rest
    for dtype in ("fp8", "nvfp4"):
        for condition in ("rest", "load"):
            s = _fid(doc, dtype)[condition]
            assert s["tokens"] >= 20_000, (dtype, condition)
            lo, hi = s["mean_kld_ci"]
            assert s["mean_kld"] * 0.9 < lo <= s["mean_kld"] <= hi < s["mean_kld"] * 1.1, (dtype, condition, s)
    fp8, nvfp4 = _fid(doc, "fp8")["rest"], _fid(doc, "nvfp4")["rest"]
    assert nvfp4["mean_kld_ci"][0] > fp8["mean_kld_ci"][1]  # nvfp4 above fp8 ...
    assert fp8["mean_kld_ci"][0] > floor  # ... above the floor
    assert fp8["mean_kld"] > auto["torch"]["mean_kld"]  # and above vLLM-vs-transformers at bf16


def test_gemma_engine_capacity_equals_the_capacity_model_per_dtype():
    doc = newest("gemma-3-270m")
    checked = 0
    for d in doc["dtypes"]:
        engine, model = d["capacity"].get("engine"), d["capacity"].get("model")
        if not engine or not model:
            continue
        assert engine["kv_tokens"] == model["kv_tokens"], d["kv_cache_dtype"]
        assert engine["max_concurrency"] == pytest.approx(model["max_concurrency"], abs=0.005)  # the log's 2 decimals
        groups = {g["kind"]: g for g in model["groups"]}
        assert (groups["sliding"]["layers"], groups["sliding"]["window"], groups["full"]["layers"]) == (15, 512, 3)
        checked += 1
    assert checked == 3
