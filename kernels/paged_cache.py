"""Paged KV cache: layout, the Triton write kernel (vLLM's reshape-and-cache step) and its torch reference.

Layout (vLLM 0.32's FlashInfer/HND layout, the one its NVFP4 cache uses):

    cache[num_blocks, 2 * H, T, W]      H = KV heads, T = tokens per page (block_size)

Slots 0..H-1 of a page are the K heads, H..2H-1 the V heads: a page is [K side | V side] and each
side is H·T rows of W elements, head-major.

- fp16 / bf16: W = D elements of that dtype.
- fp8 / fp8_e5m2: W = D bytes, FP8 codes of x / scale (one FP32 scale per tensor, outside the page).
- nvfp4: W = D/2 + D/16 bytes. Within a side, the H·T data rows (D/2 bytes, two E2M1 codes each)
  come first, then the H·T scale rows (D/16 E4M3 bytes): vLLM's `nvfp4_split_data_scale`. Block
  scales are linear (the FlashInfer FA2 reader on SM80/SM90/SM120); trtllm-gen on SM100 wants V scales
  4-token interleaved, which this layout does not do.

A token's place is its slot = page · T + offset (vLLM's slot_mapping; negative slots are padding and
are skipped). What the kernels and their references know of each format is one entry of
kernels/cache_layouts.py (LAYOUTS), by kernel key; the formats are formats.toml's `cache_kernel` set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvbench.kernels.cache_layouts import LAYOUTS
from kvbench.specs.formats import kernel_formats


def check_format(fmt: str) -> None:
    """A kernel key the registry marks `cache_kernel` (formats.toml) and these kernels lay out (LAYOUTS)."""
    known = kernel_formats("cache_kernel")
    if fmt not in known:
        raise ValueError(f"unknown KV-cache format {fmt!r}; choose from: {', '.join(known)}")
    if fmt not in LAYOUTS:
        raise ValueError(
            f"formats.toml marks {fmt!r} cache_kernel, but kernels/cache_layouts.py has no layout for it (LAYOUTS)"
        )


def row_width(fmt: str, head_dim: int) -> int:
    """W: elements (fp16/bf16) or bytes (fp8, nvfp4) per (token, head) row."""
    check_format(fmt)
    return LAYOUTS[fmt].row_width(head_dim)


def bytes_per_token(fmt: str, num_kv_heads: int, head_dim: int) -> int:
    """Cache bytes one token takes in one layer, K and V."""
    elem = torch.empty((), dtype=LAYOUTS[fmt].element).element_size()
    return 2 * num_kv_heads * row_width(fmt, head_dim) * elem


@dataclass
class PagedKVCache:
    cache: torch.Tensor  # [num_blocks, 2H, T, W]
    fmt: str
    num_kv_heads: int
    head_dim: int
    block_size: int
    k_scale: float = 1.0  # FP32 dequant scales (fp8, nvfp4); 1.0 is vLLM's default
    v_scale: float = 1.0

    @property
    def num_blocks(self) -> int:
        return self.cache.shape[0]

    @property
    def nbytes(self) -> int:
        return self.cache.numel() * self.cache.element_size()


def allocate(
    fmt: str,
    num_blocks: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    *,
    device: str | torch.device = "cpu",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> PagedKVCache:
    check_format(fmt)
    shape = (num_blocks, 2 * num_kv_heads, block_size, row_width(fmt, head_dim))
    return PagedKVCache(
        torch.zeros(shape, dtype=LAYOUTS[fmt].element, device=device),
        fmt,
        num_kv_heads,
        head_dim,
        block_size,
        float(k_scale),
        float(v_scale),
    )


# ---------------------------------------------------------------------------------------------
# torch reference
# ---------------------------------------------------------------------------------------------


def write_reference(c: PagedKVCache, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize key/value [num_tokens, H, D] with the reference numerics and write them at their slots."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blk, off = slots // c.block_size, slots % c.block_size
    for side, x, scale in ((0, key[keep], c.k_scale), (1, value[keep], c.v_scale)):
        LAYOUTS[c.fmt].write(c, blk, side, off, x, scale)


def read_reference(c: PagedKVCache, block_table: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized (K, V), float32 [H, seq_len, D], of one sequence whose pages are block_table[:]."""
    pages = block_table[: -(-seq_len // c.block_size)].long()
    out = []
    for side, scale in ((0, c.k_scale), (1, c.v_scale)):
        x = LAYOUTS[c.fmt].read(c, pages, side, scale)  # [pages, H, T, D]
        x = x.permute(1, 0, 2, 3).reshape(c.num_kv_heads, -1, c.head_dim)[:, :seq_len]
        out.append(x)
    return out[0], out[1]


_FMT_CODE = {key: layout.code for key, layout in LAYOUTS.items()}  # decode_attention's launch reads it


# ---------------------------------------------------------------------------------------------
# Triton: shared numerics (portable to SM80: no native FP8 or FP4 conversion instructions needed)
# ---------------------------------------------------------------------------------------------


@triton.jit
def fp8_encode(
    x, MANT: tl.constexpr, BIAS: tl.constexpr, MAX: tl.constexpr, MIN_NORMAL: tl.constexpr, SUB_STEPS: tl.constexpr
):
    """FP8 codes (uint8) of float32 x: round to nearest even, saturate to ±MAX, with integer ops.

    Triton's own fp32->fp8e4nv cast needs sm_89, and the fp8e4b15 route rounds ties away from zero;
    this matches `torch.Tensor.to(float8)` (and CUDA's satfinite cvt) on every GPU.
    """
    a = tl.minimum(tl.abs(x), MAX)
    # Normal range: drop 23 - MANT mantissa bits of the float32 pattern with round-half-even, then
    # rebias the exponent (a carry out of the mantissa correctly bumps the exponent).
    bits = a.to(tl.int32, bitcast=True)
    lsb = (bits >> (23 - MANT)) & 1
    rounded = (bits + ((1 << (22 - MANT)) - 1) + lsb) >> (23 - MANT)
    normal = rounded - ((127 - BIAS) << MANT)
    # Subnormal range: multiples of MIN_NORMAL / 2^MANT; the count is the code itself.
    steps = tl.minimum(a, MIN_NORMAL) * SUB_STEPS  # (clamped: only used below MIN_NORMAL)
    whole = tl.floor(steps)
    frac = steps - whole
    n = whole.to(tl.int32)
    sub = n + ((frac > 0.5) | ((frac == 0.5) & ((n & 1) == 1))).to(tl.int32)
    code = tl.where(a < MIN_NORMAL, sub, normal)
    return (code | ((x.to(tl.int32, bitcast=True) >> 31) & 1) << 7).to(tl.uint8)


@triton.jit
def e4m3_encode(x):
    return fp8_encode(x, 3, 7, 448.0, 0.015625, 512.0)


@triton.jit
def e5m2_encode(x):
    return fp8_encode(x, 2, 15, 57344.0, 6.103515625e-05, 65536.0)


@triton.jit
def e4m3_decode(b, MODE: tl.constexpr):
    """float32 of E4M3 bytes. MODE 0: integer bit decode (any GPU, the interpreter); 1: native
    fp8e4nv (sm_89+); 2: reinterpret as fp8e4b15 and multiply by 2^8 -- same bits, exponent bias 15
    instead of 7, so exact for every finite code (Ampere)."""
    if MODE == 1:
        return b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    elif MODE == 2:
        return b.to(tl.float8e4b15, bitcast=True).to(tl.float32) * 256.0
    else:
        c = b.to(tl.int32)
        e = (c >> 3) & 0xF
        m = c & 0x7
        normal = (((c & 0x80) << 24) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
        sub = m.to(tl.float32) * 0.001953125
        sub = tl.where((c & 0x80) != 0, -sub, sub)
        return tl.where(e == 0, sub, normal)


@triton.jit
def e5m2_decode(b):
    """float32 of E5M2 bytes: an E5M2 byte is the high byte of the fp16 with the same value."""
    return (b.to(tl.int16) << 8).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e2m1_encode_tl(x):
    """4-bit E2M1 codes (int32) of x, RNE with saturation: count of boundaries passed (see nvfp4.py)."""
    a = tl.abs(x)
    mag = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    return mag | (((x.to(tl.int32, bitcast=True) >> 31) & 1) << 3)  # sign bit copied, as cvt does


@triton.jit
def e2m1_encode_bits(x):
    """e2m1_encode_tl by float bit tricks (candidate), the same codes: |x| >= 1 rounds its float32 mantissa to
    one bit with round-half-even on the pattern (the exponent carries), and below 1 adding 2^22 (whose ulp is
    E2M1's subnormal step 0.5) makes the float add do the one rounding, ties to even; the code is the sum's
    offset from 2^22's pattern."""
    a = tl.minimum(tl.abs(x), 6.0)
    bits = a.to(tl.int32, bitcast=True)
    normal = ((bits + 0x1FFFFF + ((bits >> 22) & 1)) >> 22) - 252  # 1.0 = 0x3F800000 >> 22 = 254 -> code 2
    sub = (a + 4194304.0).to(tl.int32, bitcast=True) - 0x4A800000
    mag = tl.where(a < 1.0, sub, normal)
    return mag | (((x.to(tl.int32, bitcast=True) >> 31) & 1) << 3)


@triton.jit
def e2m1_decode_tl(nibble):
    """float32 of E2M1 codes: magnitudes 2..7 are the float32 pattern 0x3F000000 + (m << 22)."""
    n = nibble.to(tl.int32)
    m = n & 0x7
    v = (0x3F000000 + (m << 22)).to(tl.float32, bitcast=True)
    v = tl.where(m == 0, 0.0, tl.where(m == 1, 0.5, v))
    return tl.where((n & 0x8) != 0, -v, v)


@triton.jit
def e2m1_decode_f16(nibble):
    """fp16 of E2M1 codes times 2^-14, by bits alone (candidate): [s|e1 e0|m] moved to fp16's sign, the two
    low exponent bits and the top mantissa bit is e2m1 · 2^-14 for every code (e = 0 lands on fp16's
    subnormals, m · 2^-15, as E2M1's own subnormal m · 0.5)."""
    n = nibble.to(tl.uint16)
    return (((n & 0x8) << 12) | ((n & 0x7) << 9)).to(tl.float16, bitcast=True)


@triton.jit
def e4m3_decode_f16(b, MODE: tl.constexpr):
    """fp16 of E4M3 bytes (every E4M3 value is exact in fp16): native on sm_89+, else through e4m3_decode."""
    if MODE == 1:
        return b.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    else:
        return e4m3_decode(b, MODE).to(tl.float16)


# ---------------------------------------------------------------------------------------------
# Triton: reshape-and-cache
# ---------------------------------------------------------------------------------------------


@triton.jit
def _write_side(
    x,
    cache_ptr,
    page,
    off,
    side,
    enc,
    scale,
    FMT: tl.constexpr,
    H: tl.constexpr,
    HP: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
    ENC: tl.constexpr = 0,
):
    """Quantize one token's H heads x [HP, D] (rows >= H are padding) and store them in its page. ENC 1: the
    candidate bit-trick E2M1 encode."""
    heads = tl.arange(0, HP)
    hmask = heads < H
    if FMT == 3:  # nvfp4
        NB: tl.constexpr = D // 16
        W: tl.constexpr = D // 2 + D // 16
        xb = tl.reshape(x, [HP, NB, 16])
        vecmax = tl.max(tl.abs(xb), axis=2)
        # Block scale: E4M3(enc * vecmax / 6); rows scaled by 1 / (scale_e4m3 * global_scale).
        sf_byte = e4m3_encode(enc * (vecmax * 0.16666666666666666))
        sf = e4m3_decode(sf_byte, 0)
        inv = tl.where(
            sf == 0.0, 0.0, tl.math.div_rn(tl.full(sf.shape, 1.0, tl.float32), tl.where(sf == 0.0, 1.0, sf * scale))
        )
        if ENC == 1:
            codes = e2m1_encode_bits(xb * inv[:, :, None])
        else:
            codes = e2m1_encode_tl(xb * inv[:, :, None])
        lo, hi = tl.split(tl.reshape(codes, [HP, D // 2, 2]))
        packed = (lo | (hi << 4)).to(tl.uint8)
        side_base = (page * 2 + side) * (H * T * W)
        row = heads * T + off
        data_ptr = cache_ptr + side_base + row[:, None] * (D // 2) + tl.arange(0, D // 2)[None, :]
        tl.store(data_ptr, packed, mask=hmask[:, None])
        scale_ptr = cache_ptr + side_base + H * T * (D // 2) + row[:, None] * NB + tl.arange(0, NB)[None, :]
        tl.store(scale_ptr, sf_byte, mask=hmask[:, None])
    else:
        row = ((page * 2 + side) * H + heads) * T + off
        ptr = cache_ptr + row[:, None] * D + tl.arange(0, D)[None, :]
        if FMT == 1:
            y = e4m3_encode(tl.math.div_rn(x, tl.full(x.shape, 1.0, tl.float32) * scale))
        elif FMT == 2:
            y = e5m2_encode(tl.math.div_rn(x, tl.full(x.shape, 1.0, tl.float32) * scale))
        else:
            y = x.to(cache_ptr.dtype.element_ty)
        tl.store(ptr, y, mask=hmask[:, None])


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    cache_ptr,
    slot_ptr,
    k_enc,
    k_scale,
    v_enc,
    v_scale,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    FMT: tl.constexpr,
    H: tl.constexpr,
    HP: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
    ENC: tl.constexpr = 0,
):
    """One program per new token: quantize its K and V (all heads) and write them into its page."""
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:
        page = slot // T
        off = slot % T
        heads = tl.arange(0, HP)
        dims = tl.arange(0, D)
        m = (heads < H)[:, None]
        k = tl.load(key_ptr + tok * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=m, other=0.0)
        v = tl.load(value_ptr + tok * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=m, other=0.0)
        _write_side(k.to(tl.float32), cache_ptr, page, off, 0, k_enc, k_scale, FMT, H, HP, T, D, ENC)
        _write_side(v.to(tl.float32), cache_ptr, page, off, 1, v_enc, v_scale, FMT, H, HP, T, D, ENC)


def _enc(scale: float) -> float:
    """1 / scale rounded to float32, as the reference computes it."""
    return float(1.0 / torch.tensor(scale, dtype=torch.float32))


ENCODERS = {"compare": 0, "bits": 1}  # E2M1 encode: the 7-comparison count, or the candidate bit trick


def reshape_and_cache(
    c: PagedKVCache,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    encode: str = "compare",
    num_warps: int | None = None,
) -> None:
    """Triton: quantize key/value [num_tokens, H, D] and write them into the paged cache at their slots.
    encode: ENCODERS (the same bytes either way); num_warps: Triton's launch option (None: its default)."""
    if encode not in ENCODERS:
        raise ValueError(f"unknown E2M1 encoder {encode!r}; choose from: {', '.join(ENCODERS)}")
    num_tokens, h, d = key.shape
    if (h, d) != (c.num_kv_heads, c.head_dim) or value.shape != key.shape:
        raise ValueError(
            f"key/value {tuple(key.shape)}/{tuple(value.shape)} do not match the cache's "
            f"{c.num_kv_heads} heads x head_dim {c.head_dim}"
        )
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("key and value need a contiguous last dimension")
    if d & (d - 1):
        raise ValueError(f"head_dim must be a power of two for these kernels, got {d}")
    if num_tokens == 0:
        return
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        c.cache,
        slot_mapping,
        _enc(c.k_scale),
        c.k_scale,
        _enc(c.v_scale),
        c.v_scale,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        FMT=_FMT_CODE[c.fmt],
        H=h,
        HP=triton.next_power_of_2(h),
        T=c.block_size,
        D=d,
        ENC=ENCODERS[encode],
        **({"num_warps": num_warps} if num_warps else {}),
    )
