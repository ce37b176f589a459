"""`kvbench tinymodel`: the CPU default's committed tiny model: retrain it, check its hashes, score it in torch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from rich.table import Table

from kvbench.cli.clisettings import command_from
from kvbench.core import cliargs
from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag
from kvbench.core.output import console, err_console, print_json
from kvbench.specs.formats import tracked_dtypes
from kvbench.specs.options import AsJson, KvDtypes

NAME = "tinymodel"
HELP = (
    "The CPU default's tiny model (committed in kvbench/data/tinymodel/): train reruns its recipe, verify "
    "checks sha256, accuracy scores it in torch with fp8/nvfp4 fake-quantized K/V."
)


def _passive_threads() -> None:
    # OpenMP threads that spin while they wait cost 6-8x the CPU time per token on a shared, busy box (measured
    # on 2 cores); passive waiting changes no result. Read when torch loads its OpenMP runtime: set it first.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


class TrainSettings(BaseModel):
    """What one `kvbench tinymodel train` is asked to do."""

    model_config = ConfigDict(extra="forbid")

    out: Annotated[Path, Flag("--out")] = Field(description="Folder to write the model into (new or empty).")
    report_items: Annotated[int, Flag("--report-items")] = Field(
        200, description="Items per task scored into training_report.json (0: none)."
    )

    @model_validator(mode="after")
    def _check(self) -> TrainSettings:
        cliargs.number(self.report_items, "--report-items", low=0, kind="a whole number")
        if self.out.exists() and (not self.out.is_dir() or any(self.out.iterdir())):
            raise UsageError(f"--out {self.out} exists and is not an empty folder; name a new one")
        return self


class VerifySettings(BaseModel):
    """What one `kvbench tinymodel verify` is asked to do."""

    model_config = ConfigDict(extra="forbid")

    folder: Annotated[Path | None, Flag("--dir")] = Field(
        None, description="Folder to check (default: kvbench/data/tinymodel)."
    )


class ScoreSettings(BaseModel):
    """What one `kvbench tinymodel accuracy` is asked to do; the fields are its options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    tasks: Annotated[str, Flag("--tasks")] = Field(
        "kvbench_needle_512,kvbench_manykeys_512,kvbench_track_512", description="Comma-separated bundled tasks."
    )
    items: Annotated[int, Flag("--items")] = Field(200, description="First N items of each task.")
    kv_dtypes: KvDtypes = Field(  # the tiny model scores the tracked dtypes (kvbench.tinymodel.scoring)
        ",".join(tracked_dtypes()), description=f"{', '.join(tracked_dtypes()[:-1])} and/or {tracked_dtypes()[-1]}."
    )
    folder: Annotated[Path | None, Flag("--dir")] = Field(
        None, description="Model folder (default: the committed one)."
    )
    as_json: AsJson = Field(description="Machine-readable output.")

    # what the checks parsed: the task names and the KV dtypes
    _tasks: list[str] = PrivateAttr(default_factory=list)
    _dtypes: list[str] = PrivateAttr(default_factory=list)

    @property
    def task_list(self) -> list[str]:
        return self._tasks

    @property
    def dtype_list(self) -> list[str]:
        return self._dtypes

    @model_validator(mode="after")
    def _check(self) -> ScoreSettings:
        """The flag checks, in the order the command always made them (the first wrong flag is the one named)."""
        from kvbench.specs import evaltasks
        from kvbench.tinymodel import scoring

        cliargs.at_least_one(self.items, "--items")
        self._tasks = cliargs.names(self.tasks, "--tasks", "kvbench_needle_512")
        for task in self._tasks:
            evaltasks.parse_task(task)
        self._dtypes = cliargs.choices(self.kv_dtypes or "", "--kv-dtypes", scoring.KV_DTYPES, "KV dtype")
        return self


