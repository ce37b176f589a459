"""The fleet side of `kvbench nightly` (kvbench/cli/commands/nightly_settings.py declares and checks the options):
shards in the dry run, one shard's night (`--shard`), `--launch sky` and `--merge`. The logic is
kvbench.orchestration.nightly's shards, manifest, fleet and merge modules; this file prints."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from kvbench.core.errors import UsageError
from kvbench.core.output import console

# -- shards in the dry run ----------------------------------------------------------------------------------


def render_shards(sp, plan) -> None:
    n = len(sp.shards)
    table = Table(show_edge=False, title=f"{plan.key}: {n} shard{'s' if n != 1 else ''}, each on its own machine")
    for col in ("shard", "units (all KV dtypes of each)", "est. min", "GPU-hours", "USD"):
        table.add_column(col, justify="left" if col.startswith("units") else "right")
    for s in sp.shards:
        usd = sp.usd(s)
        table.add_row(
            f"{s.index}/{s.of}",
            escape("; ".join(u.label for u in s.units) or "(nothing: not launched)"),
            f"{s.minutes:.1f}",
            f"{s.minutes / 60 * sp.gpus:.2f}",
            "—" if usd is None else f"{usd:,.2f}",
        )
    console.print(table)
    share = sp.wall_minutes / sp.serial_minutes * 100 if sp.serial_minutes else 0.0
    usd = sp.usd()
    console.print(
        f"night with {n} shards in parallel: {sp.wall_minutes:.1f} min wall-clock ({share:.0f}% of the serial "
        f"{sp.serial_minutes:.1f} min), {sp.gpu_hours:.2f} GPU-hours"
        + ("" if usd is None else f", USD {usd:,.2f}")
        + " (every unit runs once; each shard's install and model download are not counted)"
    )


def shards_json(sp) -> dict:
    return {**sp.as_json(), "usd": sp.usd(), "gpu_hours": sp.gpu_hours}


# -- one shard --------------------------------------------------------------------------------------------


def run_shard_here(cfg, cfg_path, plan, est, target, asv_config: Path, out: Path | None, one: dict, run_night) -> int:
    """`kvbench nightly --shard I`: the installed vLLM checked as for a night, then
    kvbench.orchestration.nightly.shardrun."""
    from kvbench.cli.commands.nightly_summary import render_summary
    from kvbench.orchestration.nightly import vllm
    from kvbench.orchestration.nightly.shardrun import run_shard
    from kvbench.orchestration.nightly.shards import the_shard_plan
    from kvbench.orchestration.nightly.target import results_dir_of

    sp = the_shard_plan(plan, est, one["shards"], one["shard_plan"])
    installed = vllm.installed()

    def check():  # inside the shard: a refusal here is the shard's failure, written for the merge
        if (why := vllm.mismatch(plan.vllm, *installed)) is not None:
            raise UsageError(why)
        if cfg.history.enabled:
            results_dir_of(asv_config)

    ctx = {
        "check": check,
        "cfg": cfg,
        "cfg_path": cfg_path,
        "plan": plan,
        "est": est,
        "target": target,
        "asv_config": asv_config,
        "site_out": out or Path(cfg.dashboard.out),
        "installed": installed,
        "console": console,
    }

    def execute(night):
        doc = run_night(night)
        render_summary(doc, night.path)
        return doc

    return run_shard(ctx, sp, one["shard"], one["night"], one["shard_out"], execute)


# -- --launch sky -------------------------------------------------------------------------------------------


def launch(ctx: dict, keys: list[str], n: int | None, yes: bool, wait_min: float | None, fleet_dir, dry_run) -> int:
    """The night's shards as SkyPilot tasks from sky/nightly.yaml: the plan and its cost first, then the
    task files, then (not on a dry run) the submission, the job ids and how to follow them."""
    from kvbench.orchestration.nightly import fleet as fl
    from kvbench.orchestration.nightly import manifest as mf
    from kvbench.orchestration.nightly.shards import shard_plans

    cfg, plans, estimates = ctx["cfg"], ctx["plans"], ctx["estimates"]
    root = Path.cwd()
    n = n or cfg.fleet.shards
    sections = fl.gpu_sections(cfg, ctx["gpu"])
    fleet = fl.Fleet(
        night=fl.new_night(),
        config_rel=fl.checkout_relative(ctx["cfg_path"], root),
        config=mf.config_block(ctx["cfg_path"]),
        bucket=ctx.get("bucket") or cfg.fleet.bucket,
        spot=cfg.fleet.spot,
        plans={k: plans[k] for k in sections},
        estimates={k: estimates[k] for k in sections},
        shards=shard_plans({k: plans[k] for k in sections}, estimates, n),
    )
    console.rule(f"[bold]night {fleet.night} on SkyPilot[/]", align="left")
    for k in sections:
        console.print(escape(f"[machines.{k}]: {fl.accelerator(plans[k])} x {plans[k].gpus} per shard"))
        render_shards(fleet.shards[k], plans[k])
    hours, usd = fl.totals(fleet)
    wall = max(sp.wall_minutes for sp in fleet.shards.values())
    mode = "spot (recovered when preempted)" if fleet.spot else "on-demand"
    cost = "no price given: --price-per-hour GPU=USD" if usd is None else f"USD {usd:,.2f}"
    console.print(
        f"[bold]the night[/]: {len(fleet.launched())} {mode} machines, about {wall:.0f} min, "
        f"{hours:.2f} GPU-hours, {cost}; nothing is rented yet"
    )
    if too_long := fl.over_deadline(fleet):
        raise UsageError("refused: " + "; ".join(too_long) + " (more shards, a smaller matrix, or more max_minutes)")
    out = Path(fleet_dir) if fleet_dir else Path("fleet") / fleet.night
    written = fl.write_tasks(fleet, cfg, root, out)
    console.print(f"task files: {out}/ ({len(written)} tasks and plan.json)")
    if dry_run:
        console.print("dry run: nothing submitted")
        return 0
    if (over := fl.over_budget(fleet, cfg)) and not yes:
        raise UsageError("refused: " + "; ".join(over) + " (pass --yes to launch anyway)")
    template = fl.load_template(root)
    sky = fl.sky_sdk()
    rows = fl.submit(written, fleet, fl.secrets(template), sky)
    (out / "jobs.json").write_text(json.dumps(rows, indent=1) + "\n")
    render_jobs(rows, fleet, out)
    failed = [r for r in rows if "error" in r]
    if wait_min is None or not fleet.bucket:
        if wait_min is not None:
            console.print("--wait follows managed jobs, which need [fleet] bucket; fetch each cluster's shard instead")
        return 1 if failed else 0
    ids = [r["job_id"] for r in rows if r.get("job_id") is not None]
    statuses = fl.wait(ids, wait_min * 60, _progress, sky)
    for r in rows:
        if r.get("job_id") in statuses:
            r["status"] = statuses[r["job_id"]]
    (out / "jobs.json").write_text(json.dumps(rows, indent=1) + "\n")
    bad = [r for r in rows if r.get("status") != "SUCCEEDED"]
    for r in bad:
        console.print(escape(f"{r['section']} shard {r['shard']}: {r.get('status') or r.get('error')}"))
    console.print(f"merge: kvbench nightly --merge {out / 'plan.json'}")
    return 1 if bad else 0


def _progress(statuses: dict, running: list) -> None:
    counts: dict[str, int] = {}
    for s in statuses.values():
        counts[s] = counts.get(s, 0) + 1
    console.print(
        time.strftime("%H:%M:%S ")
        + ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
        + f"; {len(running)} still going"
    )


def render_jobs(rows: list[dict], fleet, out: Path) -> None:
    table = Table(show_edge=False)
    for col in ("section", "shard", "name", "managed job" if fleet.bucket else "cluster / job"):
        table.add_column(col)
    for r in rows:
        job = r.get("error") or (f"{r.get('cluster')} / {r.get('job_id')}" if r.get("cluster") else str(r["job_id"]))
        table.add_row(r["section"], str(r["shard"]), r["name"], escape(job))
    console.print(table)
    ids = " ".join(str(r["job_id"]) for r in rows if r.get("job_id") is not None)
    if fleet.bucket:
        lines = [
            "sky jobs queue                       # every shard's state",
            "sky jobs logs <id>                   # follow one (its kvbench output)",
            f"sky jobs cancel {ids}".ljust(37) + "# stop the night",
            f"kvbench nightly --merge {out / 'plan.json'}   # when they are done: fetch {fleet.outputs}, merge, gate",
        ]
    else:
        lines = [
            "sky status                           # the shards' clusters",
            "sky logs <cluster>                   # follow one",
            f"rsync -Pavz <cluster>:kvbench-shards/{fleet.night}/ shards/{fleet.night}/   # fetch each shard "
            f"(its cluster goes down {fl_keep()} idle minutes after it ends)",
            f"kvbench nightly --merge {out / 'plan.json'} --merge shards/{fleet.night}",
        ]
    console.print("follow the night:")
    for line in lines:
        console.print(escape(f"  {line}"), highlight=False)


def fl_keep() -> int:
    from kvbench.orchestration.nightly.fleet import KEEP_MINUTES

    return KEEP_MINUTES


# -- --merge -------------------------------------------------------------------------------------------------


def merge(paths: list[str], asv_config: Path, out: Path | None) -> int:
    """Shard folders, bucket paths or the launcher's plan.json into results/: validate, copy, then the gate,
    the dashboard and one summary per machine; exit 1 if any night is not OK or a shard is not merged."""
    from kvbench.cli.commands.nightly_summary import render_summary
    from kvbench.orchestration.nightly import merge as mg

    groups, stray = mg.gather(paths)
    nights = mg.merge(groups, asv_config, out, console)
    for night in nights:
        render_shard_table(night)
        render_summary(night.doc, night.path)
        for s in night.group.slots:
            if s.merged and s.arrival.manifest.commits:
                bundle = s.arrival.folder / s.arrival.manifest.commits
                console.print(escape(f"history-point commits: git fetch {bundle} HEAD && git merge FETCH_HEAD"))
    for line in stray:
        console.print(escape(f"not merged: {line}"), style="red")
    bad = [n for n in nights if n.doc["status"] != "ok"]
    return 1 if bad or stray else 0


def render_shard_table(night) -> None:
    g = night.group
    where = escape(f"[machines.{g.section}] -> results/{g.machine}/")
    console.rule(f"[bold]merge: night {g.night}, {where}[/]", align="left")
    table = Table(show_edge=False)
    for col in ("shard", "units", "merged", "from"):
        table.add_column(col)
    for s in g.slots:
        merged = "[green]yes[/]" if s.merged else f"[bold red]no[/]: {escape(s.problem or 'never arrived')}"
        source = escape(str(s.arrival.folder)) if s.arrival else "—"
        table.add_row(f"{s.index}/{g.plan['shards']}", escape(", ".join(s.units)), merged, source)
    console.print(table)
    for line in g.extra:
        console.print(escape(f"not merged: {line}"), style="red")
