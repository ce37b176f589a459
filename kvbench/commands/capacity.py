"""`kvbench capacity`: KV bytes per token, tokens that fit, max concurrent sequences per dtype."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvbench import gpus, models
from kvbench.capacity import VLLM_DEFAULT_BLOCK_SIZE, Budget, budget_from_bytes, capacity_for_ranks
from kvbench.errors import UsageError
from kvbench.formats import parse_format_list
from kvbench.gpus import GpuSpec, get_gpu
from kvbench.models import ModelSpec, describe_layers, load_model
from kvbench.output import console, num, print_json
from kvbench.units import GB, GiB, fmt_gib, fmt_kib
from kvbench.vllm_memory import NonKvEstimate, known_versions, predict_non_kv
from kvbench.weights import WEIGHT_CHOICES

NAME = "capacity"
HELP = "KV bytes per token, tokens that fit and max concurrent sequences per KV dtype: naive formula vs vLLM's pages."

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help=f"Short name ({', '.join(models.catalog())}) or a path to a config.json.")
]
GpuOpt = Annotated[str, typer.Option("--gpu", "-g", help=f"GPU: {', '.join(gpus.catalog())}.")]
ContextOpt = Annotated[
    int, typer.Option("--context", "-c", help="Tokens per sequence (prompt + output; vLLM's max_model_len).")
]
DtypesOpt = Annotated[
    str,
    typer.Option(
        "--kv-dtype", help="Comma-separated KV-cache dtypes: auto (model dtype), fp8, fp8_e5m2, nvfp4, mxfp4."
    ),
]
BudgetOpt = Annotated[
    float | None,
    typer.Option("--kv-budget-gb", help="KV-cache pool per GPU in GB (10^9 bytes), instead of deriving it."),
]
UtilOpt = Annotated[
    float | None,
    typer.Option(
        "--gpu-memory-utilization", help="vLLM's fraction of device memory (default: that vLLM release's default)."
    ),
]
OverheadOpt = Annotated[
    float | None,
    typer.Option(
        "--overhead-gb",
        help="GB per GPU for activations, non-torch memory and CUDA graphs, replacing kvbench's model of them.",
    ),
]
BasisOpt = Annotated[
    str,
    typer.Option("--memory-basis", help="'device': the total torch reports (vLLM's basis); 'spec': the spec-sheet GB."),
]
TpOpt = Annotated[
    int, typer.Option("--tensor-parallel-size", help="GPUs per model replica, tensor parallel (vLLM's -tp).")
]
PpOpt = Annotated[int, typer.Option("--pipeline-parallel-size", help="Pipeline stages per replica (vLLM's -pp).")]
WeightsOpt = Annotated[
    str,
    typer.Option(
        "--weights",
        help="Weight format: auto (config's dtype or quantization_config), bf16, fp16, fp32, fp8, int8, int4.",
    ),
]
VersionOpt = Annotated[
    str | None,
    typer.Option(
        "--vllm-version",
        help=(
            "vLLM release whose accounting to model (default: the installed vLLM, "
            f"else the newest known: {', '.join(known_versions())})."
        ),
    ),
]
SeqsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-num-seqs", help="vLLM's cap on running sequences (default: vLLM's default for the GPU and release)."
    ),
]
BatchedOpt = Annotated[
    int | None,
    typer.Option(
        "--max-num-batched-tokens", help="vLLM's tokens per step; sizes the profiling run (default: vLLM's default)."
    ),
]


def check_number(
    flag: str,
    value: float | None,
    low: float = 0.0,
    high: float = math.inf,
    *,
    low_open: bool = True,
    high_open: bool = False,
) -> None:
    """One-line error unless `value` is a finite number in range (None means: not given); kvbench.cliargs's rule."""
    from kvbench import cliargs

    if high_open and value is not None and value >= high:
        raise UsageError(f"{flag} must be a finite number < {high:g}, got {value:g}")
    cliargs.number(value, flag, low=low, low_open=low_open, high=None if math.isinf(high) else high)


