"""`kvbench capacity`'s table: one row per KV dtype, the naive formula beside vLLM's pages, and the header lines
(the model, vLLM's memory terms per GPU, the pool)."""

from __future__ import annotations

from rich.table import Table

from kvbench.core.output import console, num
from kvbench.core.units import GB, GiB, fmt_gib, fmt_kib
from kvbench.specs import dsv4_kv
from kvbench.specs.capacity import Budget
from kvbench.specs.gpus import GpuSpec
from kvbench.specs.models import ModelSpec, describe_layers
from kvbench.specs.vllm_memory import NonKvEstimate


def print_header(spec: ModelSpec, where: str, context: int, version: str) -> None:
    console.print(f"[bold]{spec.name}[/] on {where} at {context:,} tokens per sequence, vLLM {version}")
    console.print(
        f"model: {spec.num_layers} layers ({describe_layers(spec)}), {spec.num_kv_heads} KV heads x head_dim "
        f"{spec.head_dim}, {spec.param_count / 1e9:.2f} B parameters"
    )


def print_gpu_table(spec: ModelSpec, card: GpuSpec, context: int, est: NonKvEstimate, budget: Budget, rows, block_size):
    tp, pp = est.tensor_parallel_size, est.pipeline_parallel_size
    group = f" x {tp * pp} GPUs (TP {tp}, PP {pp})" if tp * pp > 1 else ""
    print_header(spec, f"[bold]{card.name}[/]{group}", context, est.release.version)
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
    print_rows(spec, rows, block_size, est.scheduler.max_num_seqs)


def print_rows(spec: ModelSpec, rows, block_size: int, max_num_seqs: int | None) -> None:
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
        # DeepSeek V4 stores auto as fp8_ds_mla (models/deepseek_v4/attention.py _resolve_dsv4_kv_cache_dtype)
        stored = "fp8_ds_mla" if dsv4_kv.is_dsv4(spec) else spec.activation_dtype
        name = f"{row.dtype} ({stored})" if row.dtype == "auto" else row.dtype
        if not row.supported:  # vLLM would refuse it here, or has no code for it: one line with why, no numbers
            notes.append(f"{row.dtype}: not sized: {row.reason}")
            continue
        if row.vllm_dtype is None:
            name += " †"
            notes.append(f"† {row.dtype}: not a vLLM cache dtype (kvbench's comparison format; vLLM cannot serve it)")
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
    if any(k.kind == "mamba" for k in spec.layers):
        console.print(
            "vs auto: vLLM's concurrency ratio at this context; the recurrent state does not shrink with the KV dtype "
            "and sets the page, so the ratio falls toward 1.00x at contexts one attention block holds."
        )
    capped = [r for r in rows if max_num_seqs and r.users > max_num_seqs]
    if capped:
        console.print(
            f"note: vLLM's max_num_seqs here is {max_num_seqs}; "
            f"{', '.join(r.dtype for r in capped)} could hold more sequences than it schedules (raise --max-num-seqs)."
        )
    for note in notes:
        console.print(note)
    _print_menu_note(rows)


def _print_menu_note(rows) -> None:
    """With vLLM's whole menu (--kv-dtypes all), say which --kv-cache-dtype names share one row's pages."""
    from kvbench.specs.formats import get_format, menu

    if not {f.key for f in menu()} <= {r.dtype for r in rows}:
        return
    same = [get_format(r.dtype) for r in rows if len(get_format(r.dtype).vllm_dtypes) > 1]
    console.print(
        "vLLM's whole --kv-cache-dtype menu; one row each for names that store the same pages: "
        + "; ".join(" = ".join(f.vllm_dtypes) for f in same)
    )
