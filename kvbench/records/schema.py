"""The run record's types: the typed summary of one `kvbench run`, schema `kvbench.run/2`, and the vocabularies
its readers share (statuses, phase kinds, evaluation conditions, which headline numbers measure speed).

Defined once, here, with pydantic; docs/hooks.py generates the record's documentation from these classes (their
docstrings and trailing field comments). Writing and reading are in storage.py, v1 upgrade in migrate.py.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from kvbench.records import blocks
from kvbench.records.findings import FindingKind, parse_kind

SCHEMA = "kvbench.run/2"
SCHEMA_V1 = "kvbench.run/1"
SCHEMAS = (SCHEMA_V1, SCHEMA)


# -- statuses and phase kinds: one vocabulary each -------------------------------------------------------


class RunStatus(StrEnum):
    RUNNING = "running"
    COMPLETE = "complete"  # every dtype ok (or recorded as unsupported)
    PARTIAL = "partial"  # some dtype failed, some did not
    FAILED = "failed"  # no dtype produced a complete result
    INTERRUPTED = "interrupted"  # stopped by a signal or a deadline; what was measured is kept


class DtypeStatus(StrEnum):
    RUNNING = "running"
    OK = "ok"
    PARTIAL = "partial"  # some phases measured, then it failed (engine died, server hung, interrupted)
    FAILED = "failed"  # nothing measured
    UNSUPPORTED = "unsupported"  # the installed vLLM does not accept it: recorded, not run


class PhaseKind(StrEnum):
    SLO_PROBE = "slo_probe"  # one probe of the SLO search
    SWEEP = "sweep"  # one point of the concurrency ladder (the trade-off curve)
    FIXED = "fixed"  # a fixed-load phase (--concurrency / --rate), `repeat` times


class StopReason(StrEnum):
    SIGNAL = "signal"  # Ctrl-C or SIGTERM
    DEADLINE = "deadline"  # the caller's time budget (the nightly's max_minutes)


def measured_anything(result: DtypeResult) -> bool:
    """Whether a dtype that stopped kept a measurement (a load phase, or an eval condition: the eval runs before
    the fixed loads), so it ends PARTIAL, not FAILED (issue 42: an interrupted fidelity read "failed" beside six
    eval conditions)."""
    return bool(result.phases) or any(k != "error" for k in (result.eval or {}))


def derive_status(statuses: list[DtypeStatus], stopped: bool) -> RunStatus:
    """The run's status from its dtypes' (the one place it is decided)."""
    if stopped:
        return RunStatus.INTERRUPTED
    if set(statuses) <= {DtypeStatus.OK, DtypeStatus.UNSUPPORTED} and DtypeStatus.OK in statuses:
        return RunStatus.COMPLETE
    if DtypeStatus.OK in statuses or DtypeStatus.PARTIAL in statuses:
        return RunStatus.PARTIAL
    return RunStatus.FAILED


# -- the types -------------------------------------------------------------------------------------------


class _Model(BaseModel):
    # Unknown keys are kept (a newer kvbench may add some); known ones must have the right type and range.
    model_config = ConfigDict(
        extra="allow", populate_by_name=True, allow_inf_nan=False, use_enum_values=False, validate_assignment=True
    )


class Distribution(_Model):
    """A latency sample in ms: count, mean, percentiles (numpy linear), spread; None when empty."""

    n: int = Field(0, ge=0)
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None

    def get(self, key: str, default=None):
        """Dict-style access, as the SLO reads summaries (kvbench.harness.run.slo.SLO.check)."""
        return getattr(self, key, default)


class PhaseSummary(_Model):
    """kvbench.harness.client.metrics.RunSummary as stored (its field docs hold the definitions)."""

    completed: int = Field(0, ge=0)
    failed: int = Field(0, ge=0)
    not_sent: int = Field(0, ge=0)
    duration_s: float | None = Field(None, ge=0)
    ttft_ms: Distribution = Field(default_factory=Distribution)
    tpot_ms: Distribution = Field(default_factory=Distribution)
    itl_ms: Distribution = Field(default_factory=Distribution)
    itl_chunk_ms: Distribution = Field(default_factory=Distribution)
    e2e_ms: Distribution = Field(default_factory=Distribution)
    schedule_lag_ms: Distribution = Field(default_factory=Distribution)
    e2e_from_intended_ms: Distribution = Field(default_factory=Distribution)
    request_throughput_rps: float | None = Field(None, ge=0)
    output_throughput_tps: float | None = Field(None, ge=0)
    total_token_throughput_tps: float | None = Field(None, ge=0)
    goodput_rps: float | None = Field(None, ge=0)
    goodput_fraction: float | None = Field(None, ge=0, le=1)
    good_requests: int | None = Field(None, ge=0)
    failure_reasons: dict[str, int] = Field(default_factory=dict)
    client_runqueue_wait_fraction: float | None = None
    client_policy: str | None = None

    @property
    def all_failed(self) -> bool:
        return self.completed == 0


class Phase(_Model):
    name: str
    kind: PhaseKind
    concurrency: int | None = Field(None, ge=1)  # closed loop: requests kept in flight
    rate_rps: float | None = Field(None, gt=0)  # open loop (None with concurrency, or for an infinite rate)
    mode: dict[str, Any] = Field(default_factory=dict)  # the scheduler's own description
    summary: PhaseSummary
    requests: int = Field(0, ge=0)  # rows of this phase in the requests Parquet
    repeat: int = Field(0, ge=0)  # which repetition of its load (fixed phases with --repeat)
    started_s: float | None = None  # perf_counter() at the phase's origin (the NVML samples' clock)
    energy: dict[str, Any] | None = None  # kvbench.harness.server.energy.Energy over the phase
    canaries: dict[str, Any] | None = None  # at-rest greedy outputs re-sent during the phase (harness/agreement)
    prefix_cache: dict[str, Any] | None = None  # fixed phases: vLLM's prefix-cache hits, preemptions, TTFT hit/miss


class EngineCapacityRecord(_Model):
    """What vLLM itself reported (its log, or /metrics for a server kvbench did not start)."""

    device: str | None = None
    kv_tokens: int = Field(ge=1)
    max_concurrency: float | None = Field(None, ge=0)
    tokens_per_request: int | None = Field(None, ge=1)
    source: str | None = None  # "log" or "metrics"
    kv_cache_gib: float | None = Field(None, ge=0)  # the log rounds to 0.01 GiB: a small budget reads 0.00
    num_blocks: int | None = Field(None, ge=1)
    block_size: int | None = Field(None, ge=1)
    cache_dtype: str | None = None


class ModelCapacity(_Model):
    """kvbench's capacity model for the engine's own budget, block size and context."""

    kv_tokens: int = Field(ge=0)
    max_concurrency: float = Field(ge=0)
    num_blocks: int = Field(ge=0)
    budget_bytes: int = Field(ge=1)
    block_size: int = Field(ge=1)
    context: int = Field(ge=1)
    format: str
    gpu: str | None = None
    activation_overhead_bytes: int | None = None


class MeasuredCapacity(_Model):
    """The SLO search's answer: the highest concurrency whose P95s met the objective."""

    max_concurrency: int = Field(ge=0)
    capped: bool
    cap: int = Field(ge=1)
    slo: dict[str, float | None] = Field(default_factory=dict)
    probes: list[dict[str, Any]] = Field(default_factory=list)


