"""TurboQuant KV caches (vLLM 0.32's turboquant_k8v4, _4bit_nc, _k3v4_nc, _3bit_nc), kvbench's own torch store.

vLLM writes them with `triton_turboquant_store` (vllm/v1/attention/ops/triton_turboquant_store.py), fed by
`TurboQuantAttentionImpl` (vllm/v1/attention/backends/turboquant_attn.py) with per-layer tables it derives from
the head size alone: `_tq_PiT` = the orthonormal Sylvester Hadamard matrix H/sqrt(D), and `_tq_midpoints`, the
midpoints of the sorted Lloyd-Max centroids for N(0, 1/D) (`get_centroids(D, centroid_bits)`, imported from
vLLM at run time: the codebook is part of the stored format). The rules, per (token, head):

- Keys, MSE presets (3 or 4 bits): norm = ||k||; y = (k / (norm + 1e-8)) @ H/sqrt(D); each coordinate's code is
  the number of midpoints <= y; codes packed little-endian (4 bits: even element in the low nibble; 3 bits:
  8 codes per 3 bytes, code j at bit 3j); then the norm as fp16. Decoding: centroid[code] (norm-corrected
  presets rescale the centroid vector to unit length) * norm, in fp16, rotated back.
- Keys, k8v4: the raw key as fp8 e4m3, no scale (saturating at +-448, as the GPU's conversion does). vLLM picks
  e4m3 ("e4nv") on SM89+ and on every non-CUDA platform; on SM8x (A100) it stores keys as fp8 e4b15, another
  format: this emulation follows SM89+/H100.
- Values (3 or 4 bits, uniform, asymmetric): scale = max((max - min) / (2^b - 1), 1e-8), code =
  clamp(int((v - min) / scale + 0.5), 0, 2^b - 1), packed as above, then scale and min as fp16.

Slot layout: [key (D bytes, or ceil(D*bits/8) + 2) | value (ceil(D*bits/8) + 4)], padded to an even size,
one slot per (token, KV head).
"""

from __future__ import annotations

import math
from functools import cache

import torch

from kvbench.kernels import codecs

# vllm/model_executor/layers/quantization/turboquant/config.py TQ_PRESETS: (key bits, value bits, norm correction)
PRESETS = {
    "turboquant_k8v4": (8, 4, False),
    "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True),
    "turboquant_3bit_nc": (3, 3, True),
}
E4M3_MAX = 448.0


def key_bytes(preset: str, d: int) -> int:
    kb = PRESETS[preset][0]
    return d if kb == 8 else math.ceil(d * kb / 8) + 2


def value_data_bytes(preset: str, d: int) -> int:
    return math.ceil(d * PRESETS[preset][1] / 8)


def page_layout(preset: str, d: int) -> codecs.PageLayout:
    kb, vb, _ = PRESETS[preset]
    if d % 8 or (d & (d - 1)):
        raise ValueError(f"{preset} needs a power-of-two head size (the Hadamard rotation), got {d}")
    k, v = key_bytes(preset, d), value_data_bytes(preset, d) + 4
    return codecs.PageLayout(k_bytes=k, v_bytes=v, pad_bytes=(k + v) % 2)


# ---------------------------------------------------------------------------------------------
# Tables: the rotation and the codebook, as the backend derives them from the head size
# ---------------------------------------------------------------------------------------------


@cache
def hadamard(d: int) -> torch.Tensor:
    """H/sqrt(d), float32, Sylvester order (symmetric and orthonormal: its own inverse)."""
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


@cache
def centroids(d: int, bits: int) -> torch.Tensor:
    """vLLM's Lloyd-Max codebook for N(0, 1/d), sorted (the backend's _tq_centroids, sorted)."""
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids

    return get_centroids(d, bits).float().sort().values


def midpoints(d: int, bits: int) -> torch.Tensor:
    c = centroids(d, bits)
    return (c[:-1] + c[1:]) / 2


def centroid_bits(preset: str) -> int:
    kb, vb, _ = PRESETS[preset]
    return vb if kb == 8 else kb  # TurboQuantConfig.centroid_bits: fp8-key presets still build a codebook


# ---------------------------------------------------------------------------------------------
# Bit packing
# ---------------------------------------------------------------------------------------------


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """int codes [..., D] (< 2^bits) -> uint8 [..., ceil(D*bits/8)], little-endian, code j at bit j*bits."""
    c = codes.to(torch.int32)
    if bits == 4:
        return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)
    groups = c.reshape(*c.shape[:-1], -1, 8)  # bits == 3: 8 codes -> 24 bits -> 3 bytes
    word = (groups << (torch.arange(8, dtype=torch.int32) * 3)).sum(-1)
    out = torch.stack([(word >> s) & 0xFF for s in (0, 8, 16)], dim=-1).to(torch.uint8)
    return out.flatten(-2)


def unpack(data: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    """Inverse of pack: int64 codes [..., d]."""
    b = data.to(torch.int64)
    if bits == 4:
        return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)
    word = b.reshape(*b.shape[:-1], -1, 3)
    word = word[..., 0] | (word[..., 1] << 8) | (word[..., 2] << 16)
    return ((word.unsqueeze(-1) >> (torch.arange(8) * 3)) & 0x7).flatten(-2)[..., :d]


