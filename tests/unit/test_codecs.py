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