class Capacity(_Model):
    engine: EngineCapacityRecord | None = None
    model: ModelCapacity | None = None
    measured: MeasuredCapacity | None = None
    model_note: str | None = None  # why there is no model prediction, when there is none
    # variable-length workloads: the capacity model at the workload's mean / P90 / P99 sequence length
    distribution: dict[str, Any] | None = None
    # on a GPU: kvbench.specs.vllm_memory's predicted non-KV terms beside the server log's (weights, activations, ...)
    non_kv: dict[str, Any] | None = None


class ServerInfo(_Model):
    """What the server is, as it said before any load (and, for a server kvbench started, how it started)."""

    managed: bool  # started by kvbench (else an --endpoint)
    base_url: str | None = None  # never with credentials (see redact_url)
    ready_after_s: float | None = Field(None, ge=0)
    served_model: str | None = None  # /v1/models id
    model_root: str | None = None  # /v1/models root: the path or HF id it loaded
    max_model_len: int | None = Field(None, ge=1)
    vllm_version: str | None = None  # /version
    cache_dtype: str | None = None  # vllm:cache_config_info's cache_dtype; None: the server does not say
    block_size: int | None = Field(None, ge=1)
    num_gpu_blocks: int | None = Field(None, ge=0)


class Agreement(_Model):
    """Greedy outputs vs auto (harness/quality/agreement.py); the samples themselves are in the requests Parquet."""

    prompts: int = Field(0, ge=0)
    prompt_tokens: int | None = Field(None, ge=1)
    tokens: int | None = Field(None, ge=1)
    vs_auto: dict[str, Any] | None = None
    error: str | None = None


