"""Per-token-head KV caches (vLLM's Triton backend): int8, fp8 and int4 with one fp32 scale per (token, head).

vLLM 0.32 writes them with `triton_reshape_and_cache_flash_per_token_head_quant`
(vllm/v1/attention/ops/triton_reshape_and_cache_flash.py) and, for int4, `reshape_and_cache_int4`
(vllm/v1/attention/ops/int4_per_token_head.py). This is kvbench's own torch version of the same rules, so a
byte-for-byte comparison with vLLM's kernels (tests/integration/test_bitexact_vllm.py) means something:

- int8: scale = max(amax / 127, 1e-6) per (token, head) in fp32; code = x * (1 / scale), rounded half away
  from zero (+-0.5, then the store's truncation), clamped to [-128, 127].
- fp8: scale = max(amax / 448, 1e-6); code = fp8 e4m3 (round to nearest even) of clamp(x * (1 / scale), +-448).
- int4: K and V are first rotated by vLLM's randomized Hadamard transform (a fixed +-1 sign vector, then an
  unnormalised Walsh-Hadamard transform, blockwise over the largest power-of-two divisor b of D) and rounded
  to the model dtype; then asymmetric 4-bit codes: scale = max((max - min) / 15, 1e-6), zero point
  zp = clamp(round(-min / scale), 0, 15), code = clamp(round(x * (1 / scale) + zp), 0, 15), two codes per byte
  (even element in the low nibble). The zero point hides in the scale's four low mantissa bits.
  Decoding: ((code - zp) * scale with those bits cleared), inverse-rotated and divided by b, which is what
  vLLM's attention computes with its rotated query.

Page layout (TritonAttentionBackend.customize_spec): one head slot per KV head, each token's row
[K data | K scale (fp32) | V data | V scale (fp32)], data D bytes (int8, fp8) or D/2 bytes (int4).
"""

from __future__ import annotations

import torch

from kvbench.kernels import codecs

SCALE_FLOOR = 1e-6  # vLLM's floor on a (token, head) scale: an all-zero row still decodes to zeros
INT8 = (127.0, -128.0)
FP8 = (448.0, -448.0)


# ---------------------------------------------------------------------------------------------
# int8 / fp8: symmetric, one scale per (token, head)
# ---------------------------------------------------------------------------------------------


def quantize_sym(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes [..., D], fp32 scales [...]) of x [..., D]; kind "int8" or "fp8"."""
    qmax, qmin = INT8 if kind == "int8" else FP8
    x = x.float()
    scale = torch.clamp_min(x.abs().amax(-1) / qmax, SCALE_FLOOR)
    q = x * (1.0 / scale).unsqueeze(-1)
    if kind == "int8":
        q = torch.where(q >= 0, q + 0.5, q - 0.5)  # the int8 store then truncates toward zero
        return q.clamp(qmin, qmax).to(torch.int8).view(torch.uint8), scale
    return q.clamp(qmin, qmax).to(torch.float8_e4m3fn).view(torch.uint8), scale


def dequantize_sym(codes: torch.Tensor, scale: torch.Tensor, kind: str) -> torch.Tensor:
    dtype = torch.int8 if kind == "int8" else torch.float8_e4m3fn
    return codes.contiguous().view(dtype).float() * scale.unsqueeze(-1)


# ---------------------------------------------------------------------------------------------
# int4: randomized Hadamard rotation + asymmetric 4-bit codes
# ---------------------------------------------------------------------------------------------

RHT_SEED = 0x9E3779B9  # vLLM's _get_rht_signs(d, round_idx=0): the sign vector is part of the stored format


def pow2_block(d: int) -> int:
    """Largest power-of-two divisor of d: the rotation's block size and its norm's square."""
    return d & -d


def rht_signs(d: int) -> torch.Tensor:
    """The fixed +-1 signs of the rotation for a block of d values (torch's CPU generator, vLLM's seed)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(RHT_SEED)
    return 2.0 * torch.bernoulli(torch.full((d,), 0.5), generator=gen) - 1.0


