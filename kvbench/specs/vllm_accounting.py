"""vLLM's KV-cache accounting for a model's per-layer specs (kvbench.specs.layerspec), per release.

Every step follows vLLM 0.32's code (file and function named at each step):
  1. hybrid attention + Mamba/GDN: the attention block size is raised until its page holds one layer's
     recurrent state, and the state page is padded to the attention page (platforms/interface.py
     Platform._align_hybrid_block_size: "Setting attention block size to N tokens");
  2. attention specs of different page sizes are made equal by raising the smaller pages' block size
     (v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size);
  3. layers are grouped by spec, group_size = the smallest spec's layer count, or the largest's when
     that is under 1.5x the smallest; each spec splits into cdiv(n, group_size) groups
     (kv_cache_utils.py _get_kv_cache_groups_uniform_page_size);
  4. num_blocks = pool // (group_size x page) (kv_cache_utils.py get_kv_cache_config_from_groups);
  5. a request at L tokens takes, per group, cdiv(spec.max_memory_usage_bytes, page) blocks
     (kv_cache_utils.py get_max_concurrency_for_kv_cache_config; kv_cache_interface.py
     FullAttentionSpec / SlidingWindowSpec / ChunkedLocalAttentionSpec / MambaSpec .max_memory_usage_bytes);
     max_concurrency = num_blocks / that sum;
  6. "GPU KV cache size: N tokens": from 0.20 N = int(max_concurrency x L) (kv_cache_utils.py
     get_kv_cache_capacity); up to 0.19 N = num_blocks // len(groups) x min block size
     (_report_kv_cache_config at commit 001cabc1, vLLM issue #40691), which divides a hybrid's pool by
     its group count, O(1) Mamba groups included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvbench.specs import dsv4_kv
from kvbench.specs.formats import CacheFormat
from kvbench.specs.modelspec import LayerKind, ModelSpec

# vLLM 0.32 CacheConfig.mamba_cache_mode: "none" unless prefix caching is on for a Mamba model
# (model_executor/models/config.py MambaModelConfig.verify_and_update_config sets "align").
MAMBA_PAGES_PER_REQUEST = {"none": 1, "align": 2}  # MambaSpec.max_memory_usage_bytes, no speculative blocks
# 0.32: hybrid models default to prefix caching (config/model.py is_prefix_caching_supported: "hybrid"
# -> True), which turns mamba_cache_mode to "align"; earlier releases are taken as "none" (not checked).
ALIGN_DEFAULT_SINCE = (0, 32)
NEW_TOKEN_FORM_SINCE = (0, 20)  # vLLM issue #51041: N = int(max_concurrency x max_model_len)
# MambaMixer2's prefill checkpoint page in align mode (0.32's source; older releases are not read)
MAMBA2_CHECKPOINT_SINCE = (0, 32)


@dataclass(frozen=True)
class Accounting:
    block_size: int  # the attention block size vLLM runs with (after step 1)
    raised_from: int | None  # the block size asked for, where step 1 raised it
    page_bytes: float  # one layer's page, every group (after steps 1-2)
    mamba_page_bytes: float  # one layer's recurrent state, unpadded (0 without Mamba/GDN layers)
    group_size: int
    group_counts: tuple[tuple[LayerKind, int], ...]  # groups per spec (pairs: JSON-safe through asdict)
    spec_block_sizes: tuple[tuple[LayerKind, int], ...]  # tokens per block per spec (step 2)
    pool_block_bytes: float
    num_blocks: int
    blocks_per_request: int
    context_bytes: float  # per request: the part that grows with L
    fixed_bytes: float  # per request: Mamba state pages
    max_concurrency: float
    kv_tokens: int  # in the form `version` prints
    token_form: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    in_flight_tokens: int = 0  # what a sliding-window / chunked group reserves beyond its window (step 5)
    spec_blocks: tuple[tuple[LayerKind, int], ...] = ()  # blocks per request per group of each spec (step 5)
    cache_groups: tuple[
        dsv4_kv.Group, ...
    ] = ()  # DeepSeek V4: vLLM's packed groups of its caches (kvbench.specs.dsv4_kv)

    @property
    def groups(self) -> dict[LayerKind, int]:
        return dict(self.group_counts)

    @property
    def block_sizes(self) -> dict[LayerKind, int]:
        return dict(self.spec_block_sizes)

    @property
    def num_groups(self) -> int:
        return len(self.cache_groups) or sum(self.groups.values())


def _vkey(version: str | None) -> tuple[int, int]:
    if not version:
        return (99, 0)
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:2]]
    return (parts[0], parts[1] if len(parts) > 1 else 0)


def _group_size(counts: dict[LayerKind, int]) -> int:
    """kv_cache_utils.py _get_kv_cache_groups_uniform_page_size."""
    smallest, largest = min(counts.values()), max(counts.values())
    return largest if largest < smallest * 1.5 else smallest


def _blocks(
    kind: LayerKind, context: int, block: int, in_flight: int, mamba_mode: str, model: ModelSpec, version
) -> int:
    """kv_cache_interface.py <Spec>.max_admission_blocks_per_request / max_memory_usage_bytes."""
    if kind.kind == "mamba":
        # MambaSpec.max_memory_usage_bytes: align keeps 2 pages (+1 prefill checkpoint for Mamba2 from 0.32:
        # mamba_mixer2.py MambaMixer2.get_kv_cache_spec), every other mode 1; + num_speculative_tokens
        pages = MAMBA_PAGES_PER_REQUEST.get(mamba_mode, 1)
        if mamba_mode == "align" and kind.state.mixer == "mamba2" and _vkey(version) >= MAMBA2_CHECKPOINT_SINCE:
            pages += 1
        return pages + model.speculative_tokens
    if kind.kind == "sliding":  # SlidingWindowSpec: window - 1 + retained + in-flight tokens, + 1 for the offset
        return math.ceil(min(kind.window - 1 + model.retained_tokens + in_flight, context) / block) + 1
    if kind.kind == "chunked":  # ChunkedLocalAttentionSpec: chunk + in-flight tokens
        return math.ceil(min(kind.window + in_flight, context) / block)
    return math.ceil(context / block)


def account(
    model: ModelSpec,
    fmt: CacheFormat,
    context: int,
    pool_bytes: float,
    block_size: int,
    in_flight_tokens: int,
    version: str | None = None,
    mamba_cache_mode: str | None = None,
    engine: str = "v1",
) -> Accounting:
    """vLLM's accounting of one rank's pool for `model` (already one rank's share: kvbench.specs.capacity.rank_model).
    `mamba_cache_mode` None: the release's default with prefix caching on."""
    if dsv4_kv.is_dsv4(model):
        return _dsv4_account(model, context, pool_bytes, block_size, in_flight_tokens)
    if mamba_cache_mode is None:
        mamba_cache_mode = "align" if _vkey(version) >= ALIGN_DEFAULT_SINCE else "none"
    counts = model.layer_counts()
    act = model.activation_bytes
    per_token = {k: fmt.bytes_per_token_per_layer(model, k) for k in counts if k.kind != "mamba"}
    mamba = max((k.state.bytes(act) for k in counts if k.kind == "mamba"), default=0.0)
    notes: list[str] = []
    block, raised = block_size, None
    if mamba and per_token:
        # Platform._align_hybrid_block_size: alignment = max(kernel block, cache block size)
        one = max(per_token.values())
        need = block_size * math.ceil(mamba / (block_size * one))
        if need > block_size:
            block, raised = need, block_size
            notes.append(f"attention block size raised {block_size} -> {block} tokens (page >= Mamba state)")
    pages = {k: block * b for k, b in per_token.items()}
    page = max([*pages.values(), mamba]) if (pages or mamba) else 0.0
    if mamba and page > mamba:
        notes.append(f"Mamba page padded {mamba:,.0f} -> {page:,.0f} B (+{(page / mamba - 1) * 100:.2f}%)")
    # unify_kv_cache_spec_page_size: a smaller attention page gets a larger block
    sizes = {k: (int(round(page / b)) if b else 0) for k, b in per_token.items()}
    sizes.update({k: 0 for k in counts if k.kind == "mamba"})
    group_size = _group_size(counts) if counts else 1
    groups = {k: math.ceil(n / group_size) for k, n in counts.items()}
    padded = sum(g * group_size - counts[k] for k, g in groups.items())
    if padded:
        notes.append(f"{padded} padding layer(s) to fill groups of {group_size}")
    pool_block = group_size * page
    num_blocks = max(0, int(pool_bytes // pool_block)) if pool_block else 0
    per_group = {k: _blocks(k, context, sizes[k], in_flight_tokens, mamba_cache_mode, model, version) for k in counts}
    blocks_per_req = sum(groups[k] * per_group[k] for k in counts)
    fixed = sum(groups[k] * per_group[k] for k in counts if k.kind == "mamba") * pool_block
    conc = num_blocks / blocks_per_req if blocks_per_req else 0.0
    if engine == "v1" and _vkey(version) < NEW_TOKEN_FORM_SINCE:
        min_block = min((s for s in sizes.values() if s), default=block)
        tokens = num_blocks // max(1, sum(groups.values())) * min_block
        form = f"num_blocks // {sum(groups.values())} groups x {min_block} (vLLM <= 0.19)"
    else:
        tokens = int(conc * context)
        form = "int(max_concurrency x max_model_len) (vLLM >= 0.20)"
    return Accounting(
        block_size=block,
        raised_from=raised,
        page_bytes=page,
        mamba_page_bytes=mamba,
        group_size=group_size,
        group_counts=tuple(groups.items()),
        spec_block_sizes=tuple(sizes.items()),
        pool_block_bytes=pool_block,
        num_blocks=num_blocks,
        blocks_per_request=blocks_per_req,
        context_bytes=blocks_per_req * pool_block - fixed,
        fixed_bytes=fixed,
        max_concurrency=conc,
        kv_tokens=tokens,
        token_form=form,
        notes=tuple(notes),
        in_flight_tokens=in_flight_tokens,
        spec_blocks=tuple(per_group.items()),
    )


def _dsv4_account(model: ModelSpec, context: int, pool_bytes: float, block_size: int, in_flight: int) -> Accounting:
    """DeepSeek V4 (kvbench.specs.dsv4_kv): its packed groups share one pool of blocks; a request takes, per group, the
    blocks its spec needs (get_max_concurrency_for_kv_cache_config); tokens in the >= 0.20 form (V4 came later)."""
    notes = []
    block = block_size if block_size % dsv4_kv.BLOCK == 0 else dsv4_kv.BLOCK
    if block != block_size:
        notes.append(
            f"block {block_size} -> {block} tokens: DeepSeek V4's sparse-MLA and indexer kernels take 256-token "
            "blocks only (models/deepseek_v4/sparse_mla.py, v1/attention/backends/mla/indexer.py)"
        )
    groups, pool_block = dsv4_kv.groups(model, block, context, in_flight)
    num_blocks = max(0, int(pool_bytes // pool_block))
    per_request = sum(g.blocks_per_request for g in groups)
    growing = sum(g.blocks_per_request for g in groups if g.caches[0][0].spec == "MLAAttentionSpec")
    conc = num_blocks / per_request
    notes += [g.describe() for g in groups]
    return Accounting(
        block_size=block,
        raised_from=None,
        page_bytes=pool_block,
        mamba_page_bytes=0.0,
        group_size=max(g.layers for g in groups),
        group_counts=(),
        spec_block_sizes=(),
        pool_block_bytes=pool_block,
        num_blocks=num_blocks,
        blocks_per_request=per_request,
        context_bytes=growing * pool_block,
        fixed_bytes=(per_request - growing) * pool_block,
        max_concurrency=conc,
        kv_tokens=int(conc * context),
        token_form="int(max_concurrency x max_model_len) (vLLM >= 0.20)",
        notes=tuple(notes),
        in_flight_tokens=in_flight,
        cache_groups=tuple(groups),
    )
