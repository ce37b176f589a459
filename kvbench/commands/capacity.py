"""`kvbench capacity`: KV bytes per token, tokens that fit, max concurrent sequences per dtype."""

from __future__ import annotations

import typer
from rich.table import Table

from kvbench.capacity import Budget, budget_from_bytes, capacity_for_ranks
from kvbench.clisettings import command_from
from kvbench.commands.capacity_settings import CapacitySettings
from kvbench.errors import UsageError
from kvbench.formats import parse_format_list
from kvbench.gpus import GpuSpec, get_gpu
from kvbench.models import ModelSpec, describe_layers, load_model
from kvbench.output import console, num, print_json
from kvbench.units import GB, GiB, fmt_gib, fmt_kib
from kvbench.vllm_memory import NonKvEstimate, predict_non_kv

NAME = "capacity"
HELP = "KV bytes per token, tokens that fit and max concurrent sequences per KV dtype: naive formula vs vLLM's pages."


def settings_of(ctx: typer.Context, values: dict) -> CapacitySettings:
    return CapacitySettings(**values)


@command_from(CapacitySettings, settings_of)
def command(ctx: typer.Context, s: CapacitySettings) -> None:
    if s.from_log is not None:
        from kvbench.commands.fromlog import compare_log

        compare_log(s)
        return
    spec = load_model(s.model)
    card = get_gpu(s.gpu)
    formats = parse_format_list(s.kv_dtype)
    est = predict_non_kv(
        spec,
        card,
        utilization=s.gpu_memory_utilization,
        tensor_parallel_size=s.tensor_parallel_size,
        pipeline_parallel_size=s.pipeline_parallel_size,
        weights=s.weights,
        vllm_version=s.vllm_version,
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_model_len=s.context,
    )
    pool, overhead = _overrides(est, card, s.kv_budget_gb, s.overhead_gb, s.memory_basis)
    rows = capacity_for_ranks(spec, formats, s.context, est, card, s.block_size, pool, overhead)
    budget = _budget(est, pool, overhead)
    if budget.kv_bytes <= 0:
        raise UsageError(
            f"no memory left for the KV cache: {budget.derivation}; "
            "use more GPUs (--tensor-parallel-size, kvbench plan), smaller --weights or --kv-budget-gb"
        )
    if s.as_json:
        print_json(_as_json(spec, card, s.context, est, budget, rows))
        return
    _print_table(spec, card, s.context, est, budget, rows, rows[0].block_size if rows else s.block_size)
    if s.explain:
        from kvbench.commands.capacity_explain import print_explain

        print_explain(spec, s.tensor_parallel_size, rows)


def _as_json(spec, card, context: int, est, budget, rows: list) -> dict:
    return {
        "model": spec.name,
        "gpu": card.key,
        "context": context,
        "vllm_version": est.release.version,
        "tensor_parallel_size": est.tensor_parallel_size,
        "pipeline_parallel_size": est.pipeline_parallel_size,
        "kv_tokens": rows[0].kv_tokens,
        "budget": {"kv_bytes": budget.kv_bytes, "derivation": budget.derivation},
        "non_kv": est.as_dict(),
        "rows": rows,
    }


def _overrides(est: NonKvEstimate, card: GpuSpec, kv_budget_gb, overhead_gb, memory_basis) -> tuple:
    """(pool bytes per rank, overhead bytes per GPU) that replace kvbench's derivation, if any."""
    if kv_budget_gb is not None:
        return kv_budget_gb * GB, None
    if memory_basis == "spec":
        stage = est.stages[0]
        over = (
            overhead_gb * GB
            if overhead_gb is not None
            else (stage.activation.bytes + stage.non_torch.bytes + stage.cudagraph.bytes)
        )
        return card.spec_memory_bytes * est.utilization - stage.weights.bytes - over, None
    return None, overhead_gb * GB if overhead_gb is not None else None


