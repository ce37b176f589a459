"""NVFP4 reference numerics in plain torch: E2M1 values, E4M3 block scales, an FP32 tensor scale.

One value x of a KV row (head_dim D, a multiple of 16) is stored as

    x ≈ e2m1 · block_scale · global_scale

- e2m1: 4 bits [sign | exp:2 | mant:1], magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}; round to nearest,
  ties to even, saturate to ±6 (PTX `cvt.rn.satfinite.e2m1x2.f32`).
- block_scale: one FP8 E4M3 byte per 16 consecutive values along head_dim, computed when the token is
  written (dynamic).
- global_scale: one FP32 *dequant* scale per tensor (vLLM's k_scale/v_scale: 1.0 unless the
  checkpoint ships one; ModelOpt calibrates it to amax / (6 · 448)).

Bytes: element 2i in the low nibble, 2i+1 in the high nibble (the NVIDIA order: PTX cvt, vLLM,
ModelOpt, FlashInfer). A row is D/2 data bytes + D/16 scale bytes; vLLM's page puts all data rows of a
(K or V) side first, then all their scales (`to_vllm_side`).

The quantizer follows vLLM/TensorRT-LLM `cvt_warp_fp16_to_fp4` step by step, with exact IEEE division
where the CUDA code uses `rcp.approx` (see tests/unit/test_vllm_crosscheck.py for what that changes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.kernels import codecs

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# Magnitude of each 3-bit E2M1 code; code | 0x8 is the negative.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


# ---------------------------------------------------------------------------------------------
# E2M1 elements
# ---------------------------------------------------------------------------------------------


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8 0..15) of x, round-to-nearest-even, saturating at ±6.

    The magnitude code is the number of decision boundaries |x| passes. A tie goes to the even
    mantissa, so boundaries that round a tie *up* use >= (0.75→1, 1.75→2, 3.5→4) and those that
    round it down use > (0.25→0, 1.25→1, 2.5→2, 5→4).
    """
    a = x.float().abs()
    mag = (a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5.0)
    # The sign bit is copied, so negatives that round to zero (and -0.0) give 0x8 = -0, as cvt does.
    return mag | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of 4-bit codes."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    mag = table[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., D] codes -> [..., D/2] bytes, element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(data: torch.Tensor) -> torch.Tensor:
    """[..., D/2] bytes -> [..., D] codes (inverse of pack_nibbles)."""
    return torch.stack((data & 0x0F, data >> 4), dim=-1).flatten(-2)


# ---------------------------------------------------------------------------------------------
# E4M3 block scales
# ---------------------------------------------------------------------------------------------


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """x rounded to FP8 E4M3 (RNE, saturating at ±448), as float32 (`__nv_fp8_e4m3(float)`)."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_from_bytes(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float8_e4m3fn).float()


# ---------------------------------------------------------------------------------------------
# NVFP4 tensors
# ---------------------------------------------------------------------------------------------


@dataclass
class Nvfp4Tensor:
    data: torch.Tensor  # uint8 [..., D/2], two E2M1 codes per byte
    scales: torch.Tensor  # uint8 [..., D/16], E4M3 bytes
    global_scale: float  # FP32 dequant scale for the whole tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.data.shape[:-1], self.data.shape[-1] * 2)


def amax_global_scale(x: torch.Tensor) -> float:
    """ModelOpt's calibrated dequant scale amax / (6 · 448): the largest block scale lands on 448."""
    amax = float(x.detach().abs().max())
    return amax / (E2M1_MAX * E4M3_MAX) if amax > 0 else 1.0


def _block_scales(vecmax: torch.Tensor, global_scale: float, denominator: float) -> torch.Tensor:
    """E4M3-rounded block scales: enc · (vecmax / denominator), enc = 1 / global_scale."""
    gs = torch.tensor(global_scale, dtype=torch.float32)
    enc = 1.0 / gs  # vLLM: `global_scale = 1.0f / k_scale`
    return e4m3_round(enc * (vecmax * (1.0 / denominator)))


def _encode_blocks(xb: torch.Tensor, sf: torch.Tensor, global_scale: float) -> torch.Tensor:
    """E2M1 codes of blocks xb [..., n, 16] given their rounded block scales sf [..., n]."""
    # outputScale = 1 / (sf · gs); a zero block (sf = 0) maps everything to code 0.
    denom = sf * torch.tensor(global_scale, dtype=torch.float32)
    out_scale = torch.where(sf == 0, torch.zeros_like(sf), 1.0 / torch.where(sf == 0, torch.ones_like(sf), denom))
    return e2m1_encode(xb * out_scale.unsqueeze(-1))


