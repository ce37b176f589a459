"""`kvbench capacity`: KV bytes per token, tokens that fit, max concurrent sequences per dtype."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from kvbench.capacity import (
    VLLM_DEFAULT_BLOCK_SIZE,
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    Budget,
    budget_from_bytes,
    budget_from_gpu,
    capacity_table,
)
from kvbench import gpus, models
from kvbench.errors import UsageError
from kvbench.formats import parse_format_list
from kvbench.gpus import GpuSpec, get_gpu, server_defaults
from kvbench.models import ModelSpec, describe_layers, load_model
from kvbench.output import console, num, print_json
from kvbench.units import GB, fmt_kib

NAME = "capacity"
HELP = "KV bytes per token, tokens that fit and max concurrent sequences per KV dtype: naive formula vs vLLM's pages."

ModelOpt = Annotated[str, typer.Option("--model", "-m", help=f"Short name ({', '.join(models.catalog())}) or a path to a config.json.")]
GpuOpt = Annotated[str, typer.Option("--gpu", "-g", help=f"GPU: {', '.join(gpus.catalog())}.")]
ContextOpt = Annotated[int, typer.Option("--context", "-c", help="Tokens per sequence (prompt + output; vLLM's max_model_len).")]
DtypesOpt = Annotated[str, typer.Option("--kv-dtype", help="Comma-separated KV-cache dtypes: auto (model dtype), fp8, fp8_e5m2, nvfp4, mxfp4.")]
BudgetOpt = Annotated[float | None, typer.Option("--kv-budget-gb", help="KV-cache budget in GB (10^9 bytes), instead of deriving it.")]
UtilOpt = Annotated[float | None, typer.Option("--gpu-memory-utilization", help=f"vLLM's fraction of device memory (default {VLLM_DEFAULT_GPU_MEMORY_UTILIZATION}).")]
OverheadOpt = Annotated[float, typer.Option("--overhead-gb", help="GB per GPU for activations and CUDA graphs, which vLLM profiles at start (default 0: not modelled).")]
BasisOpt = Annotated[str, typer.Option("--memory-basis", help="'device': memory the driver reports (vLLM's basis); 'spec': the spec-sheet GB.")]


def resolve_budget(
    model: ModelSpec, gpu: GpuSpec, kv_budget_gb: float | None, utilization: float | None, overhead_gb: float, memory_basis: str
) -> Budget:
    """The one rule every command uses: an explicit budget, or vLLM's formula on the GPU."""
    if kv_budget_gb is not None and utilization is not None:
        raise UsageError("give either --kv-budget-gb or --gpu-memory-utilization, not both")
    if memory_basis not in ("device", "spec"):
        raise UsageError(f"unknown memory basis {memory_basis!r}; choose from: device, spec")
    if kv_budget_gb is not None:
        if kv_budget_gb <= 0:
            raise UsageError(f"--kv-budget-gb must be positive, got {kv_budget_gb}")
        return budget_from_bytes(kv_budget_gb * GB, "--kv-budget-gb")
    util = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization
    if not 0 < util <= 1:
        raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    return budget_from_gpu(gpu, model, util, overhead_gb * GB, memory_basis)


def command(
    model: ModelOpt,
    gpu: GpuOpt,
    context: ContextOpt,
    kv_dtype: DtypesOpt = "auto,fp8,nvfp4",
    kv_budget_gb: BudgetOpt = None,
    gpu_memory_utilization: UtilOpt = None,
    overhead_gb: OverheadOpt = 0.0,
    memory_basis: BasisOpt = "device",
    block_size: Annotated[int, typer.Option("--block-size", help="vLLM KV block size in tokens (16 on CUDA).")] = VLLM_DEFAULT_BLOCK_SIZE,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    if context <= 0:
        raise UsageError(f"--context must be a positive number of tokens, got {context}")
    if block_size <= 0:
        raise UsageError(f"--block-size must be positive, got {block_size}")
    spec = load_model(model)
    card = get_gpu(gpu)
    formats = parse_format_list(kv_dtype)
    budget = resolve_budget(spec, card, kv_budget_gb, gpu_memory_utilization, overhead_gb, memory_basis)
    if budget.kv_bytes <= 0:
        raise UsageError(f"no memory left for the KV cache: {budget.derivation}; use more GPUs (kvbench plan) or --kv-budget-gb")
    rows = capacity_table(spec, formats, context, budget, card, block_size)
    if as_json:
        print_json({"model": spec.name, "gpu": card.key, "context": context, "budget": budget, "rows": rows})
        return

    defaults = server_defaults(card)
    console.print(f"[bold]{spec.name}[/] on [bold]{card.name}[/] at {context:,} tokens per sequence")
    console.print(
        f"model: {spec.num_layers} layers ({describe_layers(spec)}), {spec.num_kv_heads} KV heads x head_dim {spec.head_dim}, "
        f"{spec.param_count / 1e9:.2f} B parameters, weights {spec.weight_format} {spec.weight_bytes / GB:.2f} GB"
    )
    console.print(f"KV budget: {budget.derivation}")
    table = Table(title=f"KV-cache capacity (block size {block_size} tokens)", title_justify="left")
    for col in (
        "dtype",
        "B/elem",
        "KV per token",
        "per user (GB)",
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
            num(row.bytes_per_user / GB, 3),
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
    capped = [r for r in rows if r.users > defaults.max_num_seqs]
    if capped:
        console.print(
            f"note: vLLM's default max_num_seqs on this GPU is {defaults.max_num_seqs}; "
            f"{', '.join(r.dtype for r in capped)} could hold more sequences than it schedules (raise --max-num-seqs)."
        )
    for note in notes:
        console.print(note)