app = typer.Typer(name=NAME, help=HELP, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command(
    "train",
    help=(
        "Rerun the committed model's recipe (kvbench/data/tinymodel.toml; fp32, fixed seed and threads) into "
        "DIR, then compare its files with the committed sha256. About 25 minutes on 2 busy cores."
    ),
)
@command_from(TrainSettings, lambda ctx, values: TrainSettings(**values))
def train(ctx: typer.Context, settings: TrainSettings) -> None:
    out, report_items = settings.out, settings.report_items
    _passive_threads()
    from kvbench.tinymodel import build as tinymodel
    from kvbench.tinymodel import train as tinytrain

    report = tinytrain.build(out, log=lambda m: err_console.print(f"[dim]{m}[/]"), report_items=report_items)
    err_console.print(f"trained in {report['wall_time_s']['total']:.0f} s, final loss {report['final_loss']}")
    for row in report["accuracy_bf16"]:
        err_console.print(f"{row['task']}: {row['correct']}/{row['n']} at auto (bf16, torch)")
    _print_verify(out, tinymodel.verify(out))


@app.command("verify", help="Check a model folder (default: the committed one) against the recorded sha256.")
@command_from(VerifySettings, lambda ctx, values: VerifySettings(**values))
def verify(ctx: typer.Context, settings: VerifySettings) -> None:
    from kvbench.tinymodel import build as tinymodel

    folder = settings.folder or tinymodel.committed_dir()
    if not folder.is_dir():
        raise UsageError(f"--dir {folder} is not a folder")
    _print_verify(folder, tinymodel.verify(folder))


def _print_verify(folder: Path, bad: dict) -> None:
    from kvbench.tinymodel import build as tinymodel

    for name, digest in tinymodel.recorded_sha256().items():
        if name in bad:
            actual = bad[name][1]
            console.print(f"DIFFERS {name}: recorded {digest[:16]}, {folder} has {actual[:16] if actual else 'none'}")
        else:
            console.print(f"ok      {name}  {digest}")
    if bad:
        console.print(f"{len(bad)} of {len(tinymodel.recorded_sha256())} files differ from {tinymodel.SHA256_FILE}")
        raise typer.Exit(1)


@app.command(
    "accuracy",
    help=(
        "Score a model folder (default: the committed one) on kvbench's tasks in torch at bf16, with the K/V "
        "cache auto or fake-quantized to fp8 (e4m3) or nvfp4 by kvbench's reference numerics: exact match, "
        "Wilson 95% intervals. No vLLM."
    ),
)
@command_from(ScoreSettings, lambda ctx, values: ScoreSettings(**values))
def accuracy(ctx: typer.Context, settings: ScoreSettings) -> None:
    names, items, dtypes, folder, as_json = (
        settings.task_list,
        settings.items,
        settings.dtype_list,
        settings.folder,
        settings.as_json,
    )
    _passive_threads()
    import torch

    from kvbench.tinymodel import build as tinymodel
    from kvbench.tinymodel import scoring

    folder = folder or tinymodel.ensure_trained_model()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tok = scoring.load(folder)
    log = None if as_json else (lambda m: err_console.print(f"[dim]{m}[/]"))
    scores = scoring.measure(model, tok, names, items, dtypes, log=log)
    rows = [s.summary() for s in scores]
    _pair_with_auto(scores, rows)
    if as_json:
        print_json({"model": str(folder), "items": items, "scores": rows})
        return
    table = Table(title=f"{folder.name}: greedy exact match, bf16 weights in torch, first {items} items per task")
    for col in ("task", "KV", "correct", "accuracy", "95% CI (Wilson)", "vs auto, same items (McNemar exact)"):
        table.add_column(col)
    for r in rows:
        lo, hi = r["wilson95"]
        vs = r.get("vs_auto")
        paired = f"-{vs['losses']} +{vs['gains']}: {vs['verdict']}" if vs else ""
        table.add_row(
            r["task"],
            r["kv_dtype"],
            f"{r['correct']}/{r['n']}",
            f"{r['accuracy']:.1%}",
            f"{lo:.1%} - {hi:.1%}",
            paired,
        )
    console.print(table)


def _pair_with_auto(scores, rows) -> None:
    """Each non-auto row gets its paired comparison with auto on the same items (losses, gains, McNemar)."""
    from kvbench.core.stats import compare

    auto = {s.task: s.correct for s in scores if s.kv_dtype == "auto"}
    for s, row in zip(scores, rows, strict=True):
        if s.kv_dtype != "auto" and s.task in auto:
            c = compare(auto[s.task], s.correct)
            row["vs_auto"] = {"losses": c.losses, "gains": c.gains, "p_value": c.p_value, "verdict": c.verdict}