# ---------------------------------------------------------------------------------------------
# Keys and values
# ---------------------------------------------------------------------------------------------


def encode_keys(key: torch.Tensor, preset: str) -> torch.Tensor:
    """uint8 [..., key_bytes] of keys [..., D]."""
    kb = PRESETS[preset][0]
    if kb == 8:
        return key.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    d = key.shape[-1]
    flat = key.float().reshape(-1, d)  # as the launcher: [N*H, D] rows, then one GEMM
    norms = flat.norm(dim=1, keepdim=True)
    y = (flat / (norms + 1e-8)) @ hadamard(d)
    codes = torch.bucketize(y, midpoints(d, kb), right=True)  # midpoints <= y, the kernel's binary search
    out = torch.cat((pack(codes, kb), codecs.f16_bytes(norms.squeeze(1))), dim=-1)
    return out.reshape(*key.shape[:-1], -1)


def decode_keys_rotated(data: torch.Tensor, preset: str, d: int) -> torch.Tensor:
    """fp16 keys [..., D], still in the rotated basis for MSE presets (what vLLM's full dequant writes)."""
    kb, _, norm_correction = PRESETS[preset]
    if kb == 8:
        return data[..., :d].contiguous().view(torch.float8_e4m3fn).float().to(torch.float16)
    mse = math.ceil(d * kb / 8)
    c = centroids(d, kb)[unpack(data[..., :mse], kb, d)]
    if norm_correction:
        c = c * (1.0 / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16))
    norm = codecs.f16_from_bytes(data[..., mse : mse + 2]).unsqueeze(-1)
    return (norm * c).to(torch.float16)


def encode_values(value: torch.Tensor, preset: str) -> torch.Tensor:
    vb = PRESETS[preset][1]
    levels = float(2**vb - 1)
    v = value.float()
    lo, hi = v.amin(-1, keepdim=True), v.amax(-1, keepdim=True)
    scale = (hi - lo) / levels
    scale = torch.where(scale > 1e-8, scale, torch.full_like(scale, 1e-8))
    codes = ((v - lo) / scale + 0.5).to(torch.int32).clamp(0, int(levels))
    return torch.cat((pack(codes, vb), codecs.f16_bytes(scale[..., 0]), codecs.f16_bytes(lo[..., 0])), dim=-1)


def decode_values(data: torch.Tensor, preset: str, d: int) -> torch.Tensor:
    """fp16 values [..., D] (vLLM's full dequant: code * scale + min, in fp32, stored as fp16)."""
    vb = PRESETS[preset][1]
    n = value_data_bytes(preset, d)
    codes = unpack(data[..., :n], vb, d).float()
    scale = codecs.f16_from_bytes(data[..., n : n + 2]).unsqueeze(-1)
    zero = codecs.f16_from_bytes(data[..., n + 2 : n + 4]).unsqueeze(-1)
    return (codes * scale + zero).to(torch.float16)


def decode_rows_rotated(rows: torch.Tensor, preset: str, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(K in the rotated basis, V), fp16 [..., D]: vLLM's `_tq_full_dequant_kv` output for these slots."""
    kbytes = key_bytes(preset, d)
    return decode_keys_rotated(rows[..., :kbytes], preset, d), decode_values(rows[..., kbytes:], preset, d)


def unrotate(k_rot: torch.Tensor, preset: str) -> torch.Tensor:
    if PRESETS[preset][0] == 8:
        return k_rot.float()
    return k_rot.float() @ hadamard(k_rot.shape[-1])


def _codec(preset: str) -> codecs.Codec:
    def encode_rows(k, v, scales):
        rows = torch.cat((encode_keys(k, preset), encode_values(v, preset)), dim=-1)
        pad = page_layout(preset, k.shape[-1]).pad_bytes
        return torch.nn.functional.pad(rows, (0, pad)) if pad else rows

    def decode_rows(rows, head_size, scales):
        k_rot, v = decode_rows_rotated(rows, preset, head_size)
        return unrotate(k_rot, preset), v.float()

    def round_trip_k(x: torch.Tensor) -> torch.Tensor:
        return unrotate(decode_keys_rotated(encode_keys(x, preset), preset, x.shape[-1]), preset)

    def round_trip_v(x: torch.Tensor) -> torch.Tensor:
        return decode_values(encode_values(x, preset), preset, x.shape[-1]).float()

    store, decode = codecs.row_codec_io(encode_rows, decode_rows)
    kb, vb, nc = PRESETS[preset]
    keys = "fp8 e4m3 keys (no scale)" if kb == 8 else f"{kb}-bit Lloyd-Max keys after a Hadamard rotation + fp16 norm"
    return codecs.register(
        codecs.Codec(
            key=preset,
            quant_dequant=round_trip_k,
            quant_dequant_v=round_trip_v,
            scaled=False,
            vllm_dtype=preset,
            layout=lambda head_size: page_layout(preset, head_size),
            store=store,
            decode=decode,
            notes={
                "stores": f"{keys}{', norm-corrected' if nc else ''}; {vb}-bit uniform values + fp16 scale/min",
                "oracle": "vLLM's triton_turboquant_store under TRITON_INTERPRET=1 "
                "(tests/integration/test_bitexact_vllm.py)",
            },
        )
    )


CODECS = tuple(_codec(p) for p in PRESETS)
