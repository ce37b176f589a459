"""`kvbench report RUN.json`: the tables of a run record (capacity three ways, latency, throughput)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field

from kvbench.analysis.verdict import decide
from kvbench.cli.clisettings import command_from
from kvbench.cli.commands.report_atlas import render_atlas, render_scales
from kvbench.cli.commands.report_fidelity import render_fidelity
from kvbench.cli.commands.report_sections import (
    render_client,
    render_comparisons,
    render_emulated,
    render_header,
    render_non_kv,
    render_overheads,
    render_prefix_cache,
    render_problems,
    render_workload_capacity,
)
from kvbench.cli.commands.report_tables import add_rows, capacity_table, latency_table, render_agreement
from kvbench.cli.commands.report_verdict import render_fronts, render_quality, render_verdict_table
from kvbench.core.flags import Arg, Flag
from kvbench.core.output import console, print_json, terminal_safe
from kvbench.records import RunRecord, headline, load_record
from kvbench.specs.options import AsJson

NAME = "report"
HELP = "Print the tables of a run record: capacity (engine / SLO-measured / model), TTFT, TPOT, throughput."


def render(doc: dict, path: Path | None = None, explain: bool = False) -> None:
    # A record quotes servers and logs: their text is printed, never interpreted. The verdict is derived from the
    # text as measured (control characters removed) and escaped where it is printed; the rest prints `doc`.
    record = RunRecord.model_validate(terminal_safe(doc, markup=False))
    doc = terminal_safe(doc)
    render_header(doc, path)
    decision = decide(record)
    render_verdict_table(record, decision, explain)
    render_atlas(record, decision)
    cap, lat = capacity_table(doc), latency_table()
    for d in doc.get("dtypes", []):
        add_rows(cap, lat, d)
    console.print(cap)
    render_overheads(doc)
    console.print(
        "engine: vLLM's startup report (log or /metrics); measured: highest concurrency meeting the SLO "
        "('+': the search cap was reached); model: kvbench's page-accurate prediction for the engine's KV budget."
    )
    render_groups(doc)
    console.print(lat)
    render_emulated(doc)
    if any(d.get("fixed_stats") for d in doc.get("dtypes", [])):
        console.print("xN: the fixed load ran N times with fresh prompts; mean ±half-width of its 95% t interval.")
    render_workload_capacity(doc)
    render_prefix_cache(doc)
    render_non_kv(doc)
    render_comparisons(doc)
    render_fronts(doc, record)
    if explain:  # the long statement: the accuracy table per task and condition, one line per dtype
        render_quality(doc, decision)
    render_fidelity(doc)
    render_scales(doc)
    render_agreement(doc)
    render_client(doc)
    render_problems(doc, decision)


class ReportSettings(BaseModel):
    """What one `kvbench report` is asked to do; the fields are the command's argument and options."""

    model_config = ConfigDict(extra="forbid")

    record: Annotated[Path, Arg()] = Field(description="A run record JSON written by `kvbench run`.")
    as_json: AsJson = Field(description="Print the per-dtype headline numbers as JSON.")
    explain: Annotated[bool, Flag("--explain")] = Field(
        False, description="Add the full verdict statement: every test per task and condition."
    )


@command_from(ReportSettings, lambda ctx, values: ReportSettings(**values))
def command(ctx: typer.Context, s: ReportSettings) -> None:
    doc = load_record(s.record)
    if s.as_json:
        print_json(
            {
                "run_id": doc["run_id"],
                "status": doc["status"],
                "dtypes": {d["kv_cache_dtype"]: headline(d) for d in doc["dtypes"]},
                "findings": doc.get("findings", []),
                "quality": decide(RunRecord.model_validate(doc)).as_dict(),
            }
        )
        return
    render(doc, s.record, s.explain)


def render_groups(doc: dict) -> None:
    """The capacity model's KV-cache groups (kvbench/core/kvgroups.py), where a model has more than one kind of layer
    (a sliding window beside full attention): what each group holds per request, the same for every dtype."""
    for d in doc.get("dtypes", []):
        groups = ((d.get("capacity") or {}).get("model") or {}).get("groups") or []
        if len(groups) > 1:
            parts = [
                f"{g['layers']} {g['kind']}"
                + (f" ({g['window']}-token window)" if g.get("window") else "")
                + f" layers in {g['groups']} group(s), {g['blocks_per_request']} blocks of {g['tokens_per_block']} "
                "tokens per request each"
                for g in groups
            ]
            console.print("KV-cache groups of the capacity model (one pool of blocks): " + "; ".join(parts))
            return