def _budget(est: NonKvEstimate, pool: float | None, overhead: float | None) -> Budget:
    if pool is not None:
        return budget_from_bytes(pool, "per GPU, given or from --memory-basis spec")
    stage = min(est.stages, key=lambda s: s.kv_pool.bytes if overhead is None else s.requested.bytes - s.weights.bytes)
    if overhead is not None:
        kv = stage.requested.bytes - stage.weights.bytes - overhead
        return budget_from_bytes(
            kv,
            f"per GPU: {fmt_gib(stage.requested.bytes)} requested - "
            f"{fmt_gib(stage.weights.bytes)} weights - {fmt_gib(overhead)} --overhead-gb",
        )
    return Budget(kv_bytes=stage.kv_pool.bytes, derivation=f"{fmt_gib(stage.kv_pool.bytes)} per GPU", estimate=est)


def _print_table(spec: ModelSpec, card: GpuSpec, context: int, est: NonKvEstimate, budget: Budget, rows, block_size):
    tp, pp = est.tensor_parallel_size, est.pipeline_parallel_size
    group = f" x {tp * pp} GPUs (TP {tp}, PP {pp})" if tp * pp > 1 else ""
    console.print(
        f"[bold]{spec.name}[/] on [bold]{card.name}[/]{group} at {context:,} tokens per sequence, "
        f"vLLM {est.release.version}"
    )
    console.print(
        f"model: {spec.num_layers} layers ({describe_layers(spec)}), {spec.num_kv_heads} KV heads x head_dim "
        f"{spec.head_dim}, {spec.param_count / 1e9:.2f} B parameters"
    )
    console.print(
        f"vLLM's memory per GPU (GiB = 2^30 bytes; scheduler: max_num_seqs {est.scheduler.max_num_seqs}, "
        f"max_num_batched_tokens {est.scheduler.max_num_batched_tokens}: {est.scheduler.source}):"
    )
    for stage in est.stages:
        if pp > 1:
            console.print(f"  stage {stage.stage} (layers {stage.layers.start}-{stage.layers.stop - 1}):")
        for term in stage.terms:
            detail = f" [{term.detail}]" if term.detail else ""
            console.print(f"    {term.name:<11} {term.bytes / GiB:8.2f} GiB  {term.source}{detail}")
    console.print(
        f"KV budget per GPU: {budget.derivation}"
        if budget.estimate is None
        else f"KV pool per GPU: {fmt_gib(budget.kv_bytes)} ({budget.kv_bytes / GB:.2f} GB)"
    )
    table = Table(title=f"KV-cache capacity of the group (block size {block_size} tokens)", title_justify="left")
    for col in (
        "dtype",
        "B/elem",
        "KV per token / GPU",
        "per user (GB): context + fixed",
        "users, naive formula",
        "vLLM max concurrency",
        "users",
        "KV tokens",
        "vs auto",
    ):
        table.add_column(col, justify="left" if col == "dtype" else "right")
    notes = []
    for row in rows:
        name = f"{row.dtype} ({spec.activation_dtype})" if row.dtype == "auto" else row.dtype
        if not row.supported:
            name += " *"
            notes.append(f"* {row.dtype}: {row.reason} (numbers show the layout only)")
        table.add_row(
            name,
            f"{row.bytes_per_element:g}",
            fmt_kib(row.bytes_per_token),
            f"{num(row.context_bytes_per_user / GB, 3)} + {num(row.fixed_bytes_per_user / GB, 3)}",
            num(row.naive_users, 1),
            f"{row.max_concurrency:,.2f}x",
            f"{row.users:,}",
            f"{row.kv_tokens:,}",
            f"{row.ratio_vs_auto:.2f}x" if row.ratio_vs_auto else "—",
        )
    console.print(table)
    console.print(
        "naive formula: 2 x layers x KV heads x head_dim x context x bytes/elem (2, 1, 0.5), the article's; "
        "vLLM: whole pages, block scales included."
    )
    capped = [r for r in rows if r.users > est.scheduler.max_num_seqs]
    if capped:
        console.print(
            f"note: vLLM's max_num_seqs here is {est.scheduler.max_num_seqs}; "
            f"{', '.join(r.dtype for r in capped)} could hold more sequences than it schedules (raise --max-num-seqs)."
        )
    for note in notes:
        console.print(note)
