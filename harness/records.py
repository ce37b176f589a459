"""Run records: the typed summary of one `kvbench run` (JSON, committed) and its samples (Parquet, not).

Layout, beside that machine's asv results (copying a machine's folder carries everything it measured):
    results/<machine>/runs/<run_id>.json               the summary, schema `kvbench.run/2` (this module's types)
    results/<machine>/runs/<run_id>.requests.parquet   one row per request: every timing, chunk arrivals, errors;
                                                       agreement requests too (prompt and output token ids)
    results/<machine>/runs/<run_id>.series.parquet     time series in long form: /metrics at 1 Hz, NVML at 10 Hz
    results/<machine>/runs/<run_id>.evals.parquet      every lm-eval item per dtype and condition (rest, load, ...)
Both Parquet files are zstd-compressed and named in the summary's `samples` block. DuckDB reads the whole
folder as one table: `SELECT * FROM 'results/*/runs/*.requests.parquet'`.

The summary is small enough to commit (a CPU-default run is well under 200 KB); the samples are what a night
keeps as CI artifacts. Everything that reads records (`report`, `compare`, `claims`, `history`, `regress`,
the dashboards) needs only the summary.

Readers accept `kvbench.run/1` (one JSON with every request inside) and `kvbench.run/2`. A v1 record is
upgraded on load to the v2 shape; its embedded requests stay readable through `samples_frame`.
Every record is validated on load: a damaged one is named with its path and the first bad field, never
half-believed.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvbench.datafiles import read_json
from kvbench.errors import UsageError
from kvbench.harness.findings import FindingKind, parse_kind
from kvbench.output import jsonable
from kvbench.scrub import scrub_doc, scrub_table

SCHEMA = "kvbench.run/2"
SCHEMA_V1 = "kvbench.run/1"
SCHEMAS = (SCHEMA_V1, SCHEMA)
RUNS_DIR = "runs"
REQUESTS_SUFFIX = ".requests.parquet"
SERIES_SUFFIX = ".series.parquet"
EVALS_SUFFIX = ".evals.parquet"
PROBE_BYTES = 64 << 10  # what check_writable writes (and removes) to find a full disk before measuring


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
        """Dict-style access, as the SLO reads summaries (kvbench.harness.slo.SLO.check)."""
        return getattr(self, key, default)


class PhaseSummary(_Model):
    """kvbench.harness.metrics.RunSummary as stored (its field docs hold the definitions)."""

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
    energy: dict[str, Any] | None = None  # kvbench.harness.energy.Energy over the phase
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
    # on a GPU: kvbench.vllm_memory's predicted non-KV terms beside the server log's (weights, activations, ...)
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
    """Greedy outputs vs auto (harness/agreement.py); the samples themselves are in the requests Parquet."""

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
    # task accuracy by condition (rest / load / during_load): harness/quality.py; items in the evals Parquet
    eval: dict[str, Any] | None = None
    front: Front | None = None
    # True where the dtype ran through an emulation that stores the real format but computes differently
    # from a GPU (kvbench's CPU NVFP4 backend): its capacity, admission, prefix caching and accuracy count;
    # its speed numbers (SPEED_FIELDS, the front, cost, energy) are kept but never compared or tracked.
    emulated: bool = False
    # what served the dtype when it was not the installed vLLM's own code: {"name", "version", "why", ...}
    implementation: dict[str, Any] | None = None

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
    """One point of a front (kvbench.front.Point as stored): finite, and no negative throughput, so a
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
    """The trade-off curve of one dtype (kvbench.front): every closed-loop point, which are on the
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
    kind: FindingKind = FindingKind.OTHER  # what readers switch on (harness/findings.py), never the text

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

    @field_validator("created_at", "finished_at")
    @classmethod
    def _iso(cls, value):
        if value is not None:
            datetime.fromisoformat(value)  # raises ValueError on garbage
        return value

    def dtype(self, name: str) -> DtypeResult | None:
        return next((d for d in self.dtypes if d.kv_cache_dtype == name), None)

    def as_doc(self) -> dict:
        """The plain JSON document (what is written and what dict-based readers get)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)


