"""`kvbench claims`: every claim in a release/article file, re-derived, with a verdict and reason."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.markup import escape
from rich.table import Table

from kvbench.analysis.claims import evaluate, load_claims, measured_values
from kvbench.cli.clisettings import command_from
from kvbench.core.flags import Flag
from kvbench.core.output import console, err_console, print_json
from kvbench.specs.options import AsJson, Results

NAME = "claims"
HELP = "Re-derive each claim of an article (default: the NVFP4 KV-cache article) and give claimed / derived / verdict."

STYLE = {"holds": "green", "off": "yellow", "fails": "red", "not decided": "yellow", "not checkable": "dim"}


def _fmt(value, unit: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    text = f"{value:,.0f}" if unit in ("users", "GPUs") else f"{value:,.4g}"
    return f"{text} {unit}".strip()


def _runs(results: Path):
    """The run records' summary frame, or None when there are none (measured stays empty)."""
    from kvbench.records import find_records, summary_frame

    if not results.is_dir():
        return None
    paths = find_records(results)
    problems: list[str] = []
    frame = summary_frame(paths, problems) if paths else None
    for problem in problems:  # one damaged record costs its own numbers, not the claims report
        err_console.print(f"[yellow]warning[/]: {escape(problem)}", soft_wrap=True)  # one line, unwrapped
    return frame if frame is not None and not frame.empty else None


class ClaimsSettings(BaseModel):
    """What one `kvbench claims` is asked to do; the fields are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    file: Annotated[Path | None, Flag("--file", "-f")] = Field(
        None, description="Claims TOML file (default: the shipped NVFP4 KV-cache article claims)."
    )
    as_json: AsJson = Field(description="Print JSON instead of a table.")
    strict: Annotated[bool, Flag("--strict")] = Field(False, description="Exit 1 when any claim fails.")
    results: Results = Field(
        description="Run records to take measured values from (a run of the claim's model, context and budget)."
    )


@command_from(ClaimsSettings, lambda ctx, values: ClaimsSettings(**values))
def command(ctx: typer.Context, s: ClaimsSettings) -> int:
    doc = load_claims(s.file)
    notes: dict[str, str] = {}
    judged: dict[str, dict] = {}  # accuracy claims: what the run's verdict says
    verdicts = evaluate(doc, measured_values(doc, _runs(s.results), notes, judged), notes, judged)
    failed = [v for v in verdicts if v.verdict == "fails"]
    if s.as_json:
        print_json({"title": doc.get("title"), "source": doc["source"].as_dict(), "claims": verdicts})
    else:
        console.print(
            f"[bold]{escape(str(doc.get('title', 'claims')))}[/]  (source: {escape(doc['source'].describe())})"
        )
        table = Table(show_lines=True)
        for col in ("claim", "claimed", "derived", "measured", "verdict", "how kvbench derived it"):
            table.add_column(col, overflow="fold")
        for v in verdicts:
            measured = (
                _fmt(v.measured, v.unit) if v.measured is not None else ("not measured yet" if v.measure else "—")
            )
            table.add_row(
                f"{escape(v.text)}\n[dim]{v.id}; {escape(v.where)}"
                + (f"; source: {escape(v.source)}" if v.source else "")
                + "[/]",
                _fmt(v.claimed, v.unit),
                _fmt(v.derived, v.unit),
                measured,
                f"[{STYLE.get(v.verdict, '')}]{v.label}[/]",
                v.derivation,
            )
        console.print(table)
        counts = {k: sum(v.verdict == k for v in verdicts) for k in STYLE}
        console.print(", ".join(f"{n} {k}" for k, n in counts.items() if n))
    return 1 if s.strict and failed else 0
