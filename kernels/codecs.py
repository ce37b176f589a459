"""The numerics registry: one Codec per kernel key, from the module formats.toml's `numerics` field names.

A kernel key (a [formats.<key>] or [kernel_formats.<key>] entry of kvbench/data/formats.toml) names numerics.
Its entry's `numerics = "<module>"` says which module of kvbench.kernels implements them; importing that module
registers its Codec(s) here (`register`). Everything that quantizes K/V by format -- the accuracy study, the tiny
model's scorer, kvbench's emulated vLLM backend -- asks `get(key)` instead of keeping its own if-chain, so a new
dtype with new numerics is one registry entry plus one module.

A Codec holds
- `quant_dequant(x, scale=...)`: the reference round trip, float32 in and out (x's last dimension is head_dim);
  `scaled` says whether it takes a tensor scale (vLLM's k_scale/v_scale; 1.0 without a checkpoint scale).
  Formats that store K and V differently (turboquant) give V's as `quant_dequant_v`; `kv_round_trip(k, v)`
  applies the right one to each.
- for a vLLM cache dtype whose pages kvbench writes itself (`vllm_dtype`): the page layout as vLLM's backend
  customises the spec (`layout(head_size)`), the store (K/V rows -> page bytes at slot_mapping) and the decode
  (page bytes -> K/V rows). `pages` is one layer's cache as vLLM views it, [num_blocks, head slots, block_size,
  content bytes] (uint8 or the cache's element dtype); a slot is block * block_size + offset, all >= 0.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvbench.specs.formats import numerics_modules


@dataclass(frozen=True)
class PageLayout:
    """Bytes one token of one KV head takes in vLLM's page, as the GPU backend's `customize_spec` sizes it."""

    k_bytes: int  # K data and its scales, per head per token
    v_bytes: int  # V data and its scales
    pad_bytes: int = 0  # alignment padding vLLM adds to the slot (turboquant's slot_size_aligned)
    head_slots: int = 1  # head slots per KV head: 2 where K and V heads are separate slots (nvfp4)

    @property
    def bytes_per_head(self) -> int:
        """K + V + padding: what one KV head's token costs in the pool."""
        return self.k_bytes + self.v_bytes + self.pad_bytes

    @property
    def content_bytes(self) -> int:
        """vLLM's `state_content_bytes`: bytes per head slot per token."""
        if self.bytes_per_head % self.head_slots:
            raise ValueError(f"{self.bytes_per_head} B per head does not split into {self.head_slots} slots")
        return self.bytes_per_head // self.head_slots


@dataclass(frozen=True)
class Scales:
    """A layer's FP32 tensor dequant scales (vLLM's _k_scale_float / _v_scale_float)."""

    k: float = 1.0
    v: float = 1.0