# -- names and paths --------------------------------------------------------------------------------------


def new_run_id(machine: str, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{machine}-{secrets.token_hex(3)}"


def utc_now() -> datetime:
    """Now, in UTC (every record's clock for dates; durations use time.perf_counter)."""
    return datetime.now(UTC)


def utc_iso(when: datetime | None = None) -> str:
    """ISO 8601 to the second, as records store dates."""
    return (when or utc_now()).isoformat(timespec="seconds")


def record_path(results_dir: Path, machine: str, run_id: str) -> Path:
    return Path(results_dir) / machine / RUNS_DIR / f"{run_id}.json"


def samples_paths(path: Path) -> tuple[Path, Path, Path]:
    """(requests, series, evals) Parquet paths beside a record."""
    stem = Path(path).name.removesuffix(".json")
    return (
        path.with_name(stem + REQUESTS_SUFFIX),
        path.with_name(stem + SERIES_SUFFIX),
        path.with_name(stem + EVALS_SUFFIX),
    )


def check_writable(results_dir: Path, machine: str) -> Path:
    """Make sure records can be written under results_dir/<machine>/runs before anything is measured: create
    the folder and a probe file, remove the probe (and any folder this created, if it fails). One line if not."""
    target = Path(results_dir) / machine / RUNS_DIR
    created = []
    probe = None
    try:
        for parent in reversed([target, *target.parents]):
            if not parent.exists():
                parent.mkdir()
                created.append(parent)
        fd, probe = tempfile.mkstemp(prefix=".kvbench-probe-", dir=target)
        try:
            os.write(fd, bytes(PROBE_BYTES))  # an empty probe passes on a full disk; bytes do not
        finally:
            os.close(fd)
        return target
    except OSError as exc:
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:
                pass
        raise UsageError(
            f"--results {results_dir}: cannot write run records to {target} ({exc.strerror or exc}); "
            "give a writable folder"
        ) from None
    finally:
        if probe:
            Path(probe).unlink(missing_ok=True)


# -- writing ----------------------------------------------------------------------------------------------


def _micro(obj):
    """Floats to 6 decimals: times are seconds, so that is 1 µs."""
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: _micro(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_micro(v) for v in obj]
    return obj


def _replace_atomic(path: Path, write) -> Path:
    """Write through a temp file in the same folder, fsync, rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; records are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_atomic(path: Path, doc: dict) -> Path:
    """A JSON document, compact, floats to 1 µs, every string scrubbed of credentials, written atomically."""
    text = json.dumps(_micro(scrub_doc(jsonable(doc))), separators=(",", ":")) + "\n"
    return _replace_atomic(path, lambda fh: fh.write(text.encode()))


def write_record(path: Path, record: RunRecord, samples: SampleStore | None = None) -> Path:
    """The samples first (so the summary never names a file that is not there yet), then the summary."""
    if samples is not None:
        record.samples = samples.write(path)
    return write_atomic(path, record.as_doc())


# -- samples (Parquet) --------------------------------------------------------------------------------------


def _request_schema():
    import pyarrow as pa

    f64, i64 = pa.float64(), pa.int64()
    return pa.schema(
        [
            ("run_id", pa.string()),
            ("kv_cache_dtype", pa.string()),
            ("phase", pa.string()),
            ("phase_kind", pa.string()),
            ("phase_index", i64),
            ("warmup", pa.bool_()),
            ("index", i64),
            ("request_id", pa.string()),
            ("requested_output_tokens", i64),
            ("expected_prompt_tokens", i64),
            ("intended_send_s", f64),
            ("sent_s", f64),
            ("response_s", f64),
            ("first_chunk_s", f64),
            ("ttft_s", f64),
            ("e2e_s", f64),
            ("end_s", f64),
            ("schedule_lag_s", f64),
            ("chunk_arrivals_s", pa.list_(f64)),
            ("chunk_tokens", pa.list_(i64)),
            ("prompt_tokens", i64),
            ("completion_tokens", i64),
            ("finish_reason", pa.string()),
            ("ok", pa.bool_()),
            ("error_kind", pa.string()),
            ("error", pa.string()),
            ("http_status", i64),
            # agreement requests (phase "agreement"): the greedy sample and the teacher-forced scores vs auto
            ("prompt_ids", pa.list_(i64)),
            ("output_ids", pa.list_(i64)),
            ("logprobs", pa.list_(f64)),
            ("teacher_forced_logprobs", pa.list_(f64)),
        ]
    )


def _series_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("run_id", pa.string()),
            ("kv_cache_dtype", pa.string()),
            ("source", pa.string()),
            ("t", pa.float64()),
            ("gpu", pa.int64()),
            ("name", pa.string()),
            ("value", pa.float64()),
        ]
    )


def _eval_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("run_id", pa.string()),
            ("kv_cache_dtype", pa.string()),
            ("condition", pa.string()),
            ("concurrency", pa.int64()),
            ("task", pa.string()),
            ("doc_id", pa.int64()),
            ("prompt_sha256", pa.string()),
            ("target", pa.string()),
            ("response", pa.string()),
            ("filtered", pa.string()),
            ("score", pa.float64()),
        ]
    )


def _finite(v):
    return v if not (isinstance(v, float) and not math.isfinite(v)) else None


class SampleStore:
    """The rows that go to Parquet: every request of every phase, and the /metrics and NVML series."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.requests: list[dict] = []
        self.series: list[dict] = []
        self.evals: list[dict] = []

    def add_eval(self, dtype: str, condition: str, concurrency: int, result) -> None:
        """Every item of an lm-eval run (kvbench.harness.evaluation.EvalResult)."""
        for task, tr in result.tasks.items():
            for it in tr.items:
                self.evals.append(
                    {
                        "run_id": self.run_id,
                        "kv_cache_dtype": dtype,
                        "condition": condition,
                        "concurrency": concurrency,
                        "task": task,
                        "doc_id": it.doc_id,
                        "prompt_sha256": it.prompt_sha256,
                        "target": it.target,
                        "response": it.response,
                        "filtered": it.filtered,
                        "score": it.score,
                    }
                )

    def add_requests(self, dtype: str, phase: str, kind: str, phase_index: int, results, warmup: bool = False) -> int:
        names = _request_schema().names
        for r in results:
            row = {k: v for k, v in r.as_dict().items() if k in names}
            row.update(
                run_id=self.run_id,
                kv_cache_dtype=dtype,
                phase=phase,
                phase_kind=kind,
                phase_index=phase_index,
                warmup=warmup,
            )
            self.requests.append(row)
        return len(results)

    def add_agreement(self, dtype: str, samples: list[dict], teacher_forced: list[list[float]] | None) -> None:
        for i, s in enumerate(samples):
            self.requests.append(
                {
                    "run_id": self.run_id,
                    "kv_cache_dtype": dtype,
                    "phase": "agreement",
                    "phase_kind": "agreement",
                    "phase_index": -1,
                    "warmup": False,
                    "index": i,
                    "ok": True,
                    "prompt_ids": s["prompt"],
                    "output_ids": s["tokens"],
                    "logprobs": s["logprobs"],
                    "teacher_forced_logprobs": teacher_forced[i] if teacher_forced is not None else None,
                }
            )

    def add_metrics(self, dtype: str, snapshots) -> int:
        for snap in snapshots:
            for name, value in snap.values.items():
                self.series.append(
                    {
                        "run_id": self.run_id,
                        "kv_cache_dtype": dtype,
                        "source": "metrics",
                        "t": snap.t,
                        "gpu": None,
                        "name": name,
                        "value": _finite(float(value)),
                    }
                )
        return len(snapshots)

    def add_telemetry(self, dtype: str, telemetry) -> int:
        fields = list(telemetry.fields)
        for row in telemetry.samples:
            sample = dict(zip(fields, row, strict=False))
            for name in fields[2:]:
                self.series.append(
                    {
                        "run_id": self.run_id,
                        "kv_cache_dtype": dtype,
                        "source": "nvml",
                        "t": sample["t"],
                        "gpu": int(sample["gpu"]),
                        "name": name,
                        "value": _finite(float(sample[name])),
                    }
                )
        return len(telemetry.samples)

    def write(self, record_file: Path) -> SamplesRef:
        import pyarrow as pa
        import pyarrow.parquet as pq

        requests_path, series_path, evals_path = samples_paths(Path(record_file))
        ref = SamplesRef(request_rows=len(self.requests), series_rows=len(self.series), eval_rows=len(self.evals))
        for rows, schema, path, attr in (
            (self.requests, _request_schema(), requests_path, "requests"),
            (self.series, _series_schema(), series_path, "series"),
            (self.evals, _eval_schema(), evals_path, "evals"),
        ):
            if not rows:
                continue
            table = scrub_table(
                pa.Table.from_pylist([{k: _finite(row.get(k)) for k in schema.names} for row in rows], schema=schema)
            )
            _replace_atomic(path, lambda fh, table=table: pq.write_table(table, fh, compression="zstd"))
            setattr(ref, attr, path.name)
        return ref


# -- reading -----------------------------------------------------------------------------------------------


def _upgrade_v1(doc: dict) -> dict:
    """A kvbench.run/1 document in the v2 shape (requests stay where they were, for samples_frame)."""
    doc = dict(doc)
    doc["schema"] = SCHEMA_V1
    definitions = {}
    dtypes = []
    for d in doc.get("dtypes") or []:
        if not isinstance(d, dict):
            raise ValueError("dtypes: each entry must be an object")
        d = dict(d)
        phases = []
        for p in d.get("phases") or []:
            p = dict(p)
            name = str(p.get("name") or "")
            summary = dict(p.get("summary") or {})
            definitions = summary.pop("definitions", None) or definitions
            mode = p.get("mode") or {}
            rate = mode.get("rate_rps")
            phases.append(
                {
                    "name": name,
                    "kind": PhaseKind.SLO_PROBE if name.startswith("slo-c") else PhaseKind.FIXED,
                    "concurrency": mode.get("concurrency"),
                    "rate_rps": rate if isinstance(rate, (int, float)) else None,
                    "mode": mode,
                    "summary": summary,
                    "requests": len(p.get("requests") or []),
                }
            )
        d["phases"] = phases
        metrics = d.get("metrics") or {}
        during = metrics.get("during")
        d["metrics"] = {
            "before": metrics.get("before"),
            "after": metrics.get("after"),
            "during": len(during) if isinstance(during, list) else 0,
        }
        tel = d.get("telemetry") or {}
        samples = tel.get("samples")
        d["telemetry"] = {**tel, "samples": len(samples) if isinstance(samples, list) else 0}
        agreement = d.get("agreement")
        if isinstance(agreement, dict):
            d["agreement"] = {
                "prompts": len(agreement.get("samples") or []),
                **{k: agreement.get(k) for k in ("prompt_tokens", "tokens", "vs_auto", "error")},
            }
        server = d.get("server")
        if isinstance(server, dict):
            d["server"] = {"managed": not (doc.get("config") or {}).get("endpoint"), **server}
        d["capacity"] = d.get("capacity") or {}
        dtypes.append(d)
    doc["dtypes"] = dtypes
    doc["definitions"] = definitions
    if doc.get("status") == "running":  # a v1 run killed before it could say so
        doc["status"] = RunStatus.INTERRUPTED
    return doc


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    value = err.get("input")
    shown = repr(value)[:60] if not isinstance(value, (dict, list)) else type(value).__name__
    return f"{where}: {err['msg']} (got {shown})"


def parse_record(doc: Any, path: Path | str = "<record>") -> RunRecord:
    """Validate a record document (v1 or v2) into the v2 types; one-line UsageError when it is not one."""
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith("kvbench.run/"):
        raise UsageError(f"{path}: not a kvbench run record (schema {schema!r}; expected {SCHEMA})")
    if schema not in SCHEMAS:
        raise UsageError(
            f"{path}: record schema {schema} is not supported by this kvbench (reads {', '.join(SCHEMAS)})"
        )
    try:
        if schema == SCHEMA_V1:
            doc = _upgrade_v1(doc)
        return RunRecord.model_validate(doc)
    except ValidationError as exc:
        raise UsageError(f"{path}: damaged run record: {_first_error(exc)}") from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: damaged run record: {exc}") from None


def read_record(path: str | Path) -> RunRecord:
    """The typed record at `path` (v1 or v2), validated."""
    path = Path(path)
    doc = read_json(path, missing=f"run record not found: {path}", bad="not a JSON run record")
    return parse_record(doc, path)


def load_record(path: str | Path) -> dict:
    """The record at `path` as a plain v2-shaped document (validated): what dict-based readers use."""
    doc = read_record(path).as_doc()
    return doc


def find_records(where: str | Path) -> list[Path]:
    """A record file, or every run record under a folder (results/, results/<machine>/, or a runs/ folder)."""
    where = Path(where)
    if where.is_file():
        return [where]
    if not where.is_dir():
        raise UsageError(f"no run records at {where}")
    pattern = "*.json" if where.name == RUNS_DIR else f"{RUNS_DIR}/*.json"
    found = where.glob(pattern) if where.name == RUNS_DIR else where.rglob(pattern)
    return sorted(p for p in found if not p.name.startswith("."))


def read_records(paths: list[Path]) -> tuple[list[tuple[Path, RunRecord]], list[str]]:
    """Every readable record among `paths`, and one line per one that is not (named, never believed)."""
    good, problems = [], []
    for p in paths:
        try:
            good.append((p, read_record(p)))
        except UsageError as exc:
            problems.append(f"skipped {exc}")
    return good, problems


def linked_records(machine_dir: Path, problems: list[str] | None = None) -> list[tuple[str, dict, Path]]:
    """(created_at, record, path) of every readable run record in a machine folder that names an asv
    history point (its `asv` block: commit and env name), oldest first. Unreadable ones are named in
    `problems` when given."""
    out = []
    for path in sorted((Path(machine_dir) / RUNS_DIR).glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            doc = load_record(path)
        except UsageError as exc:
            if problems is not None:
                problems.append(f"skipped {exc}")
            continue
        asv = doc.get("asv")
        if isinstance(asv, dict) and isinstance(asv.get("commit"), str):
            out.append((str(doc.get("created_at") or ""), doc, path))
    return sorted(out, key=lambda item: item[0])


# -- tables ------------------------------------------------------------------------------------------------


def fixed_phase(dtype_result: dict) -> dict | None:
    """The headline fixed-load phase of a dtype result document (the first FIXED phase)."""
    return next((p for p in dtype_result.get("phases") or [] if p.get("kind") == PhaseKind.FIXED), None)


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
    "emulated: speed of kvbench's CPU NVFP4 backend (torch quantization on write, bf16 attention over a decoded "
    "copy; none of NVFP4's 3.56x memory-traffic saving), not what a GPU shows"
)


def representative(numbers: dict, emulated: bool) -> dict:
    """Headline numbers with the speed ones blanked (None) for an emulated dtype."""
    if not emulated:
        return dict(numbers)
    return {k: (None if k in SPEED_FIELDS else v) for k, v in numbers.items()}


def headline(dtype_result: dict) -> dict:
    """The numbers a reader compares across dtypes, from the fixed-load phase and the capacity block."""
    cap = dtype_result.get("capacity") or {}
    engine, model, measured = cap.get("engine") or {}, cap.get("model") or {}, cap.get("measured") or {}
    s = (fixed_phase(dtype_result) or {}).get("summary") or {}
    vs_auto = (dtype_result.get("agreement") or {}).get("vs_auto") or {}
    repeated = dtype_result.get("fixed_stats") or {}

    def stat(metric: str, p: str):
        if f"{metric[:-3]}_{p}_ms" in repeated:  # the mean over the repeats, where there were repeats
            return repeated[f"{metric[:-3]}_{p}_ms"]["mean"]
        return (s.get(metric) or {}).get(p)

    def value(key: str):
        return repeated[key]["mean"] if key in repeated else s.get(key)

    return {
        "engine_kv_tokens": engine.get("kv_tokens"),
        "engine_max_concurrency": engine.get("max_concurrency"),
        "model_kv_tokens": model.get("kv_tokens"),
        "model_max_concurrency": model.get("max_concurrency"),
        "measured_max_concurrency": measured.get("max_concurrency"),
        "ttft_p50_ms": stat("ttft_ms", "p50"),
        "ttft_p95_ms": stat("ttft_ms", "p95"),
        "tpot_p50_ms": stat("tpot_ms", "p50"),
        "tpot_p95_ms": stat("tpot_ms", "p95"),
        "itl_p95_ms": stat("itl_ms", "p95"),
        "e2e_p95_ms": stat("e2e_ms", "p95"),
        "request_throughput_rps": value("request_throughput_rps"),
        "output_throughput_tps": value("output_throughput_tps"),
        "goodput_rps": value("goodput_rps"),
        "completed": s.get("completed"),
        "failed": s.get("failed"),
        "greedy_agreement": vs_auto.get("token_agreement"),
        "logprob_delta_mean": vs_auto.get("logprob_delta_mean"),
        "prefix_hit_rate": _prefix_hit_rate(dtype_result),
        "task_accuracy_rest": _first_task_accuracy(dtype_result, "rest"),
        "task_accuracy_load": _first_task_accuracy(dtype_result, "load"),
    }


def workload_label(cfg: dict) -> str:
    """The traffic a run sent, for titles and tables: the workload spec's kind and parameters, else 'fixed P+O'."""
    spec = cfg.get("workload_spec")
    if spec:
        params = ", ".join(
            f"{k}={v}"
            for k, v in spec.items()
            if k not in ("kind", "name") and v is not None and not isinstance(v, (dict, list))
        )
        return (
            f"{spec.get('kind')} ({spec.get('name') or params})"
            if spec.get("name")
            else f"{spec.get('kind')} ({params})"
        )
    w = cfg.get("workload") or {}
    return f"fixed {w.get('prompt_tokens')}+{w.get('output_tokens')} tokens"


def _prefix_hit_rate(dtype_result: dict) -> float | None:
    """vLLM's prefix-cache hit rate (tokens) over the fixed phases, where the server reported it."""
    q = h = 0.0
    for p in dtype_result.get("phases") or []:
        pc = p.get("prefix_cache") or {}
        if p.get("kind") == PhaseKind.FIXED and pc.get("queries_tokens"):
            q += pc["queries_tokens"]
            h += pc.get("hits_tokens") or 0.0
    return h / q if q else None


# The conditions a dtype's `eval` is measured in (harness/evalphase.py), in order, with what each is called
# wherever it is shown; `eval` may also hold an `error`.
CONDITIONS = {
    "rest": "at rest",
    "load": "at load",
    "batched": "batched",
    "mixed": "mixed steps",
    "prefix": "prefix-cache hit",
    "during_load": "during load",
}


def conditions(evals: dict | None):
    """(condition, summary) for each condition a dtype's `eval` holds; its other keys (`error`) are not one."""
    for cond in CONDITIONS:
        summary = (evals or {}).get(cond)
        if isinstance(summary, dict):
            yield cond, summary


def _first_task_accuracy(dtype_result: dict, condition: str) -> float | None:
    """Accuracy of the first eval task in a condition (the tracked number; every task is in the record)."""
    tasks = ((dtype_result.get("eval") or {}).get(condition) or {}).get("tasks") or {}
    first = next(iter(tasks.values()), None)
    return first.get("accuracy") if first else None


def summary_rows(doc: dict, path: Path | None = None) -> list[dict]:
    env = doc.get("environment") or {}
    vllm = env.get("vllm") or {}
    config = doc.get("config") or {}
    rows = []
    for d in doc.get("dtypes", []):
        model = ((d.get("capacity") or {}).get("model")) or {}
        server = d.get("server") or {}
        rows.append(
            {
                "run_id": doc.get("run_id"),
                "created_at": doc.get("created_at"),
                "machine": doc.get("machine"),
                "run_status": doc.get("status"),
                "vllm_package": vllm.get("package"),
                # an --endpoint run measured the server's vLLM (its /version), never this machine's install
                "vllm_version": (server.get("vllm_version") or "unknown")
                if not server.get("managed", True)
                else vllm.get("version"),
                "model": config.get("model_name") or config.get("model"),
                "kv_cache_dtype": d.get("kv_cache_dtype"),
                "kv_dtype_confirmed": d.get("kv_dtype_confirmed"),
                "emulated": bool(d.get("emulated")),
                "status": d.get("status"),
                "error": d.get("error"),
                "context": model.get("context") or config.get("max_model_len"),
                "budget_bytes": model.get("budget_bytes"),  # the engine's KV memory
                "workload_kind": (config.get("workload_spec") or {}).get("kind") or "fixed",
                **headline(d),
                "path": str(path) if path else None,
            }
        )
    return rows


def summary_frame(where: str | Path | list[Path], problems: list[str] | None = None):
    """pandas DataFrame, one row per (run, dtype), from a record, a folder of records, or a list of paths.

    A damaged record is skipped and named in `problems` when given; without it, the first one raises."""
    import pandas as pd

    paths = where if isinstance(where, list) else find_records(where)
    rows = []
    for p in paths:
        try:
            doc = load_record(p)
        except UsageError as exc:
            if problems is None:
                raise
            problems.append(f"skipped {exc}")
            continue
        rows += summary_rows(doc, p)
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["created_at"] = pd.to_datetime(frame["created_at"], utc=True)
        frame = frame.sort_values(["created_at", "kv_cache_dtype"]).reset_index(drop=True)
    return frame


def samples_frame(where: str | Path | list[Path], table: str = "requests"):
    """pandas DataFrame of the samples of every record under `where`: table "requests" (one row per request,
    agreement requests included) or "series" (/metrics and NVML in long form). v2 records read their Parquet
    file; v1 records their embedded requests. A record whose samples are not on this disk contributes none."""
    import pandas as pd
    import pyarrow.parquet as pq

    if table not in ("requests", "series", "evals"):
        raise UsageError(f"unknown samples table {table!r}; choose from: requests, series, evals")
    paths = where if isinstance(where, list) else find_records(where)
    frames = []
    for p in paths:
        doc = read_json(p, missing=f"run record not found: {p}", bad="not a JSON run record")
        record = parse_record(doc, p)
        if record.schema_ == SCHEMA_V1:
            if table != "evals":  # v1 records had no evaluations
                frames.append(_v1_samples(doc, table))
            continue
        name = getattr(record.samples, table, None) if record.samples else None
        file = Path(p).with_name(name) if name else None
        if file is not None and file.is_file():
            frames.append(pq.read_table(file).to_pandas())
    frames = [f for f in frames if not f.empty]
    if not frames:
        schema = {"requests": _request_schema(), "series": _series_schema(), "evals": _eval_schema()}[table]
        return schema.empty_table().to_pandas()
    return pd.concat(frames, ignore_index=True)


def _v1_samples(doc: dict, table: str):
    import pandas as pd

    rows = []
    for d in doc.get("dtypes") or []:
        dtype = d.get("kv_cache_dtype")
        if table == "requests":
            for i, p in enumerate(d.get("phases") or []):
                name = p.get("name") or ""
                kind = PhaseKind.SLO_PROBE.value if name.startswith("slo-c") else PhaseKind.FIXED.value
                for r in p.get("requests") or []:
                    rows.append(
                        {
                            **r,
                            "run_id": doc.get("run_id"),
                            "kv_cache_dtype": dtype,
                            "phase": name,
                            "phase_kind": kind,
                            "phase_index": i,
                            "warmup": False,
                        }
                    )
        else:
            for snap in (d.get("metrics") or {}).get("during") or []:
                for name, value in (snap.get("values") or {}).items():
                    rows.append(
                        {
                            "run_id": doc.get("run_id"),
                            "kv_cache_dtype": dtype,
                            "source": "metrics",
                            "t": snap.get("t"),
                            "gpu": None,
                            "name": name,
                            "value": value,
                        }
                    )
    return pd.DataFrame(rows)
