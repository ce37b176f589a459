"""DeepSeek V4's KV caches as vLLM 0.32 allocates them: several caches per decoder layer, packed into one block.

Each decoder layer of compress ratio r (config `compress_ratios`; 0 and the MTP layer count as 1) registers
(vllm/models/deepseek_v4/attention.py DeepseekV4Attention.__init__, compressor.py, v1/attention/backends/mla/
sparse_swa.py):
  * a sliding-window latent cache, DeepseekV4SWACache: SlidingWindowMLASpec, 64-token blocks, window
    `sliding_window`, one 512-wide latent per token;
  * r > 1: the compressed latent, DeepseekV4Attention.get_kv_cache_spec: MLAAttentionSpec, the cache block size,
    one state per r tokens (tokens_per_state);
  * r in (4, 128): the compressor's running state, CompressorStateCache: SlidingWindowMLASpec of float32
    [block 4 or 8, 2 x coff x head_dim], window coff x r (coff = 2 for r = 4, else 1);
  * r = 4: the indexer's key cache, DeepseekV4IndexerCache (MLAAttentionSpec, head_dim + head_dim / 128 x 4 bytes
    per state, uint8) and its own compressor's state (head_dim = index_head_dim).
With the fp8_ds_mla layout a latent takes 584 B (448 fp8 NoPE + 128 bf16 RoPE + 8 scale bytes); every page is
rounded up to 576 B (512 B on the plain-row layouts): kv_cache_interface.py _apply_alignment_padding.

vLLM packs these mixed pages block-outermost (v1/core/kv_cache_utils.py _get_packed_kv_cache_groups): layers are
bucketed by spec type (UniformTypeKVCacheSpecs.is_uniform_type: one block size, one window); a bucket whose page
sizes come in equal numbers is a repeating pattern, split into groups of `repeats` pattern copies (chosen by
_approximate_gcd to pad least); one block holds one page of every layer of the widest group
(_get_kv_cache_bytes_per_block), every group draws its blocks from that one pool, and a request takes, per group,
the blocks its spec's max_memory_usage_bytes needs (get_max_concurrency_for_kv_cache_config). The compressor
states are sliding windows of 8 or 128 tokens in 4- or 8-token blocks: a request holds them for every token in
flight, which is why the tokens vLLM reports per GiB fall as max_model_len shrinks (vLLM issue 51041).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from kvbench.core.errors import UsageError
from kvbench.specs.modelspec import LayerKind, ModelSpec

SWA_BLOCK = 64  # DeepseekV4SWACache(block_size=64)
BLOCK = 256  # DeepseekV4SparseMLABackend / DeepseekV4IndexerBackend.get_supported_kernel_block_sizes: [256]
DS_MLA_STATE_BYTES = 584  # attention.py get_kv_cache_spec: 448 B NoPE + 128 B RoPE + 8 B fp8 scale
DS_MLA_ALIGN = 576  # FlashMLA packing stride
PLAIN_ALIGN = 512  # FlashInfer sparse (#44577)
INDEXER_QUANT_BLOCK = 128  # one fp32 scale per 128 fp8 values (DeepseekV4Indexer.quant_block_size)
STATE_BLOCKS = {4: 4, 128: 8}  # CompressorStateCache.block_size per compress ratio
# The dtypes DeepSeek V4's default CUDA backends take (models/deepseek_v4/sparse_mla.py DeepseekV4SparseMLABackend.
# supported_kv_cache_dtypes; FlashMLA, and FlashInfer on SM12x, both keep the fp8_ds_mla layout): attention.py
# _resolve_dsv4_kv_cache_dtype stores "auto" and every fp8 spelling as fp8_ds_mla.
DS_MLA_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")


@dataclass(frozen=True)
class Cache:
    """One layer's cache as vLLM registers it: its spec's type, block, window and padded page."""

    what: str  # "sliding-window latent", "compressed latent 1:4", ...
    spec: str  # vLLM's spec class: SlidingWindowMLASpec or MLAAttentionSpec
    block_size: int
    page_bytes: int
    window: int = 0  # SlidingWindowMLASpec only

    @property
    def bucket(self) -> tuple:
        """UniformTypeKVCacheSpecs.is_uniform_type: one block size; sliding windows of one size."""
        return (self.spec, self.block_size, self.window)

    def blocks(self, context: int, in_flight: int, retained: int = 0) -> int:
        """<Spec>.max_memory_usage_bytes / page: SlidingWindowSpec.max_admission_blocks_per_request,
        FullAttentionSpec's cdiv(max_model_len, block_size)."""
        if self.spec == "SlidingWindowMLASpec":
            return math.ceil(min(self.window - 1 + retained + in_flight, context) / self.block_size) + 1
        return math.ceil(context / self.block_size)


