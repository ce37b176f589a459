"""The formats the Triton paged-cache kernels lay out (kernels/paged_cache.py, decode_attention.py): one entry
per kernel key of formats.toml's `cache_kernel` set, with what the kernels' torch reference, the decode variants'
references (variants.py), the benchmarks' random caches (bench.py) and the sweep's candidates (sweep.py) need to
know of it. The layout itself is paged_cache.py's docstring: cache[num_blocks, 2H, T, W], K side then V side.
A format the kernels should write and read is one entry here plus its branch (`code`) in the Triton kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.kernels import fp8 as fp8_ref
from kvbench.kernels import nvfp4 as nvfp4_ref

PagedKVCache = Any  # kvbench.kernels.paged_cache.PagedKVCache (not imported: paged_cache imports this module)


def _rows(c: PagedKVCache) -> torch.Tensor:
    """[nb, 2, H, T, D] view of a cache whose row is D elements (every format but nvfp4)."""
    return c.cache.view(c.num_blocks, 2, c.num_kv_heads, c.block_size, c.head_dim)


def nvfp4_side_views(c: PagedKVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """(data [nb, 2, H, T, D/2], scales [nb, 2, H, T, D/16]) views of an NVFP4 cache."""
    nb, h, t, d = c.num_blocks, c.num_kv_heads, c.block_size, c.head_dim
    sides = c.cache.view(nb, 2, h * t * _nvfp4_row_width(d))
    n_data = h * t * d // 2
    return sides[..., :n_data].view(nb, 2, h, t, d // 2), sides[..., n_data:].view(nb, 2, h, t, d // 16)


@dataclass(frozen=True)
class KernelLayout:
    """What the Triton kernels and their torch reference know of one format; a format the kernels should write
    and read is one entry here plus its branch (`code`) in the Triton kernels."""

    code: int  # the constexpr FMT the Triton kernels branch on
    element: torch.dtype  # what the cache tensor holds
    row_width: Callable[[int], int]  # head_dim -> W
    # reference write: (cache, pages, side, offsets, rows [tokens, H, D], tensor scale) -> None
    write: Callable[..., None]
    # reference read: (cache, pages, side, tensor scale) -> float32 [pages, H, T, D]
    read: Callable[..., torch.Tensor]
    # the stored bits as integers (decode variants' load_only): (cache, pages, side) -> [pages, H, T, W']
    stored: Callable[..., torch.Tensor]
    # a cache full of valid random entries (benchmarks; timing does not depend on the values)
    fill_random: Callable[[PagedKVCache, torch.Generator], None]
    dequant_paths: tuple[str, ...] = ("f32",)  # the decode kernel's dequantization paths for this format
    encoders: tuple[str, ...] = ("compare",)  # the write kernel's encoders (ENCODERS)


def _half(dtype: torch.dtype) -> KernelLayout:
    def write(c, blk, side, off, x, scale):
        _rows(c)[blk, side, :, off] = x.to(c.cache.dtype)

    return KernelLayout(
        code=0,
        element=dtype,
        row_width=lambda d: d,
        write=write,
        read=lambda c, pages, side, scale: _rows(c)[pages, side].float(),
        stored=lambda c, pages, side: _rows(c)[pages, side].view(torch.int16).long() & 0xFFFF,
        fill_random=lambda c, g: c.cache.normal_(generator=g),
    )


def _fp8(code: int, name: str, lo: int, hi: int) -> KernelLayout:
    def write(c, blk, side, off, x, scale):
        _rows(c)[blk, side, :, off] = fp8_ref.quantize(x, scale, name)

    return KernelLayout(
        code=code,
        element=torch.uint8,
        row_width=lambda d: d,
        write=write,
        read=lambda c, pages, side, scale: fp8_ref.dequantize(_rows(c)[pages, side], scale, name),
        stored=lambda c, pages, side: _rows(c)[pages, side].long(),
        fill_random=lambda c, g: c.cache.random_(lo, hi, generator=g),  # codes lo..hi: no NaN/Inf
    )


def _nvfp4_row_width(head_dim: int) -> int:
    if head_dim % nvfp4_ref.BLOCK:
        raise ValueError(f"nvfp4 needs head_dim divisible by 16, got {head_dim}")
    return nvfp4_ref.row_bytes(head_dim)


def _nvfp4_write(c, blk, side, off, x, scale):
    q = nvfp4_ref.quantize(x, scale)
    data, scales = nvfp4_side_views(c)
    # [tokens, H, ...] rows go to [blk, side, h, off, ...]
    data[blk, side, :, off] = q.data
    scales[blk, side, :, off] = q.scales


def _nvfp4_read(c, pages, side, scale):
    data, scales = nvfp4_side_views(c)
    return nvfp4_ref.dequantize(nvfp4_ref.Nvfp4Tensor(data[pages, side], scales[pages, side], scale))


def _nvfp4_stored(c, pages, side):
    """Data byte j in column 2j and the block's E4M3 scale byte in column 2j + 1."""
    data, scales = nvfp4_side_views(c)
    d, s = data[pages, side], scales[pages, side]
    blocks = s.long().repeat_interleave(8, dim=-1)  # column pair j lies in block j // 8
    return torch.stack((d.long(), blocks), dim=-1).flatten(-2)


def _nvfp4_fill(c, g):
    """Random nibbles with block scales 0.125..0.23, so values stay O(1)."""
    c.cache.random_(0, 256, generator=g)
    h, t, d = c.num_kv_heads, c.block_size, c.head_dim
    sides = c.cache.view(c.num_blocks, 2, h * t * _nvfp4_row_width(d))
    sides[..., h * t * d // 2 :].random_(0x20, 0x28, generator=g)  # E4M3 0.125 .. 0.2344


LAYOUTS: dict[str, KernelLayout] = {
    "fp16": _half(torch.float16),
    "bf16": _half(torch.bfloat16),
    "fp8": _fp8(1, "e4m3", 0x20, 0x48),  # magnitudes 2^-3..2
    "fp8_e5m2": _fp8(2, "e5m2", 0x2C, 0x40),
    "nvfp4": KernelLayout(
        code=3,
        element=torch.uint8,
        row_width=_nvfp4_row_width,
        write=_nvfp4_write,
        read=_nvfp4_read,
        stored=_nvfp4_stored,
        fill_random=_nvfp4_fill,
        dequant_paths=("f32", "f16"),
        encoders=("compare", "bits"),
    ),
}
