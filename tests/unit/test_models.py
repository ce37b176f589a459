"""Model specs from config.json: shapes, layer kinds, parameter counts, weight bytes, bad input."""

import json

import pytest

from kvbench.core.datafiles import data_path
from kvbench.core.errors import UsageError
from kvbench.specs.models import catalog, from_config, load_model


@pytest.mark.parametrize("name", sorted(n for n, e in catalog().items() if "published_params_b" in e))
def test_param_count_matches_published(name):
    # kvbench counts parameters from the config alone; the vendor's figure is the check.
    published = catalog()[name]["published_params_b"]
    assert load_model(name).param_count / 1e9 == pytest.approx(published, rel=0.01)


def test_llama_8b_shape_and_weights():
    m = load_model("llama-3.1-8b")
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (32, 8, 128)
    assert {k.kind for k in m.layers} == {"full"}
    assert m.param_count == 8_030_261_248  # hand-summed: 32 x 218,112,000 + 2 x 525,336,576 + 4,096
    assert m.weight_bytes == 2 * m.param_count


def test_mistral_v01_is_all_sliding_window():
    m = load_model("mistral-7b")
    assert {(k.kind, k.window) for k in m.layers} == {("sliding", 4096)}


def test_gpt_oss_alternates_sliding_and_full():
    m = load_model("gpt-oss-120b")
    counts = {(k.kind, k.window): n for k, n in m.layer_counts().items()}
    assert counts == {("sliding", 128): 18, ("full", None): 18}
    assert m.head_dim == 64 and m.attention_sinks
    # experts in MXFP4 (4.25 bits), the rest bf16
    experts = m.params["experts"]
    assert m.weight_bytes == pytest.approx(experts * 4.25 / 8 + (m.param_count - experts) * 2)


def test_deepseek_is_mla_with_fp8_weights():
    m = load_model("deepseek-v3")
    assert m.is_mla and m.kv_lora_rank == 512 and m.qk_rope_head_dim == 64
    assert m.head_dim == 192
    assert "fp8" in m.weight_format
    # mostly 1-byte weights: between 1 and 1.01 bytes per parameter
    assert 1.0 < m.weight_bytes / m.param_count < 1.01


def test_qwen3_window_switched_off():
    m = load_model("qwen3-8b")
    assert {k.kind for k in m.layers} == {"full"}


def test_head_dim_and_kv_heads_defaults():
    m = from_config(
        {
            "num_hidden_layers": 2,
            "hidden_size": 256,
            "num_attention_heads": 4,
            "vocab_size": 100,
            "intermediate_size": 512,
        },
        name="t",
        source="t",
    )
    assert m.head_dim == 64 and m.num_kv_heads == 4  # no num_key_value_heads: multi-head attention


def test_path_and_directory(tmp_path):
    cfg = json.loads((data_path("models/llama-3.1-8b.json")).read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(tmp_path)).num_layers == 32
    assert load_model(str(tmp_path / "config.json")).num_layers == 32


@pytest.mark.parametrize(
    "drop, field",
    [("num_hidden_layers", "num_hidden_layers"), ("hidden_size", "hidden_size"), ("vocab_size", "vocab_size")],
)
def test_missing_field_is_named(tmp_path, drop, field):
    cfg = json.loads((data_path("models/llama-3.1-8b.json")).read_text())
    del cfg[drop]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match=f"lacks '{field}'"):
        load_model(str(path))


def test_invalid_json_and_bad_values(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_model(str(path))
    path.write_text(json.dumps({"num_hidden_layers": "two"}))
    with pytest.raises(UsageError, match="must be a positive integer"):
        load_model(str(path))


def test_unknown_model_lists_choices():
    with pytest.raises(UsageError) as err:
        load_model("llama-9")
    assert "llama-3.1-8b" in str(err.value) and "config.json" in str(err.value)