@dataclass(frozen=True)
class Group:
    """One KV-cache group: its caches (all of one bucket), the pages it puts in a block, its blocks per request."""

    caches: tuple[tuple[Cache, int], ...]  # (cache, layers of it in this group)
    blocks_per_request: int

    @property
    def page_bytes(self) -> int:
        return sum(c.page_bytes * n for c, n in self.caches)

    @property
    def layers(self) -> int:
        return sum(n for _, n in self.caches)

    def describe(self) -> str:
        parts = ", ".join(f"{n} x {c.what} ({c.page_bytes:,} B)" for c, n in self.caches)
        first = self.caches[0][0]
        why = (
            f"min(window {first.window} - 1 + in-flight tokens, context) / {first.block_size} + 1"
            if first.spec == "SlidingWindowMLASpec"
            else f"context / {first.block_size}"
        )
        return (
            f"{first.spec} group, {first.block_size}-token blocks: {parts}; "
            f"{self.blocks_per_request:,} blocks per request = {why}"
        )


def is_dsv4(model: ModelSpec) -> bool:
    return any(layer.kind == "dsv4" for layer in model.layers)


def refusal(vllm_dtype: str | None) -> str | None:
    """Why vLLM's default DeepSeek V4 backends refuse this --kv-cache-dtype, or None."""
    if vllm_dtype in DS_MLA_DTYPES:
        return None
    return (
        f"DeepSeek V4's attention (FlashMLA sparse, fp8_ds_mla layout) takes --kv-cache-dtype "
        f"{', '.join(DS_MLA_DTYPES)} only, got {vllm_dtype or 'a format vLLM has no cache dtype for'} "
        "(vllm/models/deepseek_v4/attention.py _resolve_dsv4_kv_cache_dtype, sparse_mla.py)"
    )