Store = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Scales], None]
Decode = Callable[[torch.Tensor, torch.Tensor, int, int, Scales], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Codec:
    key: str  # kernel key: the formats.toml entry
    quant_dequant: Callable[..., torch.Tensor]  # (x, scale=...) -> x_hat, float32
    scaled: bool  # takes a tensor scale (`scale=` keyword)
    vllm_dtype: str | None = None  # the --kv-cache-dtype whose pages `store` writes (None: numerics only)
    layout: Callable[[int], PageLayout] | None = None  # head_size -> the page layout
    store: Store | None = None  # (pages, key [T, H, D], value, slot_mapping [T], scales) -> None
    decode: Decode | None = None  # (pages, slot_mapping, num_kv_heads, head_size, scales) -> (k, v) float32
    notes: dict = field(default_factory=dict, compare=False)  # what the store follows, for logs and records
    quant_dequant_v: Callable[..., torch.Tensor] | None = None  # V's round trip where it differs from K's
    # scaled codecs: the tensor scale calibrated from x itself (the accuracy study's "amax" convention; vLLM's
    # default without a checkpoint scale is 1.0)
    calibrated_scale: Callable[[torch.Tensor], float] | None = None

    def kv_round_trip(self, k: torch.Tensor, v: torch.Tensor, scale: float = 1.0, v_scale: float | None = None):
        """(k_hat, v_hat) float32 as the cache hands K and V back; `scale` is the tensor scale (V's is `v_scale`
        when given), ignored where the codec takes none. Use this, not quant_dequant, where K and V are both at
        hand: turboquant and ultraquant store them differently."""
        v_fn = self.quant_dequant_v or self.quant_dequant
        if not self.scaled:
            return self.quant_dequant(k), v_fn(v)
        return self.quant_dequant(k, scale=scale), v_fn(v, scale=scale if v_scale is None else v_scale)

    @property
    def pages(self) -> bool:
        """kvbench writes this dtype's pages itself (an emulated vLLM cache dtype)."""
        return self.store is not None


_REGISTRY: dict[str, Codec] = {}


def register(codec: Codec) -> Codec:
    """Called by a numerics module at import for each kernel key it implements."""
    if (codec.store is None) != (codec.decode is None) or (codec.store is not None and codec.layout is None):
        raise ValueError(f"codec {codec.key!r}: a page store needs its decode and layout")
    _REGISTRY[codec.key] = codec
    return codec


def keys() -> tuple[str, ...]:
    """Every kernel key the registry gives numerics to, in its precision order."""
    return tuple(numerics_modules())


def get(key: str) -> Codec:
    """The Codec for a kernel key: imports the module its formats.toml entry names."""
    if key in _REGISTRY:
        return _REGISTRY[key]
    modules = numerics_modules()
    if key not in modules:
        raise ValueError(f"no numerics for {key!r}; kernel keys with numerics: {', '.join(modules)}")
    # a bare name is a module of kvbench.kernels; a dotted one is imported as written (numerics kept elsewhere)
    module = modules[key] if "." in modules[key] else f"kvbench.kernels.{modules[key]}"
    if key not in _REGISTRY:
        importlib.import_module(module)
    if key not in _REGISTRY:
        raise ValueError(f"{module} registers no codec {key!r} (formats.toml `numerics`)")
    return _REGISTRY[key]


def for_vllm_dtype(kv_cache_dtype: str) -> Codec | None:
    """The Codec whose page store serves vLLM's --kv-cache-dtype value, or None."""
    for key in keys():
        codec = get(key)
        if codec.vllm_dtype == kv_cache_dtype and codec.pages:
            return codec
    return None


def page_dtypes() -> tuple[str, ...]:
    """vLLM cache dtypes kvbench can store in pages itself (the emulated backend's dtypes), in order."""
    return tuple(c.vllm_dtype for c in map(get, keys()) if c.pages and c.vllm_dtype)


# ---------------------------------------------------------------------------------------------
# Helpers the page stores share
# ---------------------------------------------------------------------------------------------


def rows(slot_mapping: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(block, offset) of each slot."""
    slots = slot_mapping.long()
    return slots // block_size, slots % block_size


def byte_view(pages: torch.Tensor) -> torch.Tensor:
    """The pages as uint8, whatever element dtype vLLM gave them (int8, fp8, uint8)."""
    return pages if pages.dtype == torch.uint8 else pages.view(torch.uint8)


def row_codec_io(encode_rows, decode_rows) -> tuple[Store, Decode]:
    """store/decode for a layout with one contiguous row of content bytes per (block, head, offset) -- every
    format but nvfp4: per-token-head [K | K scale | V | V scale], turboquant and ultraquant [K | V] slots.

    encode_rows(key [T, H, D], value, scales) -> uint8 [T, H, C]; decode_rows(rows [T, H, C], head_size,
    scales) -> (k, v) float32 [T, H, D]."""

    def store(pages, key, value, slot_mapping, scales):
        blk, off = rows(slot_mapping, pages.shape[2])
        byte_view(pages)[blk, :, off] = encode_rows(key, value, scales)

    def decode(pages, slot_mapping, num_kv_heads, head_size, scales):
        blk, off = rows(slot_mapping, pages.shape[2])
        return decode_rows(byte_view(pages)[blk, :, off], head_size, scales)

    return store, decode


def f32_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 [...] -> its 4 little-endian bytes, uint8 [..., 4] (how vLLM's kernels store a scale inline)."""
    return x.float().contiguous().unsqueeze(-1).view(torch.uint8)


def f32_from_bytes(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32).squeeze(-1)


def f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 [...] -> fp16 (round to nearest even) as 2 little-endian bytes, uint8 [..., 2]."""
    return x.to(torch.float16).contiguous().unsqueeze(-1).view(torch.uint8)


def f16_from_bytes(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).squeeze(-1).float()