class TelemetrySummary(_Model):
    available: bool = False
    reason: str | None = None
    interval_s: float | None = None
    samples: int = Field(0, ge=0)  # rows in the series Parquet (source "nvml")


class MetricsRecord(_Model):
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    during: int = Field(0, ge=0)  # scrapes in the series Parquet (source "metrics")


class DtypeResult(_Model):
    kv_cache_dtype: str
    status: DtypeStatus = DtypeStatus.RUNNING
    error: str | None = None
    log_path: str | None = None
    log_tail: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    # True: the server said it runs this dtype; False: it said another (a managed run records it, an endpoint
    # run refuses it); None: it did not say (no "not honoured" finding is drawn from its capacity).
    kv_dtype_confirmed: bool | None = None
    server: ServerInfo | None = None
    capacity: Capacity = Field(default_factory=Capacity)
    phases: list[Phase] = Field(default_factory=list)
    metrics: MetricsRecord = Field(default_factory=MetricsRecord)
    telemetry: TelemetrySummary = Field(default_factory=TelemetrySummary)
    agreement: Agreement | None = None
    fixed_stats: dict[str, Stat] | None = None  # headline metrics over the repeats of the first fixed load
    # task accuracy by condition (rest / load / during_load): harness/quality/underload.py; items in the evals Parquet.
    # Checked as records/blocks.py's Condition (counts, intervals, the sequential looks) and kept as stored.
    eval: Annotated[dict[str, Any] | None, AfterValidator(blocks.check_eval)] = None
    # fidelity per token by condition ("rest", "load"; auto's "load" is the floor): harness/quality/fidelity.py,
    # kvbench/core/fidelity_stats.py; items in the fidelity Parquet. Checked as records/blocks.FidelityCondition.
    fidelity: Annotated[dict[str, Any] | None, AfterValidator(blocks.check_fidelity)] = None
    front: Front | None = None
    # True where the dtype ran through an emulation that stores the real format but computes differently
    # from a GPU (kvbench's CPU NVFP4 backend): its capacity, admission, prefix caching and accuracy count;
    # its speed numbers (SPEED_FIELDS, the front, cost, energy) are kept but never compared or tracked.
    emulated: bool = False
    # what served the dtype when it was not the installed vLLM's own code: {"name", "version", "why", ...}
    implementation: dict[str, Any] | None = None
    # where the cache's scales came from (harness/server/scales.py): {"variant", "source" (none / unit / checkpoint /
    # dynamic), "why", "checkpoint" (its k/v scales), "log" (vLLM's own lines), "problems", "calibration"}
    scales: dict[str, Any] | None = None

    def phase(self, kind: PhaseKind) -> Phase | None:
        """The first phase of a kind (for FIXED: the headline load)."""
        return next((p for p in self.phases if p.kind == kind), None)


class Stat(_Model):
    """One headline metric over the repeats of a fixed load: mean and a 95% t interval."""

    n: int = Field(ge=1)
    mean: float
    std: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    values: list[float] = Field(default_factory=list)


class FrontPoint(_Model):
    """One point of a front (kvbench.core.front.Point as stored): finite, and no negative throughput, so a
    damaged record cannot size a deployment (plan --from-run) from NaN or -5 tokens/s."""

    concurrency: int | float | None = Field(None, gt=0)  # interpolated (a float) in at_target
    output_tps_per_gpu: float | None = Field(None, ge=0)
    total_tps_per_gpu: float | None = Field(None, ge=0)
    user_tps: float | None = Field(None, gt=0)
    user_tps_e2e: float | None = Field(None, ge=0)
    ttft_p50_ms: float | None = Field(None, ge=0)
    ttft_p95_ms: float | None = Field(None, ge=0)
    tpot_p50_ms: float | None = Field(None, ge=0)
    tpot_p95_ms: float | None = Field(None, ge=0)
    goodput_rps: float | None = Field(None, ge=0)
    usd_per_m_output: float | None = Field(None, ge=0)
    usd_per_m_total: float | None = Field(None, ge=0)

    def items(self):
        """Dict-style, as front.Point(**...) readers take it."""
        return self.model_dump().items()

    def get(self, key: str, default=None):
        return getattr(self, key, default)


