"""Paged decode attention (one new query token per sequence, GQA) over an fp16/bf16, fp8 or NVFP4 cache.

Triton kernel + its plain-torch reference. The kernel dequantizes K and V in registers, so NVFP4 needs
no FP4 hardware: each E2M1 nibble becomes a float with a shift and an add, each 16 values share one
E4M3 scale multiply, and the matmuls run on ordinary fp16/bf16 tensor cores. (NVFP4 values times
their block scale are exact in fp16 and bf16: 2 x 4 significant bits, magnitudes 2^-10 .. 2688.)

Split-KV ("flash-decoding"): a sequence's context is cut into partitions so that a batch of one
still fills the GPU; program (b, kv_head, p) computes softmax statistics and an unnormalised output
for the G = Hq / Hkv query heads that share kv_head over partition p, and a second kernel merges the
partitions. Each K/V byte is read once per kv head, not once per query head.

NVFP4 tiles stay packed: byte j of a row holds elements 2j (low nibble) and 2j+1 (high nibble), so
the query is split into its even and odd columns and Q·K^T = Q_even·K_lo^T + Q_odd·K_hi^T; P·V is
accumulated the same way into even and odd output columns. No in-register interleave is needed.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvbench.kernels.decode_tiles import load_nvfp4, load_rows, tile_mma
from kvbench.kernels.paged_cache import _FMT_CODE, PagedKVCache, read_reference
from kvbench.kernels.variants import isolate_partition

LOG2E = 1.4426950408889634

# Kernel vs reference on the *same* cache (identical dequantized K/V), output relative to max|out|.
# The kernel rounds q to the query dtype's precision (as vLLM does) and the softmax weights P to it
# before P·V; everything else accumulates in fp32.
TOLERANCE = {"float16": 2e-3, "bfloat16": 2e-2, "float32": 2e-3}

# What the partition kernel computes (kernels/variants.py has the torch reference of each): the attention
# itself, or one of two cost-isolating variants of the same loop that write what their reference says.
VARIANTS = {"full": 0, "load_only": 1, "dequant_only": 2}
# How NVFP4 tiles are dequantized: "f32" (E2M1 through fp32 selects, block scale as an fp32 multiply) or the
# candidate "f16" (E2M1 bits straight into fp16 as value·2^-14, one fp16 multiply by the block scale; the 2^14
# is folded into qk_scale and the V scale). Both are exact, so both equal the same reference.
DEQUANT = {"f32": 0, "f16": 1}
F16_FOLD = 2.0**14
# The two matmuls: tensor cores ("dot", rows padded to GROUP_PAD >= 16: 75% padding at 4 query heads per KV
# head) or the candidate "fma" (broadcast multiply-sum, rows padded only to the next power of two).
MMA = ("dot", "fma")


# ---------------------------------------------------------------------------------------------
# torch reference
# ---------------------------------------------------------------------------------------------


def decode_attention_reference(
    q: torch.Tensor, c: PagedKVCache, block_table: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float | None = None
) -> torch.Tensor:
    """float32 [B, Hq, D]: softmax(q·K^T · sm_scale)·V per sequence, K/V dequantized by the reference."""
    b, hq, d = q.shape
    group = hq // c.num_kv_heads
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    out = torch.empty(b, hq, d, dtype=torch.float32, device=q.device)
    for i in range(b):
        k, v = read_reference(c, block_table[i], int(seq_lens[i]))  # [Hkv, L, D]
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hld->hl", q[i].float(), k) * sm_scale
        out[i] = torch.einsum("hl,hld->hd", scores.softmax(dim=-1), v)
    return out


# ---------------------------------------------------------------------------------------------
# Triton
# ---------------------------------------------------------------------------------------------


@triton.jit
def _decode_partition_kernel(
    q_ptr,
    cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    qk_scale,  # sm_scale * k_scale * log2(e): softmax in base 2
    stride_qb,
    stride_qh,
    stride_bt,
    max_parts,
    partition,
    FMT: tl.constexpr,
    FP8_DECODE: tl.constexpr,
    HKV: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
    TILE_N: tl.constexpr,
    UPCAST: tl.constexpr,
    VARIANT: tl.constexpr = 0,
    DEQ: tl.constexpr = 0,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    p = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = p * partition
    if start < seq_len:
        end = tl.minimum(start + partition, seq_len)
        rows = tl.arange(0, GROUP_PAD)
        row_mask = rows < GROUP
        qh = h * GROUP + rows
        stat = (b * (HKV * GROUP) + qh) * max_parts + p
        if VARIANT == 0:
            _attend(
                q_ptr,
                cache_ptr,
                block_table_ptr,
                m_ptr,
                l_ptr,
                acc_ptr,
                qk_scale,
                stride_qb,
                stride_qh,
                stride_bt,
                b,
                h,
                start,
                end,
                rows,
                row_mask,
                stat,
                FMT,
                FP8_DECODE,
                HKV,
                GROUP,
                GROUP_PAD,
                T,
                D,
                TILE_N,
                UPCAST,
                DEQ,
            )
        else:
            isolate_partition(
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
                FMT,
                FP8_DECODE,
                HKV,
                GROUP_PAD,
                T,
                D,
                TILE_N,
                VARIANT,
                DEQ,
            )


@triton.jit
def _attend(
    q_ptr,
    cache_ptr,
    block_table_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_bt,
    b,
    h,
    start,
    end,
    rows,
    row_mask,
    stat,
    FMT: tl.constexpr,
    FP8_DECODE: tl.constexpr,
    HKV: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    T: tl.constexpr,
    D: tl.constexpr,
    TILE_N: tl.constexpr,
    UPCAST: tl.constexpr,
    DEQ: tl.constexpr,
):
    """The attention of one (sequence, kv head, partition): softmax statistics and unnormalised output."""
    q_row = q_ptr + b * stride_qb + (h * GROUP + rows) * stride_qh
    dt = q_ptr.dtype.element_ty
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    if FMT == 3:
        half = tl.arange(0, D // 2)
        q_even = tl.load(q_row[:, None] + 2 * half[None, :], mask=row_mask[:, None], other=0.0)
        q_odd = tl.load(q_row[:, None] + 2 * half[None, :] + 1, mask=row_mask[:, None], other=0.0)
        acc_e = tl.zeros([GROUP_PAD, D // 2], tl.float32)
        acc_o = tl.zeros([GROUP_PAD, D // 2], tl.float32)
    else:
        cols = tl.arange(0, D)
        qv = tl.load(q_row[:, None] + cols[None, :], mask=row_mask[:, None], other=0.0)
        acc = tl.zeros([GROUP_PAD, D], tl.float32)
    for n0 in range(start, end, TILE_N):
        offs = n0 + tl.arange(0, TILE_N)
        n_mask = offs < end
        page = tl.load(block_table_ptr + b * stride_bt + offs // T, mask=n_mask, other=0).to(tl.int64)
        tok = offs % T
        if FMT == 3:
            k_lo, k_hi = load_nvfp4(cache_ptr, page, tok, n_mask, 0, FP8_DECODE, HKV, h, T, D, DEQ)
            s = tile_mma(q_even, tl.trans(k_lo), dt, UPCAST) + tile_mma(q_odd, tl.trans(k_hi), dt, UPCAST)
        else:
            k = load_rows(cache_ptr, page, tok, n_mask, 0, cols, FMT, FP8_DECODE, HKV, h, T, D)
            s = tile_mma(qv, tl.trans(k), dt, UPCAST)
        s = tl.where(n_mask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        pr = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        if FMT == 3:
            v_lo, v_hi = load_nvfp4(cache_ptr, page, tok, n_mask, 1, FP8_DECODE, HKV, h, T, D, DEQ)
            acc_e = acc_e * alpha[:, None] + tile_mma(pr, v_lo, dt, UPCAST)
            acc_o = acc_o * alpha[:, None] + tile_mma(pr, v_hi, dt, UPCAST)
        else:
            v = load_rows(cache_ptr, page, tok, n_mask, 1, cols, FMT, FP8_DECODE, HKV, h, T, D)
            acc = acc * alpha[:, None] + tile_mma(pr, v, dt, UPCAST)
        m_i = m_new
    tl.store(m_ptr + stat, m_i, mask=row_mask)
    tl.store(l_ptr + stat, l_i, mask=row_mask)
    if FMT == 3:
        tl.store(acc_ptr + stat[:, None] * D + 2 * half[None, :], acc_e, mask=row_mask[:, None])
        tl.store(acc_ptr + stat[:, None] * D + 2 * half[None, :] + 1, acc_o, mask=row_mask[:, None])
    else:
        tl.store(acc_ptr + stat[:, None] * D + cols[None, :], acc, mask=row_mask[:, None])


@triton.jit
def _decode_reduce_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    seq_lens_ptr,
    out_ptr,
    v_scale,
    max_parts,
    partition,
    stride_ob,
    stride_oh,
    HQ: tl.constexpr,
    D: tl.constexpr,
):
    """Merge the partitions of one (sequence, query head): rescale each to the common max, sum, divide."""
    b = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    n_parts = tl.cdiv(tl.load(seq_lens_ptr + b), partition)
    base = (b * HQ + hq) * max_parts
    m_max = float("-inf")
    for i in range(0, n_parts):
        m_max = tl.maximum(m_max, tl.load(m_ptr + base + i))
    cols = tl.arange(0, D)
    total = 0.0
    acc = tl.zeros([D], tl.float32)
    for i in range(0, n_parts):
        w = tl.exp2(tl.load(m_ptr + base + i) - m_max)
        total += w * tl.load(l_ptr + base + i)
        acc += w * tl.load(acc_ptr + (base + i) * D + cols)
    out = acc / total * v_scale
    tl.store(out_ptr + b * stride_ob + hq * stride_oh + cols, out.to(out_ptr.dtype.element_ty))


def default_fp8_decode(device: torch.device) -> int:
    """E4M3 decode mode for this device: native fp8 from sm_89, the fp8e4b15 trick on sm_80..88,
    integer decode in the interpreter."""
    if device.type != "cuda":
        return 0
    major, minor = torch.cuda.get_device_capability(device)
    return 1 if major * 10 + minor >= 89 else 2


def default_partition(batch: int, num_kv_heads: int, max_seq_len: int, tile_n: int, device: torch.device) -> int:
    """Tokens per split-KV partition: enough (sequence, head, partition) programs for ~4 waves on the
    GPU, but at least 4 tiles per partition so the merge stays cheap."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    want_parts = max(1, -(-4 * sms // (batch * num_kv_heads)))
    part = -(-max_seq_len // want_parts)
    part = max(4 * tile_n, -(-part // tile_n) * tile_n)
    return part


def decode_attention(
    q: torch.Tensor,
    c: PagedKVCache,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    tile_n: int = 64,
    partition: int | None = None,
    max_seq_len: int | None = None,
    fp8_decode: int | None = None,
    workspace: dict | None = None,
    variant: str = "full",
    dequant: str = "f32",
    num_warps: int | None = None,
    num_stages: int | None = None,
    mma: str = "dot",
) -> torch.Tensor:
    """Triton: [B, Hq, D] attention output of one query token per sequence against its paged K/V.

    q: [B, Hq, D] fp16/bf16 (the model dtype; the dequantized cache is converted to it for the
    matmuls). block_table: int32 [B, max_pages]; seq_lens: int32 [B]. workspace: a dict the caller
    keeps to reuse the split-KV buffers between calls (benchmarks). variant: "full" (attention), or a
    cost-isolating variant (VARIANTS; kernels/variants.py has what they compute). dequant: NVFP4's DEQUANT
    path. num_warps / num_stages: Triton's launch options (None: Triton's defaults), swept by kernels/sweep.py.
    mma: MMA.
    """
    if variant not in VARIANTS or dequant not in DEQUANT or mma not in MMA:
        raise ValueError(
            f"variant {variant!r} / dequant {dequant!r} / mma {mma!r}: choose from {', '.join(VARIANTS)} / "
            f"{', '.join(DEQUANT)} / {', '.join(MMA)}"
        )
    b, hq, d = q.shape
    if hq % c.num_kv_heads:
        raise ValueError(f"{hq} query heads are not a multiple of {c.num_kv_heads} KV heads")
    if d != c.head_dim or d & (d - 1) or d < 16:
        raise ValueError(f"head_dim must match the cache ({c.head_dim}) and be a power of two >= 16, got {d}")
    if q.stride(-1) != 1:
        raise ValueError("q needs a contiguous last dimension")
    group = hq // c.num_kv_heads
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    partition = partition or default_partition(b, c.num_kv_heads, max_seq_len, tile_n, q.device)
    if partition % tile_n:
        raise ValueError(f"partition ({partition}) must be a multiple of tile_n ({tile_n})")
    max_parts = -(-max_seq_len // partition)
    fp8_decode = default_fp8_decode(q.device) if fp8_decode is None else fp8_decode
    ws = workspace if workspace is not None else {}
    key = (b, hq, d, max_parts)
    if ws.get("key") != key:
        ws.update(
            key=key,
            m=torch.empty(b, hq, max_parts, dtype=torch.float32, device=q.device),
            l=torch.empty(b, hq, max_parts, dtype=torch.float32, device=q.device),
            acc=torch.empty(b, hq, max_parts, d, dtype=torch.float32, device=q.device),
        )
    out = torch.empty(b, hq, d, dtype=out_dtype or q.dtype, device=q.device)
    # the f16 path's values are 2^-14 times the stored ones, for K and V alike
    fold = F16_FOLD if c.fmt == "nvfp4" and dequant == "f16" and variant != "load_only" else 1.0
    launch = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    _decode_partition_kernel[(b, c.num_kv_heads, max_parts)](
        q,
        c.cache,
        block_table,
        seq_lens,
        ws["m"],
        ws["l"],
        ws["acc"],
        sm_scale * c.k_scale * LOG2E * fold,
        q.stride(0),
        q.stride(1),
        block_table.stride(0),
        max_parts,
        partition,
        FMT=_FMT_CODE[c.fmt],
        FP8_DECODE=fp8_decode,
        HKV=c.num_kv_heads,
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group) if mma == "fma" else max(16, triton.next_power_of_2(group)),
        T=c.block_size,
        D=d,
        TILE_N=tile_n,
        UPCAST=2 if mma == "fma" else int(q.dtype == torch.bfloat16 and q.device.type != "cuda"),
        VARIANT=VARIANTS[variant],
        DEQ=DEQUANT[dequant],
        **launch,
    )
    _decode_reduce_kernel[(b, hq)](
        ws["m"],
        ws["l"],
        ws["acc"],
        seq_lens,
        out,
        c.v_scale * fold,
        max_parts,
        partition,
        out.stride(0),
        out.stride(1),
        HQ=hq,
        D=d,
    )
    return out