def walsh_hadamard(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh-Hadamard transform of the last dimension (a power of two), fp32, butterfly order."""
    d = x.shape[-1]
    h = 1
    while h < d:
        pairs = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*x.shape)
        h *= 2
    return x


def rotate(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """H·S·x (inverse: S·H·x), blockwise over pow2_block(D); norm sqrt(b), not 1."""
    d = x.shape[-1]
    b = pow2_block(d)
    xb = x.float().reshape(*x.shape[:-1], d // b, b)
    signs = rht_signs(b)
    out = walsh_hadamard(xb) * signs if inverse else walsh_hadamard(xb * signs)
    return out.reshape(x.shape)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """As vLLM's kernels round: +-0.5 then an int32 conversion (truncation), back to float."""
    return torch.where(x >= 0, x + 0.5, x - 0.5).to(torch.int32).float()


def quantize_int4(x_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes uint8 [..., D/2], packed scales fp32 [...]) of already rotated x [..., D]."""
    x = x_rot.float()
    lo, hi = x.amin(-1), x.amax(-1)
    scale = torch.clamp_min((hi - lo) / 15.0, SCALE_FLOOR)
    zp = _round_half_away(-lo / scale).clamp(0.0, 15.0)
    q = _round_half_away(x * (1.0 / scale).unsqueeze(-1) + zp.unsqueeze(-1)).clamp(0.0, 15.0).to(torch.uint8)
    packed_scale = ((scale.view(torch.int32) & -16) | (zp.to(torch.int32) & 0xF)).view(torch.float32)
    return q[..., 0::2] | (q[..., 1::2] << 4), packed_scale


def dequantize_int4(packed: torch.Tensor, packed_scale: torch.Tensor) -> torch.Tensor:
    """Rotated-basis values [..., D] (fp32) of packed codes and their packed scales."""
    bits = packed_scale.contiguous().view(torch.int32)
    zp = (bits & 0xF).float().unsqueeze(-1)
    scale = (bits & -16).view(torch.float32).unsqueeze(-1)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2).float()
    return (codes - zp) * scale


def int4_round_trip(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as the int4 cache hands it to attention, in the original basis (fp32). The rotated values are
    rounded to the model dtype before quantization, as vLLM does: x's dtype, or bf16 (the CPU default's) for a
    float32 x."""
    x_rot = rotate(x.float()).to(torch.bfloat16 if x.dtype == torch.float32 else x.dtype)
    rot_hat = dequantize_int4(*quantize_int4(x_rot))
    return rotate(rot_hat, inverse=True) / pow2_block(x.shape[-1])


# ---------------------------------------------------------------------------------------------
# Page rows: [K data | K scale | V data | V scale] per (block, head, offset)
# ---------------------------------------------------------------------------------------------


def _encode_side(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "int4":
        data, scale = quantize_int4(rotate(x.float()).to(x.dtype))
    else:
        data, scale = quantize_sym(x, kind)
    return torch.cat((data, codecs.f32_bytes(scale)), dim=-1)


def _decode_side(row: torch.Tensor, kind: str) -> torch.Tensor:
    data, scale = row[..., :-4], codecs.f32_from_bytes(row[..., -4:])
    if kind == "int4":
        d = data.shape[-1] * 2
        return rotate(dequantize_int4(data, scale), inverse=True) / pow2_block(d)
    return dequantize_sym(data, scale, kind)


def data_bytes(kind: str, head_size: int) -> int:
    return head_size // 2 if kind == "int4" else head_size


def page_layout(kind: str, head_size: int) -> codecs.PageLayout:
    if kind == "int4" and head_size % 2:
        raise ValueError(f"int4_per_token_head needs an even head size, got {head_size}")
    side = data_bytes(kind, head_size) + 4
    return codecs.PageLayout(k_bytes=side, v_bytes=side)


def _codec(kind: str) -> codecs.Codec:
    key = f"{kind}_per_token_head"

    def encode_rows(k, v, scales):
        return torch.cat((_encode_side(k, kind), _encode_side(v, kind)), dim=-1)

    def decode_rows(rows, head_size, scales):
        half = rows.shape[-1] // 2
        return _decode_side(rows[..., :half], kind), _decode_side(rows[..., half:], kind)

    def round_trip(x: torch.Tensor) -> torch.Tensor:
        if kind == "int4":
            return int4_round_trip(x)
        return dequantize_sym(*quantize_sym(x, kind), kind)

    store, decode = codecs.row_codec_io(encode_rows, decode_rows)
    return codecs.register(
        codecs.Codec(
            key=key,
            quant_dequant=round_trip,
            scaled=False,  # the scales are per (token, head), computed when the token is written
            vllm_dtype=key,
            layout=lambda head_size: page_layout(kind, head_size),
            store=store,
            decode=decode,
            notes={
                "stores": f"{kind} codes + one fp32 scale per token and head, inline (vLLM's Triton backend layout)",
                "oracle": "vLLM's Triton store under TRITON_INTERPRET=1 (tests/integration/test_bitexact_vllm.py)",
            },
        )
    )


CODECS = tuple(_codec(kind) for kind in ("int8", "fp8", "int4"))