def check_parallel_flags(
    tp: int,
    pp: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    weights: str,
    utilization: float | None,
    overhead_gb: float | None,
) -> None:
    for flag, value in (
        ("--tensor-parallel-size", tp),
        ("--pipeline-parallel-size", pp),
        ("--max-num-seqs", max_num_seqs),
        ("--max-num-batched-tokens", max_num_batched_tokens),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    if weights not in WEIGHT_CHOICES:
        raise UsageError(f"unknown --weights {weights!r}; choose from: {', '.join(WEIGHT_CHOICES)}")
    check_number("--gpu-memory-utilization", utilization, 0.0, 1.0)
    check_number("--overhead-gb", overhead_gb, 0.0, low_open=False)


def command(
    model: ModelOpt = None,
    gpu: GpuOpt = None,
    context: ContextOpt = None,
    kv_dtype: DtypesOpt = "auto,fp8,nvfp4",
    kv_budget_gb: BudgetOpt = None,
    gpu_memory_utilization: UtilOpt = None,
    overhead_gb: OverheadOpt = None,
    memory_basis: BasisOpt = "device",
    tensor_parallel_size: TpOpt = 1,
    pipeline_parallel_size: PpOpt = 1,
    weights: WeightsOpt = "auto",
    vllm_version: VersionOpt = None,
    max_num_seqs: SeqsOpt = None,
    max_num_batched_tokens: BatchedOpt = None,
    block_size: Annotated[
        int, typer.Option("--block-size", help="vLLM KV block size in tokens (16 on CUDA).")
    ] = VLLM_DEFAULT_BLOCK_SIZE,
    from_log: Annotated[
        Path | None,
        typer.Option(
            "--from-log",
            help="A vLLM start-up log: take its settings and compare its figures with kvbench's, term by term.",
        ),
    ] = None,
    start: Annotated[
        int | None,
        typer.Option(
            "--start",
            help="With --from-log: which start-up of a log that holds several to read (1 = the first; "
            "default: the last complete one).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    if start is not None and from_log is None:
        raise UsageError("--start picks a start-up of a --from-log log; give --from-log FILE")
    if from_log is not None:
        from kvbench.commands.fromlog import compare_log

        compare_log(
            from_log,
            model,
            gpu,
            context,
            kv_dtype,
            gpu_memory_utilization,
            tensor_parallel_size,
            pipeline_parallel_size,
            weights,
            vllm_version,
            max_num_seqs,
            max_num_batched_tokens,
            block_size,
            as_json,
            start,
        )
        return
    _check_flags(model, gpu, context, block_size, memory_basis, kv_budget_gb, gpu_memory_utilization)
    check_parallel_flags(
        tensor_parallel_size,
        pipeline_parallel_size,
        max_num_seqs,
        max_num_batched_tokens,
        weights,
        gpu_memory_utilization,
        overhead_gb,
    )
    spec = load_model(model)
    card = get_gpu(gpu)
    formats = parse_format_list(kv_dtype)
    est = predict_non_kv(
        spec,
        card,
        utilization=gpu_memory_utilization,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        weights=weights,
        vllm_version=vllm_version,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=context,
    )
    pool, overhead = _overrides(est, card, kv_budget_gb, overhead_gb, memory_basis)
    rows = capacity_for_ranks(spec, formats, context, est, card, block_size, pool, overhead)
    budget = _budget(est, pool, overhead)
    if budget.kv_bytes <= 0:
        raise UsageError(
            f"no memory left for the KV cache: {budget.derivation}; "
            "use more GPUs (--tensor-parallel-size, kvbench plan), smaller --weights or --kv-budget-gb"
        )
    if as_json:
        print_json(_as_json(spec, card, context, est, budget, rows))
        return
    _print_table(spec, card, context, est, budget, rows, block_size)


def _check_flags(model, gpu, context, block_size, memory_basis, kv_budget_gb, gpu_memory_utilization) -> None:
    missing = [flag for flag, v in (("--model", model), ("--gpu", gpu), ("--context", context)) if v is None]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (or give --from-log FILE)")
    if context <= 0:
        raise UsageError(f"--context must be a positive number of tokens, got {context}")
    if block_size <= 0:
        raise UsageError(f"--block-size must be positive, got {block_size}")
    if memory_basis not in ("device", "spec"):
        raise UsageError(f"unknown memory basis {memory_basis!r}; choose from: device, spec")
    if kv_budget_gb is not None and gpu_memory_utilization is not None:
        raise UsageError("give either --kv-budget-gb or --gpu-memory-utilization, not both")
    check_number("--kv-budget-gb", kv_budget_gb)


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
    capped = [r for r in rows if r.users > est.scheduler.max_num_seqs]
    if capped:
        console.print(
            f"note: vLLM's max_num_seqs here is {est.scheduler.max_num_seqs}; "
            f"{', '.join(r.dtype for r in capped)} could hold more sequences than it schedules (raise --max-num-seqs)."
        )
    for note in notes:
        console.print(note)
