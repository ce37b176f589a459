"""Reference numerics: NVFP4 (E2M1 + E4M3 block scales + FP32 tensor scale), FP8, MXFP4."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.kernels import fp8, mxfp4, nvfp4

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def relerr(a, b):
    return float((a - b).norm() / b.norm())


# --- E2M1 ------------------------------------------------------------------------------------


def test_every_e2m1_code_round_trips():
    codes = torch.arange(16, dtype=torch.uint8)
    values = nvfp4.e2m1_decode(codes)
    assert values[:8].tolist() == E2M1 and values[8:].tolist() == [-v for v in E2M1]
    assert torch.equal(nvfp4.e2m1_encode(values), codes)  # 0x8 is -0.0 and comes back as 0x8


@pytest.mark.parametrize(
    "x, expected",
    [
        (0.25, 0.0),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (5.0, 4.0),  # ties -> even
        (0.2500001, 0.5),
        (0.7499999, 0.5),
        (5.0000005, 6.0),
        (0.24, 0.0),
        (0.26, 0.5),
        (5.5, 6.0),
        (6.0, 6.0),
        (7.0, 6.0),
        (1e30, 6.0),
        (float("inf"), 6.0),  # saturation
    ],
)
def test_e2m1_round_to_nearest_even_and_saturation(x, expected):
    for sign in (1.0, -1.0):
        v = nvfp4.e2m1_decode(nvfp4.e2m1_encode(torch.tensor([sign * x])))
        assert v.item() == sign * expected


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-10, max_value=10, allow_nan=False, width=32))
def test_e2m1_picks_a_nearest_value(x):
    got = nvfp4.e2m1_decode(nvfp4.e2m1_encode(torch.tensor([x]))).item()
    grid = sorted({s * v for v in E2M1 for s in (1, -1)})
    best = min(abs(abs(x) - v) for v in E2M1) if abs(x) <= 6 else None
    assert got in grid
    if best is not None:
        assert abs(abs(x) - abs(got)) == best  # nearest (ties: either neighbour, checked above)
    else:
        assert abs(got) == 6.0
    assert got == 0 or math.copysign(1, got) == math.copysign(1, x)


def test_packing_order_low_nibble_is_even_element():
    codes = torch.tensor([0x1, 0x2, 0x3, 0xF], dtype=torch.uint8)
    packed = nvfp4.pack_nibbles(codes)
    assert packed.tolist() == [0x21, 0xF3]
    assert torch.equal(nvfp4.unpack_nibbles(packed), codes)


# --- NVFP4 blocks ----------------------------------------------------------------------------


def test_zero_block_gives_scale_byte_zero_and_zeros():
    x = torch.zeros(2, 32)
    x[1, 16:] = torch.linspace(-3, 3, 16)
    q = nvfp4.quantize(x)
    assert q.scales[0].tolist() == [0, 0] and q.scales[1, 0] == 0  # vLLM/TRT-LLM write 0x00
    assert torch.all(q.data[0] == 0)
    deq = nvfp4.dequantize(q)
    assert torch.all(deq[0] == 0) and torch.all(deq[1, :16] == 0)
    # ModelOpt writes 0x38 (1.0) for a zero block instead; the values still dequantize to zero.
    q.scales[0] = 0x38
    assert torch.all(nvfp4.dequantize(q)[0] == 0)


def test_block_max_maps_to_six_and_scale_is_e4m3():
    x = torch.zeros(1, 16)
    x[0, 3] = -12.0  # block scale 12/6 = 2 is exact in E4M3
    x[0, 5] = 3.0
    q = nvfp4.quantize(x)
    assert nvfp4.e4m3_from_bytes(q.scales).item() == 2.0
    assert nvfp4.dequantize(q)[0, 3].item() == -12.0 and nvfp4.dequantize(q)[0, 5].item() == 3.0


def test_scale_rounded_down_saturates_the_block_max():
    # vecmax/6 = 1.0625 lies between E4M3 neighbours 1.0 and 1.125 (tie -> even 1.0): the scale rounds
    # down, vecmax/scale = 6.375 > 6, and satfinite clamps the max element to 6.
    x = torch.zeros(1, 16)
    x[0, 0] = 6.375
    q = nvfp4.quantize(x)
    assert nvfp4.e4m3_from_bytes(q.scales).item() == 1.0
    assert nvfp4.dequantize(q)[0, 0].item() == 6.0


def test_block_scale_saturates_at_448_with_a_too_small_global_scale():
    x = torch.full((1, 16), 1e6)
    q = nvfp4.quantize(x, global_scale=1.0)
    assert nvfp4.e4m3_from_bytes(q.scales).item() == 448.0
    assert nvfp4.dequantize(q)[0, 0].item() == 6 * 448.0
    # ModelOpt's calibrated scale amax / (6*448) puts the largest block scale on 448 and loses nothing.
    gs = nvfp4.amax_global_scale(x)
    assert gs == pytest.approx(1e6 / 2688)
    assert torch.allclose(nvfp4.quant_dequant(x, gs), x, rtol=1e-6)


def test_tiny_values_underflow_with_static_scale_but_not_with_calibrated():
    x = torch.randn(64, 128) * 1e-4
    assert torch.all(nvfp4.quant_dequant(x, 1.0) == 0)  # block max 6*2^-10 > |x|: all zeros
    assert relerr(nvfp4.quant_dequant(x, nvfp4.amax_global_scale(x)), x) < 0.11


def test_gaussian_error_matches_the_published_emulation():
    # kv-formats.md §4.1: N(0,1) relL2 NVFP4 0.0950, MXFP4 0.1150, FP8 E4M3 (amax scale) 0.0265.
    x = torch.randn(8192, 128, generator=torch.Generator().manual_seed(0))
    assert relerr(nvfp4.quant_dequant(x, nvfp4.amax_global_scale(x)), x) == pytest.approx(0.095, abs=0.002)
    assert relerr(nvfp4.quant_dequant(x, 1.0), x) == pytest.approx(0.095, abs=0.002)
    assert relerr(mxfp4.quant_dequant(x), x) == pytest.approx(0.115, abs=0.003)
    assert relerr(fp8.quant_dequant(x, fp8.amax_scale(x)), x) == pytest.approx(0.0265, abs=0.001)
    assert relerr(fp8.quant_dequant(x, 1.0, "e5m2"), x) == pytest.approx(0.053, abs=0.002)


def test_four_over_six_never_worse_per_block_and_better_overall():
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(1))
    a = nvfp4.quant_dequant(x)
    b = nvfp4.quant_dequant(x, four_over_six=True)
    err_a = ((a - x) ** 2).reshape(-1, 16).sum(-1)
    err_b = ((b - x) ** 2).reshape(-1, 16).sum(-1)
    assert torch.all(err_b <= err_a)
    assert relerr(b, x) < 0.97 * relerr(a, x)


def test_vllm_side_layout_puts_all_data_rows_before_all_scale_rows():
    h, t, d = 2, 4, 32
    x = torch.randn(h, t, d)
    q = nvfp4.quantize(x)
    side = nvfp4.to_vllm_side(q.data, q.scales)
    assert side.shape == (h, t, d // 2 + d // 16)
    flat = side.reshape(-1)
    assert torch.equal(flat[: h * t * d // 2], q.data.reshape(-1))
    assert torch.equal(flat[h * t * d // 2 :], q.scales.reshape(-1))
    data, scales = nvfp4.from_vllm_side(side)
    assert torch.equal(data, q.data) and torch.equal(scales, q.scales)


def test_head_dim_must_be_a_multiple_of_16():
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.quantize(torch.randn(2, 24))


# --- FP8 and MXFP4 ---------------------------------------------------------------------------


def test_fp8_saturates_instead_of_nan_or_inf():
    x = torch.tensor([1e6, -1e6, 448.0, 460.0])
    assert fp8.quant_dequant(x, 1.0, "e4m3").tolist() == [448.0, -448.0, 448.0, 448.0]
    assert fp8.quant_dequant(torch.tensor([1e9]), 1.0, "e5m2").item() == 57344.0


def test_fp8_integer_decode_matches_torch_for_every_finite_code():
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # 0x7F / 0xFF are NaN
    assert torch.equal(fp8.e4m3_decode_bits(codes), codes.view(torch.float8_e4m3fn).float())


def test_mxfp4_scales_are_powers_of_two_with_floor_rule():
    x = torch.zeros(1, 32)
    x[0, 0] = 7.0  # floor(log2 7) = 2 -> X = 2^0: 7 saturates to 6
    x[0, 1] = 1.0
    q = mxfp4.quantize(x)
    assert q.scales.item() == 127
    assert mxfp4.dequantize(q)[0, :2].tolist() == [6.0, 1.0]
    assert mxfp4.quantize(torch.zeros(1, 32)).scales.item() == 0
