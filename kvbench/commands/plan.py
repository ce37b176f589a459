"""`kvbench plan`: GPUs needed (and cost per hour) for N concurrent users per GPU type and KV dtype."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvbench.commands.capacity import (
    BasisOpt,
    BatchedOpt,
    BudgetOpt,
    DtypesOpt,
    OverheadOpt,
    PpOpt,
    UtilOpt,
    VersionOpt,
    WeightsOpt,
    check_number,
    check_parallel_flags,
)
from kvbench.errors import UsageError
from kvbench.formats import parse_format_list
from kvbench.gpus import catalog as gpu_catalog
from kvbench.gpus import parse_gpu_list
from kvbench.models import load_model
from kvbench.output import console, print_json
from kvbench.plan import TP_SIZES, plan_row
from kvbench.vllm_memory import release

NAME = "plan"
HELP = "GPUs needed and cost per hour to serve N concurrent users at a context length, per GPU type and KV dtype."


def parse_prices(text: str | None, known: set[str]) -> dict[str, float]:
    """'h100-sxm=2.65,h200=3.5' -> {gpu: USD per GPU-hour}, each GPU among `known`."""
    from kvbench import cliargs

    return cliargs.key_numbers(
        text or "", "--price-per-hour", sorted(known), unit="USD per GPU-hour", example="h100-sxm=2.65"
    )


def command(
    users: Annotated[int, typer.Option("--users", "-u", help="Concurrent sequences to serve.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Short name or a config.json path (not with --from-run).")
    ] = None,
    context: Annotated[
        int | None, typer.Option("--context", "-c", help="Tokens per sequence (not with --from-run).")
    ] = None,
    from_run: Annotated[
        Path | None,
        typer.Option(
            "--from-run",
            help="Size from a run record's measured throughput/interactivity front instead of the capacity model.",
        ),
    ] = None,
    user_tps: Annotated[
        float | None,
        typer.Option(
            "--user-tps",
            help=(
                "With --from-run: the interactivity each user gets, "
                "tokens/s (default: the best point under the run's SLO)."
            ),
        ),
    ] = None,
    gpus: Annotated[
        str, typer.Option("--gpus", help="Comma-separated GPU keys to compare.")
    ] = "a100-80gb,h100-sxm,h200",
    kv_dtype: DtypesOpt = "auto,fp8,nvfp4",
    price_per_hour: Annotated[
        str | None, typer.Option("--price-per-hour", help="USD per GPU-hour, e.g. h100-sxm=2.65,h200=3.5.")
    ] = None,
    kv_budget_gb: BudgetOpt = None,
    gpu_memory_utilization: UtilOpt = None,
    overhead_gb: OverheadOpt = None,
    memory_basis: BasisOpt = "device",
    max_num_seqs: Annotated[
        int | None,
        typer.Option("--max-num-seqs", help="vLLM's cap on running sequences (default: vLLM's default for each GPU)."),
    ] = None,
    tensor_parallel_size: Annotated[
        int | None,
        typer.Option("--tensor-parallel-size", help=f"Fix the TP size (default: try {', '.join(map(str, TP_SIZES))})."),
    ] = None,
    pipeline_parallel_size: PpOpt = 1,
    weights: WeightsOpt = "auto",
    vllm_version: VersionOpt = None,
    max_num_batched_tokens: BatchedOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    if from_run is not None:
        return _from_run(from_run, users, user_tps, price_per_hour, as_json)
    _check_sizing(model, context, users, kv_budget_gb, gpu_memory_utilization, memory_basis)
    check_parallel_flags(
        1 if tensor_parallel_size is None else tensor_parallel_size,
        pipeline_parallel_size,
        max_num_seqs,
        max_num_batched_tokens,
        weights,
        gpu_memory_utilization,
        overhead_gb,
    )
    util = (
        release(vllm_version).default_gpu_memory_utilization
        if gpu_memory_utilization is None
        else gpu_memory_utilization
    )
    tp_sizes = TP_SIZES if tensor_parallel_size is None else (tensor_parallel_size,)
    spec = load_model(model)
    cards = parse_gpu_list(gpus)
    formats = parse_format_list(kv_dtype)
    prices = parse_prices(price_per_hour, {c.key for c in cards})
    rows = [
        plan_row(
            spec,
            fmt,
            card,
            users,
            context,
            util,
            kv_budget_gb,
            overhead_gb,
            max_num_seqs,
            prices.get(card.key),
            tensor_parallel_sizes=tp_sizes,
            pipeline_parallel_size=pipeline_parallel_size,
            weights=weights,
            vllm_version=vllm_version,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        for card in cards
        for fmt in formats
    ]
    if as_json:
        print_json({"model": spec.name, "users": users, "context": context, "utilization": util, "rows": rows})
        return
    _print_rows(spec.name, users, context, util, rows, bool(prices))


def _check_sizing(model, context, users, kv_budget_gb, gpu_memory_utilization, memory_basis) -> None:
    if model is None or context is None:
        raise UsageError("give --model and --context (or --from-run RUN.json to size from a measured front)")
    if users <= 0 or context <= 0:
        raise UsageError(f"--users and --context must be positive, got {users} and {context}")
    if kv_budget_gb is not None and gpu_memory_utilization is not None:
        raise UsageError("give either --kv-budget-gb or --gpu-memory-utilization, not both")
    if memory_basis != "device":
        raise UsageError(
            "kvbench plan sizes with the device-reported memory; --memory-basis spec is for `kvbench capacity`"
        )
    check_number("--kv-budget-gb", kv_budget_gb)


def _print_rows(model_name: str, users: int, context: int, util: float, rows: list, priced: bool) -> None:
    """The plan as a table: per GPU and dtype, the cheapest layout that serves `users`."""
    console.print(
        f"[bold]{users:,} concurrent {context:,}-token sequences of {model_name}[/] (vLLM, utilization {util:.2f})"
    )
    table = Table()
    for col in ("GPU", "KV dtype", "TP", "users / replica", "limited by", "replicas", "GPUs", "USD / hour"):
        table.add_column(col, justify="left" if col in ("GPU", "KV dtype", "limited by") else "right")
    for r in rows:
        if not r.supported:
            table.add_row(r.gpu, r.dtype, "—", "—", f"unsupported: {r.reason}", "—", "—", "—")
            continue
        cost = f"{r.usd_per_hour:,.2f}" if r.usd_per_hour is not None else "—"
        table.add_row(
            r.gpu,
            r.dtype,
            str(r.tensor_parallel),
            f"{r.users_per_replica:,}",
            r.limited_by,
            str(r.replicas),
            str(r.gpus),
            cost,
        )
    console.print(table)
    if not priced:
        console.print("cost: pass --price-per-hour GPU=USD,... to see USD per hour (kvbench ships no prices).")
    console.print(
        "non-KV memory per GPU as `kvbench capacity` derives it (weights, "
        "profiled activations, non-torch, CUDA graphs)."
    )


def _from_run(path: Path, users: int, user_tps: float | None, price_text: str | None, as_json: bool) -> None:
    """Replicas per dtype from a run's measured front: users per replica = the concurrency the front serves at
    the asked interactivity (PCHIP along the front) or at its best point under the SLO."""
    from kvbench import cliargs
    from kvbench.harness.records import read_record
    from kvbench.plan import plan_from_front

    cliargs.at_least_one(users, "--users")
    cliargs.positive(user_tps, "--user-tps", "tokens/s per user")
    record = read_record(path)
    keys = sorted(
        {d.front.price_key for d in record.dtypes if d.front and d.front.price_key} | {"cpu"} | set(gpu_catalog())
    )
    prices = cliargs.key_numbers(price_text, "--price-per-hour", keys, unit="USD per hour") if price_text else {}
    rows = plan_from_front(record, users, user_tps, prices)
    if as_json:
        print_json({"record": str(path), "users": users, "user_tps": user_tps, "rows": rows})
        return
    console.print(
        f"[bold]{users:,} concurrent users from the measured front of run {record.run_id}[/] ({record.machine}, "
        f"model {record.config.get('model_name')})"
    )
    table = Table()
    for col in (
        "KV dtype",
        "tok/s per user",
        "users / replica",
        "output tok/s per GPU",
        "GPUs / replica",
        "replicas",
        "GPUs",
        "USD / hour",
        "read at",
    ):
        table.add_column(col, justify="left" if col in ("KV dtype", "read at") else "right")
    for r in rows:
        if r["users_per_replica"] is None:
            table.add_row(r["kv_cache_dtype"], "—", "—", "—", "—", "—", "—", "—", r["why"])
            continue
        cost = f"{r['usd_per_hour']:,.2f}" if r["usd_per_hour"] is not None else "—"
        table.add_row(
            r["kv_cache_dtype"],
            f"{r['user_tps']:.1f}",
            str(r["users_per_replica"]),
            f"{r['output_tps_per_gpu']:,.0f}",
            str(r["gpus_per_replica"]),
            str(r["replicas"]),
            str(r["gpus"]),
            cost,
            r["why"],
        )
    console.print(table)
    console.print("measured on the run's machine, model and request shape; another workload has another front.")