def quantize(x: torch.Tensor, global_scale: float = 1.0, *, four_over_six: bool = False) -> Nvfp4Tensor:
    """NVFP4-quantize x [..., D] along its last dimension (D % 16 == 0).

    four_over_six: vLLM's `nvfp4_4over6` -- each block also tries the scale max/4 (finer steps, the
    largest values land on 4) and keeps whichever reconstructs the block with the smaller squared
    error. Same bytes, same layout.
    """
    if x.shape[-1] % BLOCK:
        raise ValueError(f"NVFP4 needs the last dimension to be a multiple of {BLOCK}, got {x.shape[-1]}")
    if not global_scale > 0:
        raise ValueError(f"global_scale must be positive, got {global_scale}")
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    vecmax = xb.abs().amax(dim=-1)
    sf = _block_scales(vecmax, global_scale, E2M1_MAX)
    codes = _encode_blocks(xb, sf, global_scale)
    if four_over_six:
        sf4 = _block_scales(vecmax, global_scale, 4.0)
        codes4 = _encode_blocks(xb, sf4, global_scale)
        err6 = ((_dequant_blocks(codes, sf, global_scale) - xb) ** 2).sum(-1)
        err4 = ((_dequant_blocks(codes4, sf4, global_scale) - xb) ** 2).sum(-1)
        use4 = err4 < err6  # ties keep the standard max/6 scale
        codes = torch.where(use4.unsqueeze(-1), codes4, codes)
        sf = torch.where(use4, sf4, sf)
    data = pack_nibbles(codes.flatten(-2))
    return Nvfp4Tensor(data=data, scales=e4m3_bytes(sf), global_scale=float(global_scale))


def _dequant_blocks(codes: torch.Tensor, sf: torch.Tensor, global_scale: float) -> torch.Tensor:
    # Same operation order as vLLM's dequantize_to_dtype: value · (block_scale · global_scale).
    return e2m1_decode(codes) * (sf * torch.tensor(global_scale, dtype=torch.float32)).unsqueeze(-1)


