"""The numerics registry (kernels/codecs.py): every kernel key with a `numerics` field resolves to a Codec whose
round trip is the module's own, and a registry entry naming a module that registers nothing is an error."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import codecs, fp8, mxfp4, nvfp4


def test_every_numerics_entry_resolves_to_its_codec():
    for key in codecs.keys():
        codec = codecs.get(key)
        assert codec.key == key
        if codec.pages:
            assert codec.vllm_dtype and codec.layout is not None


@pytest.mark.parametrize(
    ("key", "expect"),
    [
        ("fp16", lambda x, s: x.half().float()),
        ("bf16", lambda x, s: x.bfloat16().float()),
        ("fp8", lambda x, s: fp8.quant_dequant(x, s, "e4m3")),
        ("fp8_e5m2", lambda x, s: fp8.quant_dequant(x, s, "e5m2")),
        ("nvfp4", lambda x, s: nvfp4.quant_dequant(x, s)),
        ("nvfp4_4over6", lambda x, s: nvfp4.quant_dequant(x, s, four_over_six=True)),
        ("mxfp4", lambda x, s: mxfp4.quant_dequant(x)),
    ],
)
def test_wrapped_numerics_are_unchanged(key, expect):
    x = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(0)) * 3
    codec = codecs.get(key)
    scale = 0.37
    got = codec.quant_dequant(x, scale=scale) if codec.scaled else codec.quant_dequant(x)
    assert torch.equal(got, expect(x, scale if codec.scaled else 1.0))


def test_unknown_key_names_the_choices():
    with pytest.raises(ValueError, match="kernel keys with numerics: .*nvfp4"):
        codecs.get("int3")


def test_a_store_without_decode_is_refused():
    with pytest.raises(ValueError, match="needs its decode and layout"):
        codecs.register(codecs.Codec(key="x", quant_dequant=lambda x: x, scaled=False, store=lambda *a: None))


def test_page_layout_content_bytes():
    lay = nvfp4.page_layout(128)
    assert (lay.bytes_per_head, lay.content_bytes) == (2 * 72, 72)
    with pytest.raises(ValueError, match="divisible by 16"):
        nvfp4.page_layout(40)


# ---------------------------------------------------------------------------------------------
# The new formats' layouts and tables against vLLM's own code (the stores: tests/integration/test_bitexact_vllm.py)
# ---------------------------------------------------------------------------------------------

EMULATED = [
    "int8_per_token_head",
    "fp8_per_token_head",
    "int4_per_token_head",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "ultraquant_4bit",
]


def _codec(dtype):
    from kvbench.kernels import per_token_head, turboquant, ultraquant  # noqa: F401 (registers them)

    return codecs.get(dtype)


def _vllm_spec(dtype: str, head_size: int):
    """vLLM's own page spec for the dtype: its GPU backend's customize_spec on a FullAttentionSpec."""
    pytest.importorskip("vllm")
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    if dtype.startswith("turboquant"):
        from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend as backend
    elif dtype.startswith("ultraquant"):
        # its backend module needs real Triton to import; its customize_spec is slot_size(head_size)
        from dataclasses import replace

        from vllm.v1.attention.ops.ultraquant.format import slot_size

        backend = type("UltraQuantSpec", (), {"customize_spec": staticmethod(
            lambda s: replace(s, state_content_bytes=slot_size(s.head_size))
        )})  # fmt: skip
    else:
        from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend as backend
    spec = FullAttentionSpec(
        block_size=16,
        num_kv_heads=2,
        head_size=head_size,
        dtype=STR_DTYPE_TO_TORCH_DTYPE[dtype],
        kv_quant_mode=get_kv_quant_mode(dtype),
    )
    return backend.customize_spec(spec)


@pytest.mark.parametrize("head_size", [32, 64, 128])
@pytest.mark.parametrize("dtype", EMULATED)
def test_page_layout_is_vllms(dtype, head_size):
    spec = _vllm_spec(dtype, head_size)
    layout = _codec(dtype).layout(head_size)
    assert layout.content_bytes == spec.state_content_bytes
    assert spec.num_heads == 2 * layout.head_slots
    assert spec.page_size_bytes == 16 * 2 * layout.bytes_per_head


def test_int4_rotation_is_vllms():
    pytest.importorskip("vllm")
    from vllm.v1.attention.ops.int4_per_token_head import single_rht

    from kvbench.kernels import per_token_head as pth

    for d in (32, 48, 64, 96):
        x = torch.randn(5, 2, d, generator=torch.Generator().manual_seed(d))
        assert torch.equal(pth.rotate(x), single_rht(x))
        assert torch.equal(pth.rotate(x, inverse=True), single_rht(x, inverse=True))


def test_turboquant_tables_are_the_backends():
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionImpl

    from kvbench.kernels import turboquant as tq

    for preset in tq.PRESETS:
        cfg = TurboQuantConfig.from_cache_dtype(preset, 64)
        layer = SimpleNamespace()
        impl = SimpleNamespace(_soa_store=False, head_size=64, tq_config=cfg)
        TurboQuantAttentionImpl._ensure_on_device(impl, layer, torch.device("cpu"))
        assert torch.equal(tq.hadamard(64), layer._tq_PiT)
        assert torch.equal(tq.midpoints(64, tq.centroid_bits(preset)), layer._tq_midpoints)
        assert (tq.key_bytes(preset, 64), tq.PRESETS[preset][2]) == (cfg.key_packed_size, cfg.norm_correction)


@pytest.mark.parametrize("dtype", EMULATED)
def test_store_then_decode_gives_the_round_trip(dtype):
    """The page path (store at slots, decode from the bytes) and the reference round trip agree, and the
    quantization error is what each format's bits allow."""
    codec = _codec(dtype)
    g = torch.Generator().manual_seed(1)
    k = torch.randn(7, 2, 64, generator=g).bfloat16()
    v = (torch.randn(7, 2, 64, generator=g) * 3).bfloat16()
    pages = torch.zeros(3, 2, 16, codec.layout(64).content_bytes, dtype=torch.uint8)
    slots = torch.tensor([0, 5, 16, 17, 40, 47, 2])
    codec.store(pages, k, v, slots, codecs.Scales())
    k_hat, v_hat = codec.decode(pages, slots, 2, 64, codecs.Scales())
    k_ref, v_ref = codec.kv_round_trip(k.float(), v.float())
    assert torch.equal(k_hat, k_ref) and torch.equal(v_hat, v_ref)
    bound = 0.35 if "3" in dtype else 0.2
    for x, x_hat in ((k, k_hat), (v, v_hat)):
        assert float((x_hat - x.float()).norm() / x.float().norm()) < bound
    untouched = torch.ones(3 * 16, dtype=torch.bool)
    untouched[slots] = False
    assert not pages.transpose(1, 2).reshape(48, -1)[untouched].any()  # nothing written outside the slots


def test_every_emulated_store_is_compared_with_vllms_or_says_why_not():
    from kvbench.kernels import bitexact

    assert set(bitexact.RUNNERS) | set(bitexact.ORACLE_ONLY) == set(codecs.page_dtypes())
    assert not set(bitexact.RUNNERS) & set(bitexact.ORACLE_ONLY)
