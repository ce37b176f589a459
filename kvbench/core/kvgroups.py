"""The KV-cache groups of a capacity prediction, as a run record stores them beside the engine's figures: one
entry per layer spec (full attention, a sliding window, ...) with its layers, vLLM's groups of it, tokens per
block and the blocks a request of the context holds in each group (kvbench.specs.vllm_accounting's steps 3 and 5)."""

from __future__ import annotations


def layer_groups(spec, accounting) -> list[dict] | None:
    """[{kind, window, layers, groups, tokens_per_block, blocks_per_request}] of a capacity row's accounting
    (None without one). blocks_per_request is per group: a request holds that many blocks in each of the spec's
    groups, and every group draws from the one pool of num_blocks."""
    if accounting is None:
        return None
    if accounting.cache_groups:  # DeepSeek V4: one entry per packed group of its caches (kvbench.specs.dsv4_kv)
        return [
            {
                "kind": g.caches[0][0].spec,
                "window": g.caches[0][0].window or None,
                "layers": g.layers,
                "groups": 1,
                "tokens_per_block": g.caches[0][0].block_size,
                "blocks_per_request": g.blocks_per_request,
            }
            for g in accounting.cache_groups
        ]
    counts = spec.layer_counts()
    groups, sizes, blocks = accounting.groups, accounting.block_sizes, dict(accounting.spec_blocks)
    return [
        {
            "kind": kind.kind,
            "window": kind.window,
            "layers": counts.get(kind, 0),
            "groups": groups.get(kind, 0),
            "tokens_per_block": sizes.get(kind),
            "blocks_per_request": blocks.get(kind),
        }
        for kind in counts
    ]
