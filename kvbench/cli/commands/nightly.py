"""`kvbench nightly`: detect the GPU, run the configured matrix through the harness, add the asv history
point, gate regressions, build the dashboard; exit 1 on a regression or a failed run, with the reasons.
`--dry-run` checks the config and prints every machine's plan with its estimated minutes, GPU-hours and
cost (and its shards), and starts nothing. The config, the matrix and the estimate are kvbench.orchestration.nightly.
The fleet (`--shards`/`--shard`, `--launch sky`, `--merge`) is kvbench/cli/commands/nightly_fleet.py."""

from __future__ import annotations

import signal
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.cli.clisettings import command_from
from kvbench.cli.commands.nightly_plan import _plan_json, render_plan
from kvbench.cli.commands.nightly_settings import NightlySettings
from kvbench.cli.commands.nightly_summary import render_summary
from kvbench.core.errors import UsageError
from kvbench.core.output import console, print_json
from kvbench.orchestration.nightly.outcomes import NightStatus

NAME = "nightly"
HELP = (
    "One night on this machine: the configured models x workloads x SLOs through the harness, an asv history point, "
    "the regression gate and the dashboard; exit 1 on a regression or a failed run. --dry-run prints every machine's "
    "plan with estimated GPU-hours and cost. On a rented fleet: --launch sky runs the night's shards as SkyPilot "
    "managed jobs, --shard I runs one, --merge gathers them into results/."
)
PRINTS = ("machine", "install-args", "models")


def settings_of(ctx: typer.Context, values: dict) -> NightlySettings:
    return NightlySettings(**values)


@command_from(NightlySettings, settings_of)
def command(ctx: typer.Context, s: NightlySettings) -> int:
    from kvbench.cli.commands import nightly_fleet as fleet
    from kvbench.orchestration.nightly import config as nconfig
    from kvbench.orchestration.nightly.estimate import estimate_machine, fits, model_spec
    from kvbench.orchestration.nightly.matrix import expand
    from kvbench.orchestration.nightly.shards import shard_plans

    if s.merge:
        return fleet.merge(s.merge, s.asv_config, s.out)
    cfg, cfg_path = nconfig.load(s.config)
    gpu = s.gpu
    if gpu is not None and gpu not in cfg.machines:
        raise UsageError(
            f"--gpu {gpu!r} has no [machines.{gpu}] section in {cfg_path}; choose from: {', '.join(cfg.machines)}"
        )
    prices = _prices(s.price_per_hour, cfg)
    if s.print_what is not None:
        return _print(s.print_what, cfg, gpu)

    keys = [gpu] if gpu else list(cfg.machines)
    plans = {k: expand(cfg, k) for k in keys}
    for plan in plans.values():  # a model that cannot run at the section's TP is a config error
        for model in {e.model for e in plan.entries} | {plan.history_model}:
            if (why := fits(model_spec(model), plan)) is not None:
                raise UsageError(f"[machines.{plan.key}]: {why}")
    estimates = {k: estimate_machine(cfg, p, prices) for k, p in plans.items()}
    if s.launch:
        ctx = {"cfg": cfg, "cfg_path": cfg_path, "plans": plans, "estimates": estimates, "gpu": gpu, "bucket": s.bucket}
        return fleet.launch(ctx, keys, s.shards, s.yes, s.wait, s.fleet_dir, s.dry_run)
    if s.dry_run:
        n_shards = s.shards or (cfg.fleet.shards if cfg.fleet.shards > 1 else None)
        sharded = shard_plans(plans, estimates, n_shards) if n_shards else {}
        return _dry_run(cfg, cfg_path, keys, plans, estimates, sharded, s.as_json)
    if s.as_json:
        raise UsageError("--json goes with --dry-run (a run writes its summary to results/<machine>/nightly/)")
    return _run(cfg, cfg_path, gpu, estimates, plans, s.asv_config, s.out, s.one_shard())


def _dry_run(cfg, cfg_path: Path, keys: list, plans: dict, estimates: dict, sharded: dict, as_json: bool) -> int:
    """Every machine's plan, estimate and shards, printed or as JSON; refused (exit 2) over a section's budget."""
    from kvbench.cli.commands import nightly_fleet as fleet
    from kvbench.orchestration.nightly.estimate import assumptions

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


# -- the run ------------------------------------------------------------------------------------------


def _run(cfg, cfg_path, gpu, estimates, plans, asv_config: Path, out: Path | None, one: dict | None = None) -> int:
    from kvbench.orchestration.nightly import vllm
    from kvbench.orchestration.nightly.estimate import estimate_machine
    from kvbench.orchestration.nightly.matrix import expand
    from kvbench.orchestration.nightly.orchestrate import Nightly
    from kvbench.orchestration.nightly.target import detect, results_dir_of

    target = detect(cfg)
    if gpu is not None and gpu != target.key:
        raise UsageError(f"--gpu {gpu} does not match this machine ({target.key}); a run measures the GPU it is on")
    plan = plans.get(target.key) or expand(cfg, target.key)
    est = estimates.get(target.key) or estimate_machine(cfg, plan)
    if one is not None:  # one shard: its own budget check, its own folder
        from kvbench.cli.commands.nightly_fleet import run_shard_here

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
        from kvbench.orchestration.nightly.nodes import cluster

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
    from kvbench.cli.commands.plan import parse_prices

    return parse_prices(text, {k for k in cfg.machines if k != "cpu"})


def _print(what: str, cfg, gpu: str | None) -> int:
    from kvbench.orchestration.nightly import vllm
    from kvbench.orchestration.nightly.config import model_kind
    from kvbench.orchestration.nightly.matrix import expand
    from kvbench.orchestration.nightly.target import detect

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
    import os

    from kvbench.orchestration.nightly.target import detect
    from kvbench.specs.machine import check_machine_name

    if os.environ.get("KVBENCH_MACHINE"):  # N-P19: the dry run refuses what the night would
        check_machine_name(os.environ["KVBENCH_MACHINE"], "KVBENCH_MACHINE")
    try:
        return detect(cfg).key
    except UsageError:
        return None


def _describe_detected(key: str | None) -> str:
    if key is None:
        return "no section of this config"
    return "no GPU, [machines.cpu]" if key == "cpu" else f"[machines.{key}]"
