"""Layer kinds a config names but kvbench cannot size are refused in one line (issue 42's probe: K-B15, N-P9,
N-P10, N-P18), never counted as full attention; the capacity summary names every kind it sized."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.core.errors import UsageError
from kvbench.specs.hfconfig import from_config
from kvbench.specs.models import describe_layers

DATA = Path(__file__).parents[2] / "kvbench" / "data" / "models"


def _shipped(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _qwen3_next() -> dict:
    return _shipped("qwen3-next-80b-a3b.json")


def _gpt_oss() -> dict:
    return _shipped("gpt-oss-20b.json")


def _load(raw: dict):
    return from_config(raw, "probe", "probe/config.json")


def _refused(raw: dict, *words: str) -> str:
    with pytest.raises(UsageError) as exc:
        _load(raw)
    text = str(exc.value)
    assert "\n" not in text
    for word in words:
        assert word in text, (word, text)
    return text


@pytest.mark.parametrize(
    ("base", "kind", "words"),
    [
        (_gpt_oss, "linear_attention_v9", ("'linear_attention_v9'", "full_attention", "sliding_attention")),
        (_gpt_oss, "sliding_attn", ("'sliding_attn'",)),
        (_qwen3_next, "foo_attention", ("'foo_attention'", "kinds:")),
    ],
)
def test_an_unknown_layer_kind_is_refused_naming_it(base, kind, words):
    raw = base()
    n = raw["num_hidden_layers"]
    raw["layer_types"] = [
        kind if i % 4 == 3 else ("full_attention" if base is _gpt_oss else "linear_attention") for i in range(n)
    ]
    _refused(raw, *words, "layers 3, 7")


def test_a_known_kind_without_its_fields_is_refused():
    raw = _qwen3_next()
    raw["layer_types"] = ["mamba" if i % 4 != 3 else "full_attention" for i in range(raw["num_hidden_layers"])]
    _refused(raw, "mamba", "'mamba_num_heads'")  # a Qwen3-Next config has no Mamba2 fields
    gpt = _gpt_oss()
    gpt["layer_types"] = ["linear_attention"] * 18 + ["full_attention"] * 6
    _refused(gpt, "linear_attention", "'linear_num_key_heads'")
    gpt["layer_types"] = ["chunked_attention"] * 12 + ["full_attention"] * 12
    _refused(gpt, "chunked_attention", "'attention_chunk_size'")
    gpt["layer_types"] = ["sliding_attention"] * 24
    gpt.pop("sliding_window")
    _refused(gpt, "'sliding_window'")


def test_an_empty_layer_types_is_refused():
    for base in (_gpt_oss, _qwen3_next):
        raw = base()
        raw["layer_types"] = []
        _refused(raw, "'layer_types' is empty")


def test_known_kinds_are_sized_as_such():
    raw = _gpt_oss()
    raw["layer_types"] = ["chunked_attention", "full_attention"] * 12
    raw["attention_chunk_size"] = 8192
    assert {k.kind for k in _load(raw).layers} == {"chunked", "full"}
    qn = _qwen3_next()
    qn["layer_types"] = ["linear_attention"] * 47 + ["full_attention"]
    assert describe_layers(_load(qn)).startswith("47 Gated DeltaNet, 1 full")


def test_summary_names_every_kind():
    from kvbench.specs.models import load_model

    assert describe_layers(load_model("qwen3-next-80b-a3b")) == "36 Gated DeltaNet, 12 full"
    assert describe_layers(load_model("nemotron-h-56b")) == "54 Mamba2, 10 full, 54 MLP/MoE only (no cache)"
    assert describe_layers(load_model("llama-4-scout")) == "36 chunked-local (8192 tok), 12 full"
    assert "full" not in describe_layers(_load({**_qwen3_next(), "full_attention_interval": 1000}))


def test_nemotron_groups_must_divide_heads_and_a_config_must_cache_something():
    raw = _shipped("nemotron-h-56b.json")
    _refused({**raw, "n_groups": 100_000}, "'n_groups' 100000", "'mamba_num_heads' 256")
    _refused({**raw, "n_groups": 3}, "'n_groups' 3")
    pattern = raw["hybrid_override_pattern"]
    _refused({**raw, "hybrid_override_pattern": "-" * len(pattern)}, "no layer of this config keeps a KV cache")
