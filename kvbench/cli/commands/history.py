"""`kvbench history run`: add one asv history point (one `kvbench run` + the asv suite) for this machine
and the vLLM in a venv. `kvbench history show`: the history table. `kvbench history upgrade`: the history's
kvbench.run/1 records rewritten as kvbench.run/2. The keying scheme, the point's steps (run_point,
commit_point) and the upgrade are kvbench.orchestration.asvrun's; this module checks, waits and prints."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field, field_validator
from rich.markup import escape
from rich.table import Table

from kvbench.cli.clisettings import command_from
from kvbench.core import cliargs
from kvbench.core.errors import UsageError
from kvbench.core.flags import Arg, Flag
from kvbench.core.output import console, err_console, fmt_value, print_json, vllm_label
from kvbench.specs.options import AsJson, AsvConfig, Machine, Model

NAME = "history"
HELP = (
    "run: add one asv history point for this machine and the vLLM in --venv "
    "(one kvbench run + the asv suite); show: the history table; upgrade: rewrite kvbench.run/1 records "
    "(every request inside one JSON) as kvbench.run/2 (summary + Parquet samples), checked to read back the same."
)
ACTIONS = ("run", "show", "upgrade")


class HistorySettings(BaseModel):
    """What one `kvbench history` is asked to do; the fields are the command's argument and options."""

    model_config = ConfigDict(extra="forbid")

    action: Annotated[str, Arg()] = Field(
        description="run (add a history point), show (print the history) or upgrade (v1 records)."
    )
    venv: Annotated[Path | None, Flag("--venv")] = Field(
        None, description="Venv holding the vLLM to benchmark, with kvbench and asv installed (default: this one)."
    )
    machine: Machine = Field(description="asv machine / results folder name (default: named from the GPU or CPU).")
    config: AsvConfig = Field(description="asv config of the kvbench checkout.")
    model: Annotated[Model, Flag("--model")] = Field(  # no -m here: the flag set is as it was
        description="Model for the serving run (required with a GPU; CPU: the tiny local model)."
    )
    bench: Annotated[list[str] | None, Flag("--bench", "-b")] = Field(
        None, description="Only benchmarks matching this regex (repeatable; asv -b)."
    )
    wait_load: Annotated[float | None, Flag("--wait-load")] = Field(
        None,
        description=(
            "First wait (up to 30 min) until the 1-minute load average is at most this: "
            "other work distorts every latency."
        ),
    )
    commit: Annotated[bool, Flag("--commit")] = Field(
        False,
        description="Commit the new point's files (asv result, machine.json, run record, benchmarks.json) afterwards.",
    )
    dry_run: Annotated[bool, Flag("--dry-run")] = Field(False, description="Say what would run; change nothing.")
    as_json: AsJson = Field(description="show, upgrade: print the rows as JSON.")

    @field_validator("action")
    @classmethod
    def _action(cls, value: str) -> str:
        if value not in ACTIONS:
            raise UsageError(f"unknown action {value!r}; choose from: {', '.join(ACTIONS)}")
        return value


@command_from(HistorySettings, lambda ctx, values: HistorySettings(**values))
def command(ctx: typer.Context, s: HistorySettings) -> int:
    from kvbench.orchestration.asvrun import AsvProject

    project = AsvProject.load(s.config)
    if s.action == "show":
        return show(project, s.machine, s.as_json)
    if s.action == "upgrade":
        return upgrade(project, s.as_json, s.dry_run)
    cliargs.positive(s.wait_load, "--wait-load")
    return run(project, s.venv, s.machine, s.model, s.bench, s.commit, s.dry_run, s.wait_load)


def wait_for_quiet(max_load: float, timeout_s: float = 1800.0, poll_s: float = 10.0) -> float:
    """Wait until the 1-minute load average is <= max_load (or the timeout); return the load seen last."""
    start = time.monotonic()
    load = os.getloadavg()[0]
    with console.status(f"host load {load:.1f}; waiting for <= {max_load:g}") as status:
        while load > max_load and time.monotonic() - start < timeout_s:
            time.sleep(poll_s)
            load = os.getloadavg()[0]
            status.update(
                f"host load {load:.1f} on {os.cpu_count()} CPUs; "
                f"waiting for <= {max_load:g} ({time.monotonic() - start:.0f} s)"
            )
    return load


