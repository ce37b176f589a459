"""What one run is asked to do (`RunPlan`, built from checked settings by harness/run/defaults.py build_plan), what
its caller adds (`RunOptions`), whom it tells how it goes (`Reporter`, drawn by harness/run/progress.py) and the
shape of the verdict it is handed (`Decide`): the runner's inputs, in a module of their own so that the
runner's parts (runcontext, phases, loadphase) can name them without importing the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.core.datafiles import load_toml
from kvbench.harness.client.scheduler import Concurrency, Rate
from kvbench.harness.client.workload import Workload
from kvbench.harness.run.slo import SLO
from kvbench.harness.server.endpoint import Endpoint
from kvbench.records import RunRecord

# The recommendation a finished record gets: kvbench.analysis.verdict.decide, whose result has as_dict() and findings().
Decide = Callable[[RunRecord], Any]

# How every run measures (probe sizes, warm-up, agreement, timeouts): kvbench/data/run_defaults.toml [run].
RUN = load_toml("run_defaults.toml")["run"]


@dataclass
class RunPlan:
    model: str | None  # what vLLM loads (managed) / the served model's local copy (endpoint), for its config
    kv_dtypes: list[str]
    workload: Workload  # fixed lengths (and the agreement prompts' shape)
    loads: list[Concurrency | Rate]  # the fixed-load phases, in order
    machine: str  # the results folder: results/<machine>/runs/
    slo: SLO | None = None  # the SLO: the search runs when set, and goodput counts requests within it
    search_cap: int | None = None  # highest concurrency to probe (default: 2x the engine's capacity)
    max_probes: int = RUN["max_probes"]
    probe_rounds: int = RUN["probe_rounds"]  # requests per probe (and sweep point) = rounds x concurrency
    min_probe_requests: int = RUN["min_probe_requests"]
    sweep: bool = False  # the concurrency ladder (doubling from 1 past the SLO knee, and the knee): the front
    sweep_max: int | None = None  # highest ladder point (default: the first power of two past the knee)
    repeat: int = 1  # every fixed-load phase this many times, each with fresh prompts (CIs from them)
    gpus: int = 1  # accelerators one server uses (tensor x pipeline parallel); per-GPU throughput divides by it
    price_per_gpu_hour: float | None = None  # USD, an input (kvbench ships no prices); for the cost of the front
    price_key: str | None = None  # the --price-per-hour entry it came from
    target_user_tps: float | None = None  # interactivity to read the front at (default: 1000 / the SLO's TPOT)
    workload_spec: object | None = None  # a kvbench.harness.workloads spec (None: `workload`'s fixed lengths)
    workload_requests: int | None = None  # requests of the spec's fixed phase (None: as many as it holds)
    endpoints: dict[str, Endpoint] | None = None  # dtype -> a running server to measure instead of starting one
    tokenizer: str | None = None  # local tokenizer folder for the prompts (default: model)
    extra_args: list[str] = field(default_factory=list)
    server_env: dict[str, str] = field(default_factory=dict)
    max_model_len: int | None = None
    results_dir: Path = Path("results")
    startup_timeout_s: float = 600.0
    stall_timeout_s: float = RUN["stall_timeout_s"]
    request_timeout_s: float = RUN["request_timeout_s"]
    warmup_requests: int = RUN["warmup_requests"]
    model_name: str | None = None  # how records name the model (the tiny model's short name, an HF id, the served id)
    unsupported: dict[str, str] = field(default_factory=dict)  # dtype -> why it is recorded, not run
    emulated: dict[str, dict] = field(default_factory=dict)  # dtype -> the emulation that serves it (kvsupport)
    # --kv-scales: the variants each tensor-scaled dtype is served with (a label dtype@variant per extra one,
    # harness/server/scales.py); ["checkpoint"]: the model as given
    kv_scales: list[str] = field(default_factory=lambda: ["checkpoint"])
    calibration_tasks: list[str] = field(default_factory=list)  # whose held-out items calibrate (kvcalibrate)
    client_realtime: bool = False  # SCHED_FIFO for the client (see harness/client/clientsched.py), where permitted
    agreement_prompts: int = RUN[
        "agreement_prompts"
    ]  # end-to-end accuracy vs auto (harness/quality/agreement.py); 0: off
    agreement_tokens: int = RUN["agreement_tokens"]
    canaries: int = RUN[
        "canaries"
    ]  # of the agreement prompts, re-sent inside every load phase (harness/agreement.Canaries)
    eval_tasks: list[str] = field(
        default_factory=list
    )  # lm-eval tasks at rest / at load / during load (harness/quality)
    eval_limit: int | None = None  # first N items of each task (None: all)
    max_eval_items: int | None = None  # items until decided: the most per task (kvbench.harness.quality.untildecided)
    accuracy_budget_points: float = 1.0  # the most accuracy a dtype may lose vs auto and still be recommended
    accuracy_confidence: float = RUN[
        "accuracy_confidence"
    ]  # of the one-sided non-inferiority bound (kvbench.analysis.verdict)
    accuracy_budgets: dict[str, float] = field(default_factory=dict)  # per task, overriding it (nightly [quality])
    # real models (kvbench/realmodels): the eval's conditions (None: every one, harness/quality/evalphase.py), fidelity
    # on natural text {windows, prefix, scored} (harness/quality/textfidelity.py) instead of the tasks' items, and where
    # the served weights came from (the prepared folder's provenance.json)
    eval_conditions: list[str] | None = None
    text_fidelity: dict | None = None
    model_provenance: dict | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The plan as a record stores it: no header, key or credential (URLs redacted)."""
        endpoints = None
        if self.endpoints:
            endpoints = {d: e.redacted for d, e in self.endpoints.items()}
        headers = sorted({h for e in (self.endpoints or {}).values() for h in e.headers})
        return {
            "model": self.model,
            "model_name": self.model_name or self.model,
            "kv_dtypes": self.kv_dtypes,
            "workload": self.workload.as_dict(),
            "workload_spec": self.workload_spec.describe() if self.workload_spec is not None else None,
            "loads": [load.describe() for load in self.loads],
            "slo": self.slo.as_dict() if self.slo else None,
            "search_cap": self.search_cap,
            "max_probes": self.max_probes,
            "probe_rounds": self.probe_rounds,
            "sweep": self.sweep,
            "sweep_max": self.sweep_max,
            "repeat": self.repeat,
            "gpus": self.gpus,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "price_key": self.price_key,
            "target_user_tps": self.target_user_tps,
            "endpoint": endpoints,
            "headers_sent": headers,  # names only: values are secrets
            "tokenizer": self.tokenizer,
            "extra_args": self.extra_args,
            "server_env": self.server_env,
            "max_model_len": self.max_model_len,
            "stall_timeout_s": self.stall_timeout_s,
            "unsupported": self.unsupported,
            "emulated": self.emulated,
            "kv_scales": self.kv_scales,
            "client_realtime": self.client_realtime,
            "agreement": {
                "prompts": self.agreement_prompts,
                "tokens": self.agreement_tokens,
                "canaries": self.canaries,
            },
            "eval": {
                "tasks": self.eval_tasks,
                "limit": self.eval_limit,
                "max_items": self.max_eval_items,
                "budget_points": self.accuracy_budget_points,
                "budgets": self.accuracy_budgets,
                "confidence": self.accuracy_confidence,
                "conditions": self.eval_conditions,
            },
            "text_fidelity": self.text_fidelity,
            "notes": self.notes,
        }


@dataclass(frozen=True)
class RunOptions:
    """What a caller adds to a run besides its plan, the same for the harness's execute and
    kvbench.orchestration.measure's.

    extra: top-level record fields (the asv link, the nightly entry). deadline_s: stop after this many seconds
    (the record is kept, status interrupted, reason deadline, with deadline_note). on_finish(record): called
    before the final write (e.g. to note the host load after the run)."""

    extra: dict | None = None
    deadline_s: float | None = None
    deadline_note: str | None = None
    on_finish: Callable[[RunRecord], None] | None = None


class Reporter:
    """What the runner tells its caller (the CLI draws progress bars from it). Silent by default."""

    def dtype_started(self, dtype: str, index: int, total: int) -> None: ...
    def phase(self, dtype: str, text: str, total: int | None = None) -> None: ...
    def advance(self, done: int, total: int) -> None: ...
    def note(self, text: str) -> None: ...
