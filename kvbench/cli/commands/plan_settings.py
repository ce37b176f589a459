"""Every setting of `kvbench plan`, declared once: its flag, default, check and help (kvbench/core/flags.py's Flag,
shared options from kvbench/specs/options.py; the command line is generated from the fields by
kvbench/cli/clisettings.py). The sizing settings it shares with `kvbench capacity` come from
kvbench/cli/commands/capacity_settings.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvbench.cli.commands.capacity_settings import (
    SIZING_KV_DTYPES,
    BatchedTokens,
    KvBudgetGb,
    MemoryBasis,
    OverheadGb,
    PipelineParallel,
    SizingKvDtypes,
    Utilization,
    VllmVersion,
    Weights,
    check_sizing,
)
from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag
from kvbench.specs.formats import tracked_dtypes
from kvbench.specs.options import AsJson, Model
from kvbench.specs.plan import TP_SIZES


class PlanSettings(BaseModel):
    """What one `kvbench plan` is asked to do; the fields are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    users: Annotated[int, Flag("--users", "-u")] = Field(description="Concurrent sequences to serve.")
    model: Model = Field(None, description="Short name or a config.json path (not with --from-run).")
    context: Annotated[int | None, Flag("--context", "-c")] = Field(
        None, description="Tokens per sequence (not with --from-run)."
    )
    from_run: Annotated[Path | None, Flag("--from-run")] = Field(
        None,
        description="Size from a run record's measured throughput/interactivity front instead of the capacity model.",
    )
    user_tps: Annotated[float | None, Flag("--user-tps")] = Field(
        None,
        description=(
            "With --from-run: the interactivity each user gets, tokens/s (default: the best point under the run's SLO)."
        ),
    )
    gpus: Annotated[str, Flag("--gpus")] = Field(
        "a100-80gb,h100-sxm,h200", description="Comma-separated GPU keys to compare."
    )
    kv_dtype: SizingKvDtypes = Field(",".join(tracked_dtypes()), description=SIZING_KV_DTYPES)
    price_per_hour: Annotated[str | None, Flag("--price-per-hour")] = Field(
        None, description="USD per GPU-hour, e.g. h100-sxm=2.65,h200=3.5."
    )
    kv_budget_gb: KvBudgetGb = None
    gpu_memory_utilization: Utilization = None
    overhead_gb: OverheadGb = None
    memory_basis: MemoryBasis = "device"
    max_num_seqs: Annotated[int | None, Flag("--max-num-seqs")] = Field(
        None, description="vLLM's cap on running sequences (default: vLLM's default for each GPU)."
    )
    tensor_parallel_size: Annotated[int | None, Flag("--tensor-parallel-size")] = Field(
        None, description=f"Fix the TP size (default: try {', '.join(map(str, TP_SIZES))})."
    )
    pipeline_parallel_size: PipelineParallel = 1
    weights: Weights = "auto"
    vllm_version: VllmVersion = None
    max_num_batched_tokens: BatchedTokens = None
    as_json: AsJson = Field(description="Print JSON instead of a table.")

    @model_validator(mode="after")
    def _check(self) -> PlanSettings:
        """The flag checks, in the order the command always made them (the first wrong flag is the one named)."""
        from kvbench.core import cliargs

        if self.from_run is not None:
            cliargs.at_least_one(self.users, "--users")
            cliargs.positive(self.user_tps, "--user-tps", "tokens/s per user")
            return self
        if self.model is None or self.context is None:
            raise UsageError("give --model and --context (or --from-run RUN.json to size from a measured front)")
        if self.users <= 0 or self.context <= 0:
            raise UsageError(f"--users and --context must be positive, got {self.users} and {self.context}")
        if self.kv_budget_gb is not None and self.gpu_memory_utilization is not None:
            raise UsageError("give either --kv-budget-gb or --gpu-memory-utilization, not both")
        if self.memory_basis != "device":
            raise UsageError(
                "kvbench plan sizes with the device-reported memory; --memory-basis spec is for `kvbench capacity`"
            )
        check_sizing(self, 1 if self.tensor_parallel_size is None else self.tensor_parallel_size)
        return self
