"""The tiles the paged decode kernels share (kernels/decode_attention.py's attention, kernels/variants.py's
cost-isolating variants): a page's K or V rows for one KV head read from the cache and decoded in registers, as
float32 (fp16/bf16/fp8: E4M3 or E5M2), as NVFP4's even and odd columns with their block scales applied, or as the
stored bits; and the matmul with operands rounded to the model dtype.

The cache layout is kernels/paged_cache.py's: [pages, 2 (K, V), kv heads, tokens per page, row bytes], NVFP4 rows
packed (byte j holds elements 2j and 2j+1) with the page's E4M3 block scales after its data.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvbench.kernels.paged_cache import e2m1_decode_f16, e2m1_decode_tl, e4m3_decode, e4m3_decode_f16, e5m2_decode


@triton.jit
def load_rows(
    cache_ptr,
    page,
    tok,
    n_mask,
    side,
    cols,
    FMT: tl.constexpr,
    FP8_DECODE: tl.constexpr,
    HKV: tl.constexpr,
    h,
    T: tl.constexpr,
    D: tl.constexpr,
):
    """[TILE_N, len(cols)] float32 rows of side (0 = K, 1 = V) for kv head h (fp16/bf16/fp8 caches)."""
    row = ((page * 2 + side) * HKV + h) * T + tok
    x = tl.load(cache_ptr + row[:, None] * D + cols[None, :], mask=n_mask[:, None], other=0)
    if FMT == 1:
        return e4m3_decode(x, FP8_DECODE)
    elif FMT == 2:
        return e5m2_decode(x)
    else:
        return x.to(tl.float32)


@triton.jit
def load_nvfp4(
    cache_ptr,
    page,
    tok,
    n_mask,
    side,
    FP8_DECODE: tl.constexpr,
    HKV: tl.constexpr,
    h,
    T: tl.constexpr,
    D: tl.constexpr,
    DEQ: tl.constexpr = 0,
):
    """(even, odd) columns of NVFP4 rows [TILE_N, D/2], block scales applied (global not): float32 (DEQ 0),
    or fp16 times 2^-14 (DEQ 1)."""
    NB: tl.constexpr = D // 16
    W: tl.constexpr = D // 2 + D // 16
    side_base = (page * 2 + side) * (HKV * T * W)
    row = h * T + tok
    data = tl.load(
        cache_ptr + (side_base + row * (D // 2))[:, None] + tl.arange(0, D // 2)[None, :], mask=n_mask[:, None], other=0
    )
    sf_bytes = tl.load(
        cache_ptr + (side_base + HKV * T * (D // 2) + row * NB)[:, None] + tl.arange(0, NB)[None, :],
        mask=n_mask[:, None],
        other=0,
    )
    tile_n: tl.constexpr = data.shape[0]
    if DEQ == 1:
        sf = e4m3_decode_f16(sf_bytes, FP8_DECODE)  # [TILE_N, NB] fp16, exact
        lo = tl.reshape(e2m1_decode_f16(data & 0xF), [tile_n, NB, 8]) * sf[:, :, None]
        hi = tl.reshape(e2m1_decode_f16(data >> 4), [tile_n, NB, 8]) * sf[:, :, None]
    else:
        sf = e4m3_decode(sf_bytes, FP8_DECODE)  # [TILE_N, NB]
        lo = tl.reshape(e2m1_decode_tl(data & 0xF), [tile_n, NB, 8]) * sf[:, :, None]
        hi = tl.reshape(e2m1_decode_tl(data >> 4), [tile_n, NB, 8]) * sf[:, :, None]
    return tl.reshape(lo, [tile_n, D // 2]), tl.reshape(hi, [tile_n, D // 2])


@triton.jit
def load_raw(
    cache_ptr, page, tok, n_mask, side, FMT: tl.constexpr, HKV: tl.constexpr, h, T: tl.constexpr, D: tl.constexpr
):
    """The load-only variant's tile: the stored bits of side's rows as int32, not decoded. fp16/bf16/fp8:
    [TILE_N, D] element bits; nvfp4: ([TILE_N, D/2] data bytes, [TILE_N, D/16] scale bytes)."""
    if FMT == 3:
        NB: tl.constexpr = D // 16
        W: tl.constexpr = D // 2 + D // 16
        side_base = (page * 2 + side) * (HKV * T * W)
        row = h * T + tok
        data = tl.load(
            cache_ptr + (side_base + row * (D // 2))[:, None] + tl.arange(0, D // 2)[None, :],
            mask=n_mask[:, None],
            other=0,
        )
        sf = tl.load(
            cache_ptr + (side_base + HKV * T * (D // 2) + row * NB)[:, None] + tl.arange(0, NB)[None, :],
            mask=n_mask[:, None],
            other=0,
        )
        return data.to(tl.int32), sf.to(tl.int32)
    else:
        row = ((page * 2 + side) * HKV + h) * T + tok
        x = tl.load(cache_ptr + row[:, None] * D + tl.arange(0, D)[None, :], mask=n_mask[:, None], other=0)
        if FMT == 0:
            return x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF, 0
        else:
            return x.to(tl.int32), 0


@triton.jit
def tile_mma(a, b, dt: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with operands rounded to the model dtype dt, fp32 accumulation. UPCAST 1: multiply the
    rounded operands in fp32 instead (Triton's interpreter cannot multiply bf16 matrices); 2: the "fma"
    candidate, broadcast multiply and sum on the CUDA cores, so GROUP_PAD need not be 16."""
    if UPCAST == 2:
        return tl.sum(a.to(dt).to(tl.float32)[:, :, None] * b.to(dt).to(tl.float32)[None, :, :], axis=1)
    elif UPCAST == 1:
        return tl.dot(a.to(dt).to(tl.float32), b.to(dt).to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a.to(dt), b.to(dt))
