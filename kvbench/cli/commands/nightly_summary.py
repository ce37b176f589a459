"""The nightly's closing summary, printed by `kvbench nightly run` and by the fleet's merge (nightly_fleet);
a module of its own so that neither of those imports the other for it."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from kvbench.core.output import console
from kvbench.orchestration.nightly.outcomes import EntryStatus, NightStatus, StepStatus

STATUS_STYLE = {  # step and entry statuses (kvbench.orchestration.nightly.orchestrate)
    StepStatus.OK: "green",
    StepStatus.FAILED: "bold red",
    EntryStatus.INTERRUPTED: "red",
    StepStatus.SKIPPED: "yellow",
    StepStatus.REGRESSION: "bold red",
    StepStatus.NOT_RUN: "yellow",
}


def _styled(status: str) -> str:
    style = STATUS_STYLE.get(status)
    return f"[{style}]{status}[/]" if style else status


def render_summary(doc: dict, path: Path) -> None:
    console.rule("[bold]nightly summary[/]", align="left")
    table = Table(show_edge=False)
    for col in ("entry", "status", "KV dtypes", "est. min", "min", "record"):
        table.add_column(col, justify="right" if col.endswith("min") else "left")

    def short(record: str | None) -> str:  # relative to the results folder: the machine and run id are what matter
        if not record:
            return "—"
        parts = Path(record).parts
        return str(Path(*parts[-3:])) if len(parts) >= 3 else record

    for e in doc["entries"]:
        dtypes = ", ".join(
            f"{d} {s}" + (" (expected)" if d in e["expected"] else "") for d, s in e["dtypes"].items()
        ) or (e["error"] or "")
        table.add_row(
            escape(e["name"]),
            _styled(e["status"]),
            escape(dtypes),
            f"{e['estimate_s'] / 60:.1f}",
            f"{e['seconds'] / 60:.1f}",
            short(e["record"]),
        )
    console.print(table)
    for s in doc["steps"].values():
        console.print(
            f"{s['name']}: {_styled(s['status'])} "
            + escape(f"({s['detail']}){'; log ' + s['log'] if s.get('log') else ''}")
        )
    console.print(
        f"{doc['minutes']:.1f} min of max_minutes {doc['budget_minutes']:g} "
        f"(estimate {doc['estimate_minutes']:.1f}); summary: {path}"
    )
    if doc["status"] == NightStatus.OK:
        console.print("[bold green]nightly OK[/]")
        return
    console.print(f"[bold red]nightly {doc['status'].upper()}[/], because:")
    for r in doc["reasons"]:
        console.print(f"  - {r}", markup=False, highlight=False)
