"""`kvbench plan`: GPUs needed (and cost per hour) for N concurrent users per GPU type and KV dtype."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from kvbench.cli.clisettings import command_from
from kvbench.cli.commands.plan_settings import PlanSettings
from kvbench.core.errors import UsageError
from kvbench.core.output import console, print_json
from kvbench.specs.capacity import Sizing
from kvbench.specs.formats import parse_format_list
from kvbench.specs.gpus import catalog as gpu_catalog
from kvbench.specs.gpus import parse_gpu_list
from kvbench.specs.models import load_model
from kvbench.specs.plan import TP_SIZES, Layout, plan_row
from kvbench.specs.vllm_memory import release

NAME = "plan"
HELP = "GPUs needed and cost per hour to serve N concurrent users at a context length, per GPU type and KV dtype."


def parse_prices(text: str | None, known: set[str]) -> dict[str, float]:
    """'h100-sxm=2.65,h200=3.5' -> {gpu: USD per GPU-hour}, each GPU among `known`."""
    from kvbench.core import cliargs

    return cliargs.key_numbers(
        text or "", "--price-per-hour", sorted(known), unit="USD per GPU-hour", example="h100-sxm=2.65"
    )


def settings_of(ctx: typer.Context, values: dict) -> PlanSettings:
    return PlanSettings(**values)


@command_from(PlanSettings, settings_of)
def command(ctx: typer.Context, s: PlanSettings) -> None:
    if s.from_run is not None:
        return _from_run(s.from_run, s.users, s.user_tps, s.price_per_hour, s.as_json)
    util = (
        release(s.vllm_version).default_gpu_memory_utilization
        if s.gpu_memory_utilization is None
        else s.gpu_memory_utilization
    )
    layout = Layout(TP_SIZES if s.tensor_parallel_size is None else (s.tensor_parallel_size,), Sizing.of(s))
    spec = load_model(s.model)
    cards = parse_gpu_list(s.gpus)
    formats = parse_format_list(s.kv_dtype)
    prices = parse_prices(s.price_per_hour, {c.key for c in cards})
    rows = [
        plan_row(
            spec,
            fmt,
            card,
            s.users,
            s.context,
            util,
            s.kv_budget_gb,
            s.overhead_gb,
            s.max_num_seqs,
            prices.get(card.key),
            layout,
        )
        for card in cards
        for fmt in formats
    ]
    if s.as_json:
        print_json({"model": spec.name, "users": s.users, "context": s.context, "utilization": util, "rows": rows})
        return
    _print_rows(spec.name, s.users, s.context, util, rows, bool(prices))


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
    from kvbench.core import cliargs
    from kvbench.records import read_record
    from kvbench.specs.plan import plan_from_front

    record = read_record(path)
    keys = sorted(
        {d.front.price_key for d in record.dtypes if d.front and d.front.price_key} | {"cpu"} | set(gpu_catalog())
    )
    prices = cliargs.key_numbers(price_text, "--price-per-hour", keys, unit="USD per hour") if price_text else {}
    rows = plan_from_front(record, users, user_tps, prices)
    if as_json:
        print_json({"record": str(path), "users": users, "user_tps": user_tps, "rows": rows})
        return _sized_any(path, rows)
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
    _sized_any(path, rows)


def _sized_any(path: Path, rows: list[dict]) -> None:
    """K-P12: a plan that sized nothing is not a success (each dtype's reason is in the table)."""
    if not any(r["gpus"] is not None for r in rows):
        raise UsageError(
            f"plan --from-run {path}: no KV dtype of this run could be sized (why: the table's last column)"
        )
