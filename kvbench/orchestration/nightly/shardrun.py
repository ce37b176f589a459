"""One shard's night on this machine (`kvbench nightly --shard I`): its units through the night's steps, then
its folder and manifest for the merge (kvbench/orchestration/nightly/merge.py). The command
(kvbench/cli/commands/nightly_fleet.py) checks the installed vLLM and prints the summary; this module runs the shard and
writes what the merge reads."""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape

from kvbench.core.errors import UsageError


def run_shard(ctx: dict, sp, index: int, night: str | None, out: Path | None, execute) -> int:
    """One shard's night here: its units through the night's steps (history only where it owns the point;
    gate and dashboard wait for the merge), then its folder and manifest. A failure before the night is
    written as a failed shard, so the merge can name it."""
    from kvbench.orchestration.nightly import manifest as mf
    from kvbench.orchestration.nightly.shards import restrict
    from kvbench.records import utc_iso

    plan, est, target = ctx["plan"], ctx["est"], ctx["target"]
    shard = sp.shard(index)
    night = night or time.strftime("%Y%m%d", time.gmtime())
    out = out or Path("shards") / night / plan.key / f"shard-{index}-of-{shard.of}"
    out = mf.prepare(out, night, plan.key, index)
    started = utc_iso()
    base = {
        "night": night,
        "section": plan.key,
        "machine": target.machine,
        "shard": index,
        "shards": shard.of,
        "units": shard.names,
        "plan": sp.as_json(),
        "config": mf.config_block(ctx["cfg_path"]),
        "host": mf.host(),
        "started_at": started,
    }
    try:
        ctx["check"]()
        sub_plan, sub_est = restrict(plan, est, shard)
        if sub_est.minutes > plan.cfg.max_minutes:
            raise UsageError(
                f"refused: {shard.tag} of [machines.{plan.key}] estimate {sub_est.minutes:.1f} min exceeds "
                f"max_minutes {plan.cfg.max_minutes:g}"
            )
        night_obj = shard_night(ctx, sub_plan, sub_est, shard, f"{night}-{target.machine}", out)
        if plan.cfg.nodes > 1:
            from kvbench.orchestration.nightly.nodes import cluster

            night_obj.nodes = cluster(plan.cfg.nodes)
        repo = Path(ctx["asv_config"]).absolute().parent
        before, head = mf.snapshot(night_obj.results_dir, target.machine), mf.git_head(repo)
        ctx["console"].print(
            f"[bold]{shard.tag}[/] of night {night}: " + escape(f"[machines.{plan.key}] {', '.join(shard.names)}")
        )
        doc = execute(night_obj)
    except Exception as exc:
        failed = mf.ShardManifest(
            **base, status="failed", exit_code=getattr(exc, "exit_code", 1), error=str(exc), finished_at=utc_iso()
        )
        mf.write_manifest(out, failed)
        raise
    files = mf.changed(night_obj.results_dir, target.machine, before)
    hashes = mf.pack(out, night_obj.results_dir, files, doc, repo, head)
    rc = 130 if night_obj.interrupted else (0 if doc["status"] == "ok" else 1)
    manifest = mf.ShardManifest(
        **base,
        status="interrupted" if night_obj.interrupted else doc["status"],
        exit_code=rc,
        nodes=night_obj.nodes,
        finished_at=utc_iso(),
        files=hashes,
        summary=mf.SUMMARY,
        commits=mf.BUNDLE if mf.BUNDLE in hashes else None,
    )
    path = mf.write_manifest(out, manifest)
    ctx["console"].print(f"shard folder: {out} ({len(files)} files; manifest {path})")
    return rc


def shard_night(ctx: dict, sub_plan, sub_est, shard, night_id: str, out: Path):
    """The Nightly of one shard: the history point only where the shard owns it; no gate or dashboard (the
    merge runs them over every shard); its summary in the shard folder, not in results/."""
    from kvbench.orchestration.nightly.orchestrate import Nightly

    cfg = ctx["cfg"]
    scfg = cfg.model_copy(
        update={
            "history": cfg.history.model_copy(update={"enabled": cfg.history.enabled and shard.owns_history}),
            "gate": cfg.gate.model_copy(update={"enabled": False}),
            "dashboard": cfg.dashboard.model_copy(update={"enabled": False}),
        }
    )
    night = Nightly(
        scfg,
        ctx["cfg_path"],
        sub_plan,
        ctx["target"],
        sub_est,
        ctx["asv_config"],
        ctx["site_out"],
        ctx["console"],
        ctx["installed"],
        night_id=night_id,
    )
    night.summary_path = out / "summary.json"
    return night
