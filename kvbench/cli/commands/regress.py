"""`kvbench regress`: the direction-aware regression gate over the asv history (kvbench.analysis.regress)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field, field_validator
from rich.table import Table

from kvbench.analysis.regress import DEFAULT_WINDOW, K_SPREAD, MIN_SPREAD_POINTS
from kvbench.cli.clisettings import command_from
from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag
from kvbench.core.output import console, fmt_pct, fmt_value, print_json, vllm_label
from kvbench.specs.options import AsJson, AsvConfig, Machine, Results, Threshold

NAME = "regress"
HELP = (
    "Newest history point vs a robust baseline (median of the last N points, "
    "MAD-aware), per metric and KV dtype; exit 1 on a regression."
)


def _allowed(pct: float) -> str:
    if math.isnan(pct):
        return "—"
    return "±inf" if math.isinf(pct) else f"±{pct:.1f}%"


STYLE = {
    "regression": "bold red",
    "not measured": "yellow",
    "improvement": "green",
    "unchanged": "",
    "no baseline": "dim",
    "no data": "dim",
}


class RegressSettings(BaseModel):
    """What one `kvbench regress` is asked to do; the fields are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    machine: Machine = Field(description="Only this machine (default: every machine in the results).")
    window: Annotated[int, Flag("--window")] = Field(
        DEFAULT_WINDOW, description="Points before the newest that form the baseline."
    )
    threshold: Threshold = Field(
        description=(
            "Smallest change in % that counts, for every metric (default: each metric's noise_pct "
            "for the machine's kind, metrics.toml); widened by 3x the baseline's robust spread."
        ),
    )
    results: Results = Field(description="asv results folder.")
    config: AsvConfig = Field(description="asv config (for benchmarks.json).")
    show_all: Annotated[bool, Flag("--all")] = Field(False, description="List every series, not only those that moved.")
    as_json: AsJson = Field(description="Print every series' verdict as JSON.")

    @field_validator("window")
    @classmethod
    def _window(cls, value: int) -> int:  # a field check, so it is named before --threshold as it always was
        if value < 1:
            raise UsageError(f"--window must be at least 1, got {value}")
        return value


@command_from(RegressSettings, lambda ctx, values: RegressSettings(**values))
def command(ctx: typer.Context, s: RegressSettings) -> int:
    from kvbench.analysis.regress import find_regressions

    frame = _history(s.results, s.config, s.machine)
    found = find_regressions(frame, window=s.window, threshold_pct=s.threshold)
    bad = [r for r in found if r.verdict == "regression"]
    if s.as_json:
        print_json(
            {
                "window": s.window,
                "threshold_pct": s.threshold,
                "k_spread": K_SPREAD,
                "regressions": len(bad),
                "series": [r.as_dict() for r in found],
            }
        )
        return 1 if bad else 0

    _print_baselines(frame, s.window, s.threshold)
    shown = found if s.show_all else [r for r in found if r.verdict in ("regression", "improvement", "not measured")]
    if shown:
        _print_table(shown, s.show_all)
    counts = {v: sum(r.verdict == v for r in found) for v in STYLE}
    console.print(", ".join(f"{n} {v}" for v, n in counts.items() if n) or "no series")
    if bad:
        console.print(f"[bold red]REGRESSION[/]: {len(bad)} series got worse beyond noise")
        return 1
    return 0


def _history(results: Path, config: Path, machine: str | None):
    """The asv history frame (only `machine`'s points when given); refused when a point is damaged."""
    if not config.is_file():
        raise UsageError(f"asv config not found: {config}; run from the kvbench checkout or pass --config")
    if not (results / "benchmarks.json").is_file():
        raise UsageError(f"no asv history under {results} (no benchmarks.json); run `kvbench history run` first")
    from kvbench.analysis.history import history_frame

    problems: list[str] = []
    frame = history_frame(results, config, problems)
    known = sorted(set(frame.machine))
    if machine is not None:
        if machine not in known:
            raise UsageError(f"no history for machine {machine!r}; choose from: {', '.join(known) or '(none yet)'}")
        frame = frame[frame.machine == machine]
    judged = [p for p in problems if machine is None or f"/{machine}/" in p.replace("\\", "/")]
    if judged:
        # A point left out would make the one before it "newest" and move every baseline: refuse instead.
        more = f" (and {len(judged) - 1} more)" if len(judged) > 1 else ""
        raise UsageError(
            f"{judged[0]}{more}; the gate does not judge a history with a damaged point: "
            "restore the file (git checkout -- PATH) or remove it"
        )
    return frame


def _print_baselines(frame, window: int, threshold: float | None) -> None:
    """Per machine, the newest point and its baseline; then what counts as a change."""
    for m in sorted(set(frame.machine)):
        pts = frame[frame.machine == m].drop_duplicates(["commit", "env_name"])
        newest = pts.iloc[-1]
        console.print(
            f"[bold]{m}[/]: newest point {newest.commit[:8]} "
            f"({vllm_label(newest.vllm_package, newest.vllm_version)}, run {newest.run_id}) "
            f"against the median of up to {window} earlier points ({len(pts) - 1} available)"
        )
    floor = (
        f"{threshold:g}%"
        if threshold is not None
        else "the metric's noise floor (metrics.toml noise_pct/noise_abs; column 'floor')"
    )
    console.print(
        f"counts as a change: more than max({floor}, {K_SPREAD:g} x the baseline's robust spread "
        f"(1.4826 x MAD, from {MIN_SPREAD_POINTS}+ points))"
    )


def _print_table(shown: list, show_all: bool) -> None:
    table = Table(title="what moved" if not show_all else "every series", title_justify="left")
    for col in (
        "machine",
        "metric",
        "KV dtype",
        "better",
        "baseline",
        "newest",
        "change",
        "floor",
        "allowed",
        "points",
        "verdict",
    ):
        table.add_column(
            col,
            justify="right" if col in ("baseline", "newest", "change", "floor", "allowed", "points") else "left",
        )
    for r in shown:
        table.add_row(
            r.machine,
            r.label or r.metric,
            r.kv_dtype,
            r.direction,
            fmt_value(r.baseline, r.unit),
            fmt_value(r.newest, r.unit),
            fmt_pct(r.change_pct),
            f"{r.floor_pct:g}%",
            _allowed(r.allowed_pct),
            str(r.n_baseline),
            f"[{STYLE[r.verdict]}]{r.verdict}[/]" if STYLE[r.verdict] else r.verdict,
        )
    console.print(table)