class Front(_Model):
    """The trade-off curve of one dtype (kvbench.core.front): every closed-loop point, which are on the
    Pareto front, and the cost where prices were given."""

    gpus: int = Field(ge=1)
    price_per_gpu_hour: float | None = Field(None, ge=0)
    price_key: str | None = None  # which --price-per-hour entry priced it (a GPU catalog key, or "cpu")
    points: list[FrontPoint] = Field(default_factory=list)
    at_slo: FrontPoint | None = None  # the best measured point that met the SLO
    at_target: FrontPoint | None = None  # interpolated along the front at target_user_tps
    target_user_tps: float | None = Field(None, gt=0)


class Finding(_Model):
    level: str
    text: str
    dtype: str | None = None
    kind: FindingKind = FindingKind.OTHER  # what readers switch on (kvbench/records/findings.py), never the text

    @model_validator(mode="before")
    @classmethod
    def _kind(cls, data):
        if isinstance(data, dict):  # a record from before kinds gets one from what the finding holds
            data = {**data, "kind": parse_kind(data)}
        return data


class Stop(_Model):
    reason: StopReason
    detail: str


class SamplesRef(_Model):
    """The Parquet files beside the summary (names relative to it) and how many rows each holds."""

    requests: str | None = None
    series: str | None = None
    evals: str | None = None
    request_rows: int = Field(0, ge=0)
    series_rows: int = Field(0, ge=0)
    eval_rows: int = Field(0, ge=0)
    fidelity: str | None = None
    fidelity_rows: int = Field(0, ge=0)


class RunRecord(_Model):
    schema_: str = Field(SCHEMA, alias="schema")
    run_id: str
    created_at: str
    finished_at: str | None = None
    status: RunStatus = RunStatus.RUNNING
    machine: str
    config: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    dtypes: list[DtypeResult] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    stopped: Stop | None = None
    samples: SamplesRef | None = None
    definitions: dict[str, str] = Field(default_factory=dict)  # what each latency metric means
    comparisons: list[dict[str, Any]] = Field(default_factory=list)  # each dtype vs auto: paired CIs, cost
    quality: dict[str, Any] | None = None  # the quality gate per dtype and the recommendation it allows
    # a real model's origin (kvbench/realmodels, its folder's provenance.json): package, version, the GGUF's
    # sha256, what the weights are ("Q4_1 weights dequantized to bf16"); None for any other model
    model_provenance: dict[str, Any] | None = None

    @field_validator("created_at", "finished_at")
    @classmethod
    def _iso(cls, value):
        if value is not None:
            datetime.fromisoformat(value)  # raises ValueError on garbage
        return value

    @model_validator(mode="after")
    def _consistent(self):
        """What only the whole record can check: paired counts against auto's, looks against the run's policy."""
        why = blocks.check_record(self.dtypes, self.config, self.environment)
        if why:
            raise PydanticCustomError("damaged_block", "{detail}", {"detail": why})
        return self

    def dtype(self, name: str) -> DtypeResult | None:
        return next((d for d in self.dtypes if d.kv_cache_dtype == name), None)

    def as_doc(self) -> dict:
        """The plain JSON document (what is written and what dict-based readers get)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)


# -- shared vocabularies of the record's readers -----------------------------------------------------------------


# Headline numbers that measure speed (latency, throughput, and the SLO-measured concurrency, which latency
# decides): for an emulated dtype they describe the emulation, not the format, so claims, regress, the asv
# series and the recommendation's speed ranking never use them (representative()).
SPEED_FIELDS = frozenset(
    {
        "measured_max_concurrency",
        "ttft_p50_ms",
        "ttft_p95_ms",
        "tpot_p50_ms",
        "tpot_p95_ms",
        "itl_p95_ms",
        "e2e_p95_ms",
        "request_throughput_rps",
        "output_throughput_tps",
        "goodput_rps",
    }
)
EMULATED_SPEED_REASON = (
    "emulated: speed of kvbench's CPU emulated KV backend (torch quantization on write, attention in the model "
    "dtype over a decoded copy; none of the format's memory-traffic saving), not what a GPU shows"
)


# The conditions a dtype's `eval` is measured in (harness/quality/evalphase.py), in order, with what each is called
# wherever it is shown; `eval` may also hold an `error`.
CONDITIONS = {
    "rest": "at rest",
    "load": "at load",
    "batched": "batched",
    "mixed": "mixed steps",
    "prefix": "prefix-cache hit",
    "during_load": "during load",
}