def _round_up(x: int, align: int) -> int:
    return -(-x // align) * align


def layer_caches(layer: LayerKind, block_size: int = BLOCK) -> list[Cache]:
    """The caches one DeepSeek V4 layer registers, with the fp8_ds_mla layout of the default CUDA backends."""
    ratio, head = layer.token_stride, layer.head_dim or 512
    out = [
        Cache(
            "sliding-window latent",
            "SlidingWindowMLASpec",
            SWA_BLOCK,
            _round_up(SWA_BLOCK * DS_MLA_STATE_BYTES, DS_MLA_ALIGN),
            layer.window,
        )
    ]
    if ratio > 1:
        states = block_size // ratio
        out.append(
            Cache(
                f"compressed latent 1:{ratio}",
                "MLAAttentionSpec",
                block_size,
                _round_up(states * DS_MLA_STATE_BYTES, DS_MLA_ALIGN),
            )
        )
    if ratio in STATE_BLOCKS:
        out.append(_state(f"compressor state 1:{ratio}", ratio, head))
    if ratio == 4 and layer.index_head_dim:
        dim = layer.index_head_dim
        key = dim + dim // INDEXER_QUANT_BLOCK * 4  # fp8 key + fp32 scale (the FP8 indexer cache, the default)
        out.append(
            Cache(
                f"indexer key 1:{ratio}",
                "MLAAttentionSpec",
                block_size,
                _round_up(block_size // ratio * key, DS_MLA_ALIGN),
            )
        )
        out.append(_state(f"indexer compressor state 1:{ratio}", ratio, dim))
    return out


def _state(what: str, ratio: int, head_dim: int) -> Cache:
    coff = 2 if ratio == 4 else 1
    block = STATE_BLOCKS[ratio]
    page = block * 2 * coff * head_dim * 4  # float32 [block, kv_state + score_state]
    return Cache(what, "SlidingWindowMLASpec", block, _round_up(page, DS_MLA_ALIGN), coff * ratio)


def _approximate_gcd(values: list[int], lower_bound: int) -> int:
    """kv_cache_utils.py _approximate_gcd: the chunk in [lower_bound, max] that pads least (ties: the larger)."""
    best, best_pad = max(1, lower_bound), None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best):
            best, best_pad = d, pad
    return best


def groups(model: ModelSpec, block_size: int, context: int, in_flight: int) -> tuple[list[Group], int]:
    """vLLM's packed groups of one rank's caches and the bytes of one pool block (_get_packed_kv_cache_groups,
    _get_kv_cache_bytes_per_block with no block-stride alignment: every spec's kernel block is its block)."""
    buckets: dict[tuple, Counter] = {}
    for layer in model.layers:
        if layer.kind != "dsv4":
            if layer.cached:
                raise UsageError(f"{model.name}: a {layer.kind} layer beside DeepSeek V4's is not modelled")
            continue
        for cache in layer_caches(layer, block_size):
            buckets.setdefault(cache.bucket, Counter())[cache] += 1
    # a bucket is balanced when each page size has the same layer count (one layer per page size per repeat)
    info = []
    for caches in buckets.values():
        by_page = Counter()
        for cache, n in caches.items():
            by_page[cache.page_bytes] += n
        info.append((caches, by_page, len(set(by_page.values())) == 1))
    floor = max((max(p.values()) for _, p, bal in info if bal and len(p) > 1), default=0)
    repeats = _approximate_gcd([max(p.values()) for _, p, bal in info if bal], floor) if floor else None

    def n_groups(by_page: Counter, balanced: bool) -> int:
        return math.ceil(max(by_page.values()) / repeats) if balanced and repeats else 1

    def is_state(caches: Counter) -> bool:  # no Mamba or ring buffer here: only unsplit sliding buckets
        return repeats is None and next(iter(caches)).spec == "SlidingWindowMLASpec"

    def widest(by_page: Counter, n: int) -> int:
        return sum(math.ceil(count / n) * page for page, count in by_page.items())

    anchor = max(widest(p, sum(c.values()) if is_state(c) else n_groups(p, bal)) for c, p, bal in info)
    out: list[Group] = []
    for caches, by_page, balanced in info:
        n = n_groups(by_page, balanced)
        if is_state(caches):
            per_block = max(anchor // next(iter(caches)).page_bytes, 1)
            n = max(n, math.ceil(sum(caches.values()) / per_block))
        need = max(c.blocks(context, in_flight, model.retained_tokens) for c in caches)
        for i in range(n):
            # pattern repeats i, i + n, ...: each cache's layers spread evenly over the n groups
            share = tuple((c, len(range(i, count, n))) for c, count in caches.items())
            out.append(Group(tuple((c, k) for c, k in share if k), need))
    return out, max(g.page_bytes for g in out)


def bytes_per_token(layer: LayerKind, block_size: int = BLOCK) -> float:
    """What a token adds to one layer's caches as the context grows (the compressed latent and indexer key)."""
    return sum(c.page_bytes / c.block_size for c in layer_caches(layer, block_size) if c.spec == "MLAAttentionSpec")
