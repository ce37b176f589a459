"""Every setting of `kvbench nightly`, declared once: its flag, default, check and help (kvbench/core/flags.py's
Flag, shared options from kvbench/specs/options.py; the command line is generated from the fields by
kvbench/cli/clisettings.py). The checks here need no config; those that read it (--gpu's section, the prices, the
budget) stay with the command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag
from kvbench.specs.options import AsJson

LAUNCHERS = ("sky",)
MAX_SHARDS = 1000  # machines rented for one night; a night has far fewer units than this


class NightlySettings(BaseModel):
    """What one `kvbench nightly` is asked to do; the fields are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    config: Annotated[Path | None, Flag("--config")] = Field(
        None, description="Nightly config TOML (default: the shipped kvbench/data/nightly.toml)."
    )
    dry_run: Annotated[bool, Flag("--dry-run")] = Field(
        False, description="Check the config and print the plans, estimates and costs; start nothing."
    )
    gpu: Annotated[str | None, Flag("--gpu")] = Field(
        None, description="Config section: a GPU key (h100-sxm, ...) or cpu. Default: this machine's (dry run: all)."
    )
    price_per_hour: Annotated[str | None, Flag("--price-per-hour")] = Field(
        None, description="USD per GPU-hour for the cost, e.g. h100-sxm=2.65,h200=3.5 (kvbench ships no prices)."
    )
    asv_config: Annotated[Path, Flag("--asv-config")] = Field(
        Path("asv.conf.json"),
        description="asv config of the kvbench checkout; records and history go to its results_dir.",
    )
    out: Annotated[Path | None, Flag("--out")] = Field(
        None, description="Dashboard folder (default: the config's dashboard.out)."
    )
    print_what: Annotated[str | None, Flag("--print")] = Field(
        None,
        description=(
            "Print one thing for scripts and exit: machine (results folder name), "
            "install-args (`uv pip install` arguments for the config's vLLM), models (HF ids to download)."
        ),
    )
    as_json: AsJson = Field(description="With --dry-run: the plans as JSON.")
    shards: Annotated[int | None, Flag("--shards")] = Field(
        None,
        description=(
            "Cut each section's night into N shards that run on N machines at once (default: [fleet] shards); "
            "--dry-run prints them with minutes, cost and the night's wall-clock."
        ),
    )
    shard: Annotated[int | None, Flag("--shard")] = Field(
        None, description="Run shard I (1-based) of --shards N here, into a shard folder."
    )
    shard_plan: Annotated[Path | None, Flag("--shard-plan")] = Field(
        None, description="The partition the launcher computed (plan.json): who owns which entry."
    )
    shard_out: Annotated[Path | None, Flag("--shard-out")] = Field(
        None, description="The shard's folder (default shards/<night>/<section>/shard-I-of-N)."
    )
    night: Annotated[str | None, Flag("--night")] = Field(
        None, description="The night's id, the same on every shard (default: today, UTC)."
    )
    launch: Annotated[str | None, Flag("--launch")] = Field(
        None,
        description=(
            "sky: write one SkyPilot task per shard (sky/nightly.yaml) and submit them as managed jobs; "
            "with --dry-run only the task files."
        ),
    )
    yes: Annotated[bool, Flag("--yes")] = Field(
        False, description="Launch even when the estimate exceeds [fleet]'s budget."
    )
    wait: Annotated[float | None, Flag("--wait")] = Field(
        None, description="With --launch: wait up to this many minutes for the shards, cancel the rest."
    )
    bucket: Annotated[str | None, Flag("--bucket")] = Field(
        None, description="With --launch: where shards write (s3://... or gs://...); overrides [fleet]."
    )
    fleet_dir: Annotated[Path | None, Flag("--fleet-dir")] = Field(
        None, description="Where --launch writes the task files (default fleet/<night>)."
    )
    merge: Annotated[list[str] | None, Flag("--merge")] = Field(
        None,
        description=(
            "Merge a night's shards into results/: shard folders, a bucket path (s3://, gs://) or the "
            "launcher's plan.json; then the gate, the dashboard and the summary. Repeatable."
        ),
    )

    def one_shard(self) -> dict | None:
        """--shard I's settings for kvbench/cli/commands/nightly_fleet.py run_shard_here (None: the whole night)."""
        if self.shard is None:
            return None
        return {
            "shards": self.shards,
            "shard": self.shard,
            "shard_plan": self.shard_plan,
            "shard_out": self.shard_out,
            "night": self.night,
        }

    @model_validator(mode="after")
    def _check(self) -> NightlySettings:
        """Flags that do not go together, or out of range: one line each, in the order they were always checked."""
        shard, launch = self.shard, self.launch
        if self.shards is not None and not 1 <= self.shards <= MAX_SHARDS:  # N-P3: 10^6 shards never finished
            raise UsageError(f"--shards {self.shards}: give 1 to {MAX_SHARDS} (one machine each)")
        if launch is not None and launch not in LAUNCHERS:
            raise UsageError(f"unknown --launch {launch!r}; choose from: {', '.join(LAUNCHERS)}")
        if self.merge and (self.dry_run or launch or shard is not None or self.print_what):
            raise UsageError("--merge goes alone (with --asv-config and --out): it merges shards that have run")
        if shard is None and (self.shard_plan is not None or self.shard_out is not None or self.night is not None):
            raise UsageError("--shard-plan, --shard-out and --night go with --shard I (one shard of the night, here)")
        if self.shards is not None and shard is None and not self.dry_run and launch is None:
            raise UsageError(
                "--shards N goes with --dry-run (print them), --launch sky (rent them) or --shard I (run one)"
            )
        if shard is not None and (self.shards is None and self.shard_plan is None):
            raise UsageError("--shard needs --shards N (or the launcher's --shard-plan FILE)")
        if shard is not None and (self.dry_run or launch):
            raise UsageError(
                "--shard runs one shard here; drop --dry-run and --launch (`--dry-run --shards N` prints all)"
            )
        if self.wait is not None and (launch is None or self.wait <= 0):
            raise UsageError(f"--wait {self.wait:g} needs --launch and a number of minutes above 0")
        if self.bucket is not None:
            from kvbench.orchestration.nightly.config import BUCKET

            if launch is None:
                raise UsageError("--bucket goes with --launch (the config's [fleet] bucket otherwise)")
            if not BUCKET.match(self.bucket):
                raise UsageError(
                    f"--bucket {self.bucket!r} is not a bucket URL; give s3://NAME[/prefix] or gs://NAME[/prefix]"
                )
        if self.yes and launch is None:
            raise UsageError("--yes confirms a --launch over the config's [fleet] budget; there is no launch here")
        return self