def run(
    project,
    venv: Path | None,
    machine: str | None,
    model: str | None,
    bench: list[str] | None,
    commit: bool,
    dry_run: bool,
    wait_load: float | None = None,
) -> int:
    from kvbench.orchestration import asvrun
    from kvbench.specs.machine import check_machine_name, machine_name

    venv = Path(venv or sys.prefix).absolute()
    machine = check_machine_name(machine) if machine else machine_name()
    with console.status(f"asking {venv} for its vLLM"):
        info = asvrun.describe_venv(venv)
    vllm = f"{info['vllm_package']} {info['vllm_version']}"
    env = asvrun.STABLE_ENV  # asv's path-named environment, filed under kvbench's one (asvrun.stabilize)
    console.print(f"[bold]history point[/]: machine {machine}, {vllm} from {venv}")
    console.print(f"asv environment {env} ({project.env_python} -> {venv})")
    dirty = asvrun.dirty_paths(project.repo)
    if dirty:
        console.print(
            f"[yellow]warning[/]: uncommitted changes in {', '.join(dirty[:5])}{' ...' if len(dirty) > 5 else ''}; "
            "the point claims HEAD's code"
        )
    if dry_run:
        head = asvrun.git(project.repo, "rev-parse", "HEAD")
        exists = asvrun.result_file(project.results_dir, machine, head, env).exists()
        console.print(
            f"HEAD {head[:8]} {'already has a point here: an empty history-point commit would be made' if exists else 'has no point here yet'}"  # noqa: E501
        )
        console.print("would run: " + " ".join(asvrun.asv_command(project, head, machine, bench)))
        return 0

    if wait_load is not None:
        load = wait_for_quiet(wait_load)
        if load > wait_load:
            console.print(f"[yellow]warning[/]: host load still {load:.1f} after 30 min; running anyway")
    console.print(f"host load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (recorded in the run record)")
    sha, rc, point, record = asvrun.run_point(project, venv, machine, vllm, bench, model, console)
    _print_point(project, machine, sha, env)
    if rc != 0:
        console.print(f"[red]asv exited {rc}[/]: some benchmark failed (shown as failed in the point)")
    if commit:
        new = asvrun.commit_point(project, machine, vllm, point, record)
        console.print(f"committed the point as {new[:8]}")
    return rc


def _print_point(project, machine: str, sha: str, env: str) -> None:
    from kvbench.analysis.history import history_frame

    frame = history_frame(project.results_dir, project.conf_path)
    rows = frame[(frame.machine == machine) & (frame.commit == sha) & (frame.env_name == env)]
    if rows.empty:
        return
    head = rows.iloc[0]
    console.print(
        f"point {sha[:8]} on {machine}: {vllm_label(head.vllm_package, head.vllm_version)}, "
        f"run {head.run_id} ({head.run_status})"
    )
    console.print(_table(rows, f"new history point ({machine}, {sha[:8]})"))


def _table(rows, title: str) -> Table:
    dtypes = list(dict.fromkeys(rows.kv_dtype))
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    table.add_column("better")
    for d in dtypes:
        table.add_column(d, justify="right")
    for _metric, group in rows.groupby("metric", sort=False):
        by = {r.kv_dtype: r for r in group.itertuples()}
        first = group.iloc[0]
        table.add_row(
            first.label, first.direction, *[fmt_value(by[d].value, by[d].unit) if d in by else "—" for d in dtypes]
        )
    return table


def upgrade(project, as_json: bool, dry_run: bool = False) -> int:
    """Exit 1 when a record could not be rewritten faithfully (it is left as it was, and named); --dry-run
    checks each and writes nothing."""
    from kvbench.orchestration import asvrun

    with console.status(f"rewriting kvbench.run/1 records under {project.results_dir}"):
        outcomes = asvrun.upgrade_history(project, dry_run)
    failed = [p for p, outcome in outcomes if outcome.startswith("left")]
    if as_json:
        print_json([{"record": p, "outcome": o} for p, o in outcomes])
    else:
        for p, outcome in outcomes:
            console.print(f"{escape(p)}: {escape(outcome)}")
        done = "could be rewritten (--dry-run)" if dry_run else "rewritten"
        console.print(f"{len(outcomes) - len(failed)} of {len(outcomes)} records {done}")
    return 1 if failed else 0


def show(project, machine: str | None, as_json: bool) -> int:
    from kvbench.analysis.history import history_frame, points

    problems: list[str] = []
    frame = history_frame(project.results_dir, project.conf_path, problems)
    for problem in problems:
        err_console.print(f"[yellow]warning[/]: {escape(problem)}")
    if machine:
        known = sorted(set(frame.machine))
        if machine not in known:
            raise UsageError(f"no history for machine {machine!r}; choose from: {', '.join(known) or '(none yet)'}")
        frame = frame[frame.machine == machine]
    if as_json:
        out = frame.assign(commit_date=frame.commit_date.astype(str), run_started=frame.run_started.astype(str))
        print_json(out.to_dict(orient="records"))
        return 0
    if frame.empty:
        console.print(f"no history points under {project.results_dir}")
        return 0
    pts = points(frame)
    table = Table(title="history points, oldest first", title_justify="left")
    for col in ("machine", "commit", "run started (UTC)", "vLLM", "run", "status", "GPU / driver / CUDA"):
        table.add_column(col)
    for p in pts.itertuples():
        table.add_row(
            p.machine,
            p.commit[:8],
            f"{p.run_started:%Y-%m-%d %H:%M}",
            vllm_label(p.vllm_package, p.vllm_version),
            str(p.run_id),
            str(p.run_status),
            f"{p.gpu} / {p.driver} / {p.cuda}",
        )
    console.print(table)
    newest = pts.groupby("machine").tail(1)
    for p in newest.itertuples():
        rows = frame[(frame.machine == p.machine) & (frame.commit == p.commit) & (frame.env_name == p.env_name)]
        console.print(
            _table(rows, f"newest point on {p.machine} ({p.commit[:8]}, {vllm_label(p.vllm_package, p.vllm_version)})")
        )
    return 0
