"""MXFP4 (OCP Microscaling v1.0) reference numerics, for comparison with NVFP4.

Same E2M1 elements as NVFP4, but one power-of-two E8M0 scale (a biased exponent byte, 2^(e-127))
per 32 values and no tensor scale: 4.25 bits per value instead of 4.5. The OCP scale rule is FLOOR:
X = 2^(floor(log2(amax)) - 2), 2 being E2M1's largest exponent. amax / X then lies in [4, 8), so the
block's largest values can exceed 6 and saturate -- one reason MXFP4 is coarser than NVFP4's
fractional E4M3 scale over 16 values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.kernels import codecs
from kvbench.kernels.nvfp4 import e2m1_decode, e2m1_encode, pack_nibbles, unpack_nibbles

BLOCK = 32
E2M1_EMAX = 2


@dataclass
class Mxfp4Tensor:
    data: torch.Tensor  # uint8 [..., D/2], low nibble = even element
    scales: torch.Tensor  # uint8 [..., D/32], E8M0 (exponent + 127)


def quantize(x: torch.Tensor) -> Mxfp4Tensor:
    if x.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 needs the last dimension to be a multiple of {BLOCK}, got {x.shape[-1]}")
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    amax = xb.abs().amax(dim=-1)
    # frexp: amax = m · 2^e with m in [0.5, 1), so floor(log2(amax)) = e - 1 exactly.
    _, e = torch.frexp(amax)
    exp = torch.where(amax > 0, e - 1 - E2M1_EMAX, torch.full_like(e, -127)).clamp(-127, 127)
    codes = e2m1_encode(xb * torch.exp2(-exp.float()).unsqueeze(-1))
    return Mxfp4Tensor(data=pack_nibbles(codes.flatten(-2)), scales=(exp + 127).to(torch.uint8))


def dequantize(q: Mxfp4Tensor) -> torch.Tensor:
    codes = unpack_nibbles(q.data)
    codes = codes.reshape(*codes.shape[:-1], codes.shape[-1] // BLOCK, BLOCK)
    scale = torch.exp2(q.scales.float() - 127.0)
    return (e2m1_decode(codes) * scale.unsqueeze(-1)).flatten(-2)


def quant_dequant(x: torch.Tensor) -> torch.Tensor:
    return dequantize(quantize(x))


CODEC = codecs.register(codecs.Codec(key="mxfp4", quant_dequant=lambda x: quant_dequant(x.float()), scaled=False))
