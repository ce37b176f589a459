"""`kvbench tinymodel`: the CPU default's committed tiny model: retrain it, check its hashes, score it in torch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvbench import cliargs
from kvbench.errors import UsageError
from kvbench.output import console, err_console, print_json

NAME = "tinymodel"
HELP = (
    "The CPU default's tiny model (committed in kvbench/data/tinymodel/): train reruns its recipe, verify "
    "checks sha256, accuracy scores it in torch with fp8/nvfp4 fake-quantized K/V."
)


def _passive_threads() -> None:
    # OpenMP threads that spin while they wait cost 6-8x the CPU time per token on a shared, busy box (measured
    # on 2 cores); passive waiting changes no result. Read when torch loads its OpenMP runtime: set it first.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


app = typer.Typer(name=NAME, help=HELP, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command(
    "train",
    help=(
        "Rerun the committed model's recipe (kvbench/data/tinymodel.toml; fp32, fixed seed and threads) into "
        "DIR, then compare its files with the committed sha256. About 25 minutes on 2 busy cores."
    ),
)
def train(
    out: Annotated[Path, typer.Option("--out", help="Folder to write the model into (new or empty).")],
    report_items: Annotated[
        int, typer.Option("--report-items", help="Items per task scored into training_report.json (0: none).")
    ] = 200,
) -> None:
    _passive_threads()
    from kvbench.tinymodel import build as tinymodel
    from kvbench.tinymodel import train as tinytrain

    cliargs.number(report_items, "--report-items", low=0, kind="a whole number")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty folder; name a new one")
    report = tinytrain.build(out, log=lambda m: err_console.print(f"[dim]{m}[/]"), report_items=report_items)
    err_console.print(f"trained in {report['wall_time_s']['total']:.0f} s, final loss {report['final_loss']}")
    for row in report["accuracy_bf16"]:
        err_console.print(f"{row['task']}: {row['correct']}/{row['n']} at auto (bf16, torch)")
    _print_verify(out, tinymodel.verify(out))


@app.command("verify", help="Check a model folder (default: the committed one) against the recorded sha256.")
def verify(
    folder: Annotated[
        Path | None, typer.Option("--dir", help="Folder to check (default: kvbench/data/tinymodel).")
    ] = None,
) -> None:
    from kvbench.tinymodel import build as tinymodel

    folder = folder or tinymodel.committed_dir()
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
def accuracy(
    tasks: Annotated[
        str, typer.Option("--tasks", help="Comma-separated bundled tasks.")
    ] = "kvbench_needle_512,kvbench_manykeys_512,kvbench_track_512",
    items: Annotated[int, typer.Option("--items", help="First N items of each task.")] = 200,
    kv_dtypes: Annotated[str, typer.Option("--kv-dtypes", help="auto, fp8 and/or nvfp4.")] = "auto,fp8,nvfp4",
    folder: Annotated[Path | None, typer.Option("--dir", help="Model folder (default: the committed one).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    _passive_threads()
    import torch

    from kvbench import evaltasks
    from kvbench.tinymodel import build as tinymodel
    from kvbench.tinymodel import scoring

    cliargs.at_least_one(items, "--items")
    names = cliargs.names(tasks, "--tasks", "kvbench_needle_512")
    for task in names:
        evaltasks.parse_task(task)
    dtypes = cliargs.choices(kv_dtypes, "--kv-dtypes", scoring.KV_DTYPES, "KV dtype")
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
    from kvbench.stats import compare

    auto = {s.task: s.correct for s in scores if s.kv_dtype == "auto"}
    for s, row in zip(scores, rows, strict=True):
        if s.kv_dtype != "auto" and s.task in auto:
            c = compare(auto[s.task], s.correct)
            row["vs_auto"] = {"losses": c.losses, "gains": c.gains, "p_value": c.p_value, "verdict": c.verdict}
