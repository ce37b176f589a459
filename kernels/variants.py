"""The cost-isolating decode variants (decode_attention.VARIANTS): the torch reference of what each computes, so
that each variant is checked on the device like the attention itself before its time is believed, and their
Triton loop (`isolate_partition`), which decode_attention's partition kernel runs in place of the attention.

Both variants run the attention kernel's loop over the same pages and tiles but write, for every query head
of a KV head's group, a column sum over the sequence's tokens of K + V, times the V scale:
- load_only: the stored bits as integers (fp16/bf16: the 16-bit pattern; fp8: the byte; nvfp4: data byte j
  in output column 2j and the sum of the block's E4M3 scale byte in column 2j + 1), nothing decoded
  (each format's `stored` in kernels/cache_layouts.py);
- dequant_only: the dequantized values as the MMA would get them (block scales applied, tensor scale not).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvbench.kernels import paged_cache as pc
from kvbench.kernels.cache_layouts import LAYOUTS
from kvbench.kernels.decode_tiles import load_nvfp4, load_raw, load_rows

# Output vs reference relative to max |reference|: load_only's integer sums are exact (the V scale enters as
# an fp32 argument); dequant_only sums floats in another order than torch does.
TOLERANCE = {"load_only": 1e-6, "dequant_only": 1e-5}


def _pages(c: pc.PagedKVCache, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    return block_table[: -(-seq_len // c.block_size)].long()


def _tokens(x: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[pages, H, T, W] -> [H, seq_len, W]"""
    return x.permute(1, 0, 2, 3).reshape(x.shape[1], -1, x.shape[-1])[:, :seq_len]


def _side_sums(c: pc.PagedKVCache, block_table: torch.Tensor, seq_len: int, dequant: bool) -> torch.Tensor:
    """float64 [H, D]: the column sums over the sequence of K + V, stored bits or dequantized values."""
    pages = _pages(c, block_table, seq_len)
    layout = LAYOUTS[c.fmt]
    total = torch.zeros(c.num_kv_heads, c.head_dim, dtype=torch.float64)
    for side in (0, 1):
        # dequantized: block scales applied, the tensor scale not (the kernel folds it in later)
        x = layout.read(c, pages, side, 1.0) if dequant else layout.stored(c, pages, side)
        total += _tokens(x.cpu(), seq_len).double().sum(dim=1)
    return total


def variant_reference(
    variant: str, c: pc.PagedKVCache, block_table: torch.Tensor, seq_lens: torch.Tensor, num_heads: int
) -> torch.Tensor:
    """float32 [B, Hq, D]: what decode_attention(..., variant=variant) writes."""
    if variant not in ("load_only", "dequant_only"):
        raise ValueError(f"unknown variant {variant!r}; choose from: load_only, dequant_only")
    group = num_heads // c.num_kv_heads
    out = torch.empty(len(seq_lens), num_heads, c.head_dim, dtype=torch.float32)
    for i, n in enumerate(seq_lens.tolist()):
        sums = _side_sums(c, block_table[i].cpu(), int(n), variant == "dequant_only")
        out[i] = (sums * c.v_scale).float().repeat_interleave(group, dim=0)
    return out


def max_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.cpu().float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# ---------------------------------------------------------------------------------------------
# Triton: the variants' loop, run by decode_attention's partition kernel in place of the attention
# ---------------------------------------------------------------------------------------------


