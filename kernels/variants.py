"""Torch references of what the cost-isolating decode variants compute (decode_attention.VARIANTS), so that
each variant is checked on the device like the attention itself before its time is believed.

Both variants run the attention kernel's loop over the same pages and tiles but write, for every query head
of a KV head's group, a column sum over the sequence's tokens of K + V, times the V scale:
- load_only: the stored bits as integers (fp16/bf16: the 16-bit pattern; fp8: the byte; nvfp4: data byte j
  in output column 2j and the sum of the block's E4M3 scale byte in column 2j + 1), nothing decoded
  (each format's `stored` in kernels/cache_layouts.py);
- dequant_only: the dequantized values as the MMA would get them (block scales applied, tensor scale not).
"""

from __future__ import annotations

import torch

from kvbench.kernels import paged_cache as pc
from kvbench.kernels.cache_layouts import LAYOUTS

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
