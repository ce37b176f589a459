"""Every setting of `kvbench capacity`, declared once: its flag, default, check and help (harness/settings.py's
Flag; the command line is generated from the fields by kvbench/clisettings.py). The sizing settings that
`kvbench plan` shares are declared here once, as Annotated types both models use."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

from kvbench.errors import UsageError
from kvbench.harness.settings import Flag
from kvbench.vllm_memory import known_versions
from kvbench.weights import WEIGHT_CHOICES

# -- the sizing settings `capacity` and `plan` share ------------------------------------------------------------
KvDtypes = Annotated[
    str,
    Flag("--kv-dtype"),
    Field(description="Comma-separated KV-cache dtypes: auto (model dtype), fp8, fp8_e5m2, nvfp4, mxfp4."),
]
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
    """One-line error unless `value` is a finite number in range (None means: not given); kvbench.cliargs's rule."""
    from kvbench import cliargs

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