def dequantize(q: Nvfp4Tensor) -> torch.Tensor:
    """float32 [..., D] values of an NVFP4 tensor."""
    codes = unpack_nibbles(q.data)
    codes = codes.reshape(*codes.shape[:-1], codes.shape[-1] // BLOCK, BLOCK)
    return _dequant_blocks(codes, e4m3_from_bytes(q.scales), q.global_scale).flatten(-2)


def quant_dequant(x: torch.Tensor, global_scale: float = 1.0, *, four_over_six: bool = False) -> torch.Tensor:
    return dequantize(quantize(x, global_scale, four_over_six=four_over_six))


# ---------------------------------------------------------------------------------------------
# vLLM's packed rows
# ---------------------------------------------------------------------------------------------


def row_bytes(head_dim: int) -> int:
    """Bytes per (token, head) row: vLLM's nvfp4_kv_cache_full_dim(D) = D/2 + D/16."""
    return head_dim // 2 + head_dim // BLOCK


def to_vllm_side(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """One side (K or V) of a page, [H, T, D/2] data + [H, T, D/16] scales -> uint8 [H, T, D/2 + D/16].

    vLLM lays a side out as all H·T data rows, then all H·T scale rows (`nvfp4_split_data_scale`),
    not row by row; the [H, T, full_dim] shape is only the allocation.
    """
    h, t, _ = data.shape
    flat = torch.cat((data.reshape(-1), scales.reshape(-1)))
    return flat.reshape(h, t, row_bytes(data.shape[-1] * 2))


def from_vllm_side(side: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of to_vllm_side: uint8 [H, T, full_dim] -> (data [H, T, D/2], scales [H, T, D/16])."""
    h, t, full = side.shape
    d_data = full * 8 // 9
    flat = side.reshape(-1)
    data = flat[: h * t * d_data].reshape(h, t, d_data)
    scales = flat[h * t * d_data :].reshape(h, t, full - d_data)
    return data, scales


# ---------------------------------------------------------------------------------------------
# Codecs (kernels/codecs.py): the round trip and the page store of vLLM's nvfp4 / nvfp4_4over6 caches
# ---------------------------------------------------------------------------------------------


def page_layout(head_size: int) -> codecs.PageLayout:
    """FlashInfer's customize_spec (vllm/v1/attention/backends/flashinfer.py): 2H head slots, K heads then V
    heads, each D/2 + D/16 bytes per token."""
    if head_size % BLOCK:
        raise ValueError(f"NVFP4 KV cache needs a head size divisible by {BLOCK}, got {head_size}")
    return codecs.PageLayout(k_bytes=row_bytes(head_size), v_bytes=row_bytes(head_size), head_slots=2)


def page_sides(pages: torch.Tensor, num_kv_heads: int):
    """((K data, K scales), (V data, V scales)), uint8 views [B, H, N, D/2] and [B, H, N, D/16] of a layer's
    pages [B, 2H, N, D/2 + D/16]: within a side all data rows come first, then all scale rows (vLLM's own
    `nvfp4_split_data_scale` makes the views, so they follow its layout whatever the strides)."""
    from vllm.utils.torch_utils import nvfp4_split_data_scale

    pages = codecs.byte_view(pages)
    sides = []
    for side in (pages[:, :num_kv_heads], pages[:, num_kv_heads:]):
        data, scales = nvfp4_split_data_scale(side)
        sides.append((data, scales.view(torch.uint8)))
    return sides


def _quantize_pair(key, value, scales: codecs.Scales, four_over_six: bool) -> list[Nvfp4Tensor]:
    """K and V quantized, in one pass where they share the tensor scale (the usual 1.0): half the torch calls
    on the engine's hot path."""
    if scales.k == scales.v:
        q = quantize(torch.stack((key, value)), scales.k, four_over_six=four_over_six)
        return [Nvfp4Tensor(q.data[i], q.scales[i], q.global_scale) for i in (0, 1)]
    return [quantize(x, s, four_over_six=four_over_six) for x, s in ((key, scales.k), (value, scales.v))]


def store_pages(pages, key, value, slot_mapping, scales: codecs.Scales, *, four_over_six: bool = False) -> None:
    """Quantize key/value [T, H, D] into the pages at their slots (vLLM's CUDA writer's rules)."""
    blk, off = codecs.rows(slot_mapping, pages.shape[2])
    quantized = _quantize_pair(key, value, scales, four_over_six)
    for (data, sf), q in zip(page_sides(pages, key.shape[1]), quantized, strict=True):
        data[blk, :, off] = q.data
        sf[blk, :, off] = q.scales


def decode_pages(pages, slot_mapping, num_kv_heads: int, head_size: int, scales: codecs.Scales):
    """The K and V rows [T, H, D] stored at the slots, float32, decoded from the page bytes."""
    blk, off = codecs.rows(slot_mapping, pages.shape[2])
    (kd, ks), (vd, vs) = ((data[blk, :, off], sf[blk, :, off]) for data, sf in page_sides(pages, num_kv_heads))
    if scales.k == scales.v:
        both = dequantize(Nvfp4Tensor(torch.stack((kd, vd)), torch.stack((ks, vs)), scales.k))
        return both[0], both[1]
    return dequantize(Nvfp4Tensor(kd, ks, scales.k)), dequantize(Nvfp4Tensor(vd, vs, scales.v))


def _codec(key: str, four_over_six: bool) -> codecs.Codec:
    def round_trip(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return quant_dequant(x, scale, four_over_six=four_over_six)

    def store(pages, key_rows, value_rows, slot_mapping, scales):
        store_pages(pages, key_rows, value_rows, slot_mapping, scales, four_over_six=four_over_six)

    return codecs.register(
        codecs.Codec(
            key=key,
            quant_dequant=round_trip,
            scaled=True,
            calibrated_scale=amax_global_scale,
            vllm_dtype=key,
            layout=page_layout,
            store=store,
            decode=decode_pages,
            notes={
                "stores": "NVFP4 in vLLM's pages: D/2 + D/16 bytes per head per token, E4M3 scale per 16 values"
                + (", scale max/4 or max/6 per block (4over6)" if four_over_six else ""),
                "oracle": "vLLM's writer is CUDA-only (FlashInfer nvfp4_kv_quantize, SM100+): checked against "
                "kvbench's independent reference (tests/unit/test_nvfp4.py, test_vllm_crosscheck.py)",
            },
        )
    )


CODECS = (_codec("nvfp4", False), _codec("nvfp4_4over6", True))
