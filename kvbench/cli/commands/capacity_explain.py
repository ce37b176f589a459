"""`kvbench capacity --explain`: the per-layer KV spec kvbench read from the config, and vLLM's accounting
terms (block size, padded page, groups, num_blocks, per-request blocks, reported token form) per dtype."""

from __future__ import annotations

from kvbench.core.output import console
from kvbench.core.units import GB
from kvbench.specs.capacity import rank_model
from kvbench.specs.layerspec import describe_layer
from kvbench.specs.modelspec import ModelSpec


def _runs(model: ModelSpec) -> list[tuple[int, int, str]]:
    """Consecutive layers of one spec, as (first, last, description)."""
    out: list[tuple[int, int, str]] = []
    for i, layer in enumerate(model.layers):
        text = describe_layer(layer, model.activation_bytes)
        if out and out[-1][2] == text and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i, text)
        else:
            out.append((i, i, text))
    return out


def print_explain(model: ModelSpec, tensor_parallel_size: int, rows) -> None:
    part = rank_model(model, tensor_parallel_size)
    console.print(f"per-layer KV spec (one rank of TP {tensor_parallel_size}; kvbench/specs/layerspec.py):")
    for first, last, text in _runs(part):
        span = f"{first}" if first == last else f"{first}-{last}"
        console.print(f"  layers {span:<8} {text}")
    if model.is_multimodal:
        console.print(f"  vision tower: {model.vision_params / 1e9:.2f} B parameters (weights only, no KV cache)")
    for row in rows:
        acc = row.accounting
        if acc is None:
            continue
        if acc.cache_groups:  # DeepSeek V4: packed groups of several caches per layer (kvbench/specs/dsv4_kv.py)
            console.print(
                f"{row.dtype}: block {acc.block_size} tok; {acc.num_groups} packed groups, pool block "
                f"{acc.pool_block_bytes:,.0f} B (the widest group's pages); num_blocks {acc.num_blocks:,}; "
                f"{acc.blocks_per_request:,} blocks per request = {acc.context_bytes / GB:.3f} GB context-dependent + "
                f"{acc.fixed_bytes / GB:.3f} GB sliding windows and compressor states; "
                f"tokens reported as {acc.token_form}"
            )
            for note in acc.notes:
                console.print(f"    {note}")
            continue
        groups = ", ".join(f"{n} x {k.kind}" for k, n in acc.groups.items())
        raised = f" (raised from {acc.raised_from})" if acc.raised_from else ""
        console.print(
            f"{row.dtype}: block {acc.block_size} tok{raised}; page {acc.page_bytes:,.0f} B per layer"
            + (f" (Mamba state {acc.mamba_page_bytes:,.0f} B, padded)" if acc.mamba_page_bytes else "")
            + f"; {acc.num_groups} groups of {acc.group_size} layers ({groups}); pool block "
            f"{acc.pool_block_bytes:,.0f} B; num_blocks {acc.num_blocks:,}; {acc.blocks_per_request:,} blocks per "
            f"request = {acc.context_bytes / GB:.3f} GB context-dependent + {acc.fixed_bytes / GB:.3f} GB fixed; "
            f"tokens reported as {acc.token_form}"
        )
        for kind, blocks in acc.spec_blocks:
            console.print(f"    {_group_line(kind, blocks, acc)}")
        for note in acc.notes:
            console.print(f"    {note}")


def _group_line(kind, blocks: int, acc) -> str:
    """One spec's groups and what a request takes in each (kv_cache_interface.py <Spec>.max_memory_usage_bytes)."""
    groups = acc.groups.get(kind, 0)
    block = acc.block_sizes.get(kind, 0)
    if kind.kind == "sliding":
        why = (
            f"min(window {kind.window} - 1 + {acc.in_flight_tokens:,} in-flight tokens, context) / {block} + 1 "
            "(SlidingWindowSpec)"
        )
    elif kind.kind == "chunked":
        why = f"min(chunk {kind.window} + {acc.in_flight_tokens:,} in-flight tokens, context) / {block}"
    elif kind.kind == "mamba":
        why = "state pages, whatever the context (MambaSpec)"
    else:
        why = f"context / {block} tokens per block"
    return f"{groups} {kind.kind} group(s): {blocks:,} blocks per request each = {why}"