@triton.jit
def isolate_partition(
    q_ptr,
    cache_ptr,
    block_table_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    stride_bt,
    b,
    h,
    p,
    start,
    end,
    row_mask,
    stat,
    FMT: tl.constexpr,
    FP8_DECODE: tl.constexpr,
    HKV: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
    TILE_N: tl.constexpr,
    VARIANT: tl.constexpr,
    DEQ: tl.constexpr,
):
    """The cost-isolating variants over the same tiles, accumulated element-wise (the cheapest use that keeps
    the work alive) and summed over tokens at the end. VARIANT 1 (load only): the stored bits as integers;
    VARIANT 2 (dequantize, no dot): the K + V values as the attention loop would feed them to the MMA. Every
    query row of the group gets the same column sums; m = 0 and l = 1 on partition 0 only, so the merge adds
    the partitions up (times the V scale)."""
    dt = q_ptr.dtype.element_ty
    half = tl.arange(0, D // 2)
    cols = tl.arange(0, D)
    if VARIANT == 1:
        if FMT == 3:
            sum_e = tl.zeros([TILE_N, D // 2], tl.int32)
            sum_s = tl.zeros([TILE_N, D // 16], tl.int32)
        else:
            sum_x = tl.zeros([TILE_N, D], tl.int32)
    else:
        if FMT == 3:
            sum_e = tl.zeros([TILE_N, D // 2], tl.float32)
            sum_o = tl.zeros([TILE_N, D // 2], tl.float32)
        else:
            sum_x = tl.zeros([TILE_N, D], tl.float32)
    for n0 in range(start, end, TILE_N):
        offs = n0 + tl.arange(0, TILE_N)
        n_mask = offs < end
        page = tl.load(block_table_ptr + b * stride_bt + offs // T, mask=n_mask, other=0).to(tl.int64)
        tok = offs % T
        if VARIANT == 1:
            if FMT == 3:
                kd, ks = load_raw(cache_ptr, page, tok, n_mask, 0, FMT, HKV, h, T, D)
                vd, vs = load_raw(cache_ptr, page, tok, n_mask, 1, FMT, HKV, h, T, D)
                sum_e += kd + vd
                sum_s += ks + vs
            else:
                kx, _k = load_raw(cache_ptr, page, tok, n_mask, 0, FMT, HKV, h, T, D)
                vx, _v = load_raw(cache_ptr, page, tok, n_mask, 1, FMT, HKV, h, T, D)
                sum_x += kx + vx
        else:
            if FMT == 3:
                k_lo, k_hi = load_nvfp4(cache_ptr, page, tok, n_mask, 0, FP8_DECODE, HKV, h, T, D, DEQ)
                v_lo, v_hi = load_nvfp4(cache_ptr, page, tok, n_mask, 1, FP8_DECODE, HKV, h, T, D, DEQ)
                sum_e += k_lo.to(dt).to(tl.float32) + v_lo.to(dt).to(tl.float32)
                sum_o += k_hi.to(dt).to(tl.float32) + v_hi.to(dt).to(tl.float32)
            else:
                k = load_rows(cache_ptr, page, tok, n_mask, 0, cols, FMT, FP8_DECODE, HKV, h, T, D)
                v = load_rows(cache_ptr, page, tok, n_mask, 1, cols, FMT, FP8_DECODE, HKV, h, T, D)
                sum_x += k.to(dt).to(tl.float32) + v.to(dt).to(tl.float32)
    rows = tl.arange(0, GROUP_PAD)
    tl.store(m_ptr + stat, tl.zeros([GROUP_PAD], tl.float32), mask=row_mask)
    tl.store(l_ptr + stat, tl.where(rows >= 0, (p == 0).to(tl.float32), 0.0), mask=row_mask)
    if FMT == 3:
        even = tl.sum(sum_e, axis=0).to(tl.float32)
        if VARIANT == 1:  # odd columns: the scale bytes of the block each column pair is in
            blocks = tl.sum(sum_s, axis=0).to(tl.float32)
            odd = tl.reshape(tl.broadcast_to(blocks[:, None], [D // 16, 8]), [D // 2])
        else:
            odd = tl.sum(sum_o, axis=0)
        tl.store(
            acc_ptr + stat[:, None] * D + 2 * half[None, :],
            tl.broadcast_to(even[None, :], [GROUP_PAD, D // 2]),
            mask=row_mask[:, None],
        )
        tl.store(
            acc_ptr + stat[:, None] * D + 2 * half[None, :] + 1,
            tl.broadcast_to(odd[None, :], [GROUP_PAD, D // 2]),
            mask=row_mask[:, None],
        )
    else:
        total = tl.sum(sum_x, axis=0).to(tl.float32)
        tl.store(
            acc_ptr + stat[:, None] * D + cols[None, :],
            tl.broadcast_to(total[None, :], [GROUP_PAD, D]),
            mask=row_mask[:, None],
        )
