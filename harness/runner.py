"""One `kvbench run`: for each KV-cache dtype, a vLLM server (started here, or an --endpoint checked against
what it says it runs), its capacity three ways, an SLO search and fixed-load phases, with /metrics and
NVML alongside; one typed record (harness/records.py), flushed after every dtype, with its samples in Parquet.

`execute(plan)` is the one entry point (the CLI, the asv suite and the nightly all call it): it owns the
event loop, SIGTERM, the deadline, and stopping every server; it returns the record, or raises
`RunInterrupted` (carrying the record it wrote) when a signal or the deadline stopped the run.

A dtype that fails (bad flag, OOM, server killed or hung mid-run) is recorded as that dtype's failure with
its log tail, and the run goes on with the next one. Nothing measured is dropped.
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kvbench import front, verdict
from kvbench.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, budget_from_bytes, capacity_row
from kvbench.datafiles import load_toml
from kvbench.errors import KvbenchError, UsageError
from kvbench.errors import one_line as _one_line
from kvbench.formats import format_ratio, get_format
from kvbench.harness import energy, evalphase, quality, records, repeats, spill
from kvbench.harness.agreement import Canaries, Sample, collect, compare
from kvbench.harness.backend import OpenAIBackend
from kvbench.harness.endpoint import Endpoint, ServerFacts, describe, redact_url, served_vllm, server_changes
from kvbench.harness.findings import FindingKind
from kvbench.harness.machine import environment
from kvbench.harness.metrics import DEFINITIONS, distribution, summarize
from kvbench.harness.notices import notices
from kvbench.harness.promscrape import MetricsSampler, capacity_from_metrics, fetch_metrics, metrics_or_note
from kvbench.harness.records import (
    Agreement,
    Capacity,
    DtypeResult,
    DtypeStatus,
    EngineCapacityRecord,
    Finding,
    Front,
    MeasuredCapacity,
    ModelCapacity,
    Phase,
    PhaseKind,
    PhaseSummary,
    RunRecord,
    SampleStore,
    ServerInfo,
    Stop,
    StopReason,
)
from kvbench.harness.scheduler import Concurrency, Rate, Sessions, Timed, run_load
from kvbench.harness.server import ServerConfig, ServerStartError, VllmServer, healthy, stop_all
from kvbench.harness.slo import SLO, search
from kvbench.harness.telemetry import NvmlSampler
from kvbench.harness.workload import Workload, make_prompts
from kvbench.logparse import EngineCapacity, engine_failure
from kvbench.models import spec_for

# Two capacity ratios (engine vs format) further apart than this mean the dtype was probably not honoured.
HONOURED_TOLERANCE = 0.05
# A client that waited for a CPU this share of a phase measured its own queueing, not the server.
STARVED_CLIENT_FRACTION = 0.05
# The agreement prompts' seed stream: the same prompts for every dtype, never reused by a load phase.
AGREEMENT_STREAM = 10_000
# How every run measures (probe sizes, warm-up, agreement, timeouts): kvbench/data/run_defaults.toml [run].
RUN = load_toml("run_defaults.toml")["run"]
# Prompt seed streams by phase kind (see _phases): distinct, and stable across dtypes for pairing.
PROBE_STREAM, SWEEP_STREAM, FIXED_STREAM, WARMUP_STREAM = 1_000, 20_000, 30_000, 500_000  # evals: evalphase


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
    client_realtime: bool = False  # SCHED_FIFO for the client (see harness/clientsched.py), where permitted
    agreement_prompts: int = RUN["agreement_prompts"]  # end-to-end accuracy vs auto (harness/agreement.py); 0: off
    agreement_tokens: int = RUN["agreement_tokens"]
    canaries: int = RUN[
        "canaries"
    ]  # of the agreement prompts, re-sent inside every load phase (harness/agreement.Canaries)
    eval_tasks: list[str] = field(
        default_factory=list
    )  # lm-eval tasks at rest / at load / during load (harness/quality)
    eval_limit: int | None = None  # first N items of each task (None: all)
    accuracy_budget_points: float = 1.0  # the most accuracy a dtype may lose vs auto and still be recommended
    accuracy_confidence: float = RUN["accuracy_confidence"]  # of the one-sided non-inferiority bound (kvbench.verdict)
    accuracy_budgets: dict[str, float] = field(default_factory=dict)  # per task, overriding it (nightly [quality])
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
            "client_realtime": self.client_realtime,
            "agreement": {
                "prompts": self.agreement_prompts,
                "tokens": self.agreement_tokens,
                "canaries": self.canaries,
            },
            "eval": {
                "tasks": self.eval_tasks,
                "limit": self.eval_limit,
                "budget_points": self.accuracy_budget_points,
                "budgets": self.accuracy_budgets,
                "confidence": self.accuracy_confidence,
            },
            "notes": self.notes,
        }


class Reporter:
    """What the runner tells its caller (the CLI draws progress bars from it). Silent by default."""

    def dtype_started(self, dtype: str, index: int, total: int) -> None: ...
    def phase(self, dtype: str, text: str, total: int | None = None) -> None: ...
    def advance(self, done: int, total: int) -> None: ...
    def note(self, text: str) -> None: ...


class RunInterrupted(KvbenchError):
    """A signal or the deadline stopped the run; the record of what was measured is written (at `path`)."""

    exit_code = 130

    def __init__(self, record: RunRecord, path: Path):
        stop = record.stopped
        super().__init__(f"{stop.detail if stop else 'interrupted'}; partial record written to {path}")
        self.record, self.path = record, path
        self.reason = stop.reason if stop else StopReason.SIGNAL


class Runner:
    def __init__(self, plan: RunPlan, reporter: Reporter | None = None, extra: dict | None = None):
        self.plan = plan
        self.reporter = reporter or Reporter()
        self.run_id = records.new_run_id(plan.machine)
        self.path = records.record_path(plan.results_dir, plan.machine, self.run_id)
        self.samples = SampleStore(self.run_id)
        self.server: VllmServer | None = None  # the server of the dtype being measured (managed runs)
        self._nvml: NvmlSampler | None = None  # the dtype's NVML sampler (energy per phase)
        self._rapl = energy.rapl_domains()  # CPU package energy counters, where the kernel exposes them
        self._evaluator = quality.Evaluator() if plan.eval_tasks else None
        self._eval_items: dict[tuple[str, str], dict] = {}  # (dtype, condition) -> {task: {doc id: score}}
        self._reference: list[dict] | None = None  # auto's greedy samples, for end-to-end agreement
        self._changed: list[Finding] = []  # endpoint servers that changed between phases
        self.spilled: str | None = None  # where the record went when the disk was full (the run then exits 1)
        self.record = RunRecord(
            run_id=self.run_id,
            created_at=records.utc_iso(),
            machine=plan.machine,
            config=plan.as_dict(),
            environment=environment(),
            definitions=dict(DEFINITIONS),
            **(extra or {}),
        )
        self._client_vllm = self.record.environment.get("vllm")

    def flush(self) -> Path:
        if self.plan.endpoints:  # what was measured is the servers' vLLM, not this machine's
            versions = [d.server.vllm_version for d in self.record.dtypes if d.server]
            self.record.environment["vllm"] = served_vllm(self._client_vllm, versions)
        spilled = spill.flush(self.path, self.record, self.samples)  # a full disk never loses the record
        if spilled:
            self.spilled = spilled
            self.reporter.note(spilled)
        return self.path

    async def run(self, deadline_s: float | None = None, deadline_note: str | None = None) -> RunRecord:
        stop: Stop | None = None
        try:
            async with asyncio.timeout(deadline_s):
                await self._all_dtypes()
        except TimeoutError:
            stop = Stop(
                reason=StopReason.DEADLINE,
                detail=deadline_note or f"stopped: the deadline of {deadline_s:.0f} s passed",
            )
        except (KeyboardInterrupt, asyncio.CancelledError):
            stop = Stop(reason=StopReason.SIGNAL, detail="interrupted (Ctrl-C, SIGTERM or SIGHUP)")
            raise
        finally:
            self._finish(stop)
        return self.record

    async def _all_dtypes(self) -> None:
        # The 16-bit baseline runs first, so every quantized dtype can be compared with its outputs.
        order = sorted(self.plan.kv_dtypes, key=lambda d: d != "auto")
        for i, dtype in enumerate(order):
            self.reporter.dtype_started(dtype, i, len(order))
            result = DtypeResult(kv_cache_dtype=dtype)
            self.record.dtypes.append(result)
            if dtype in self.plan.unsupported:
                result.status, result.error = DtypeStatus.UNSUPPORTED, self.plan.unsupported[dtype]
            else:
                if dtype in self.plan.emulated:
                    result.emulated, result.implementation = True, dict(self.plan.emulated[dtype])
                await self._one_dtype(dtype, result)
            self.flush()

    def _finish(self, stop: Stop | None) -> None:
        rec = self.record
        for d in rec.dtypes:
            if d.status == DtypeStatus.RUNNING:  # the one that was being measured when the run stopped
                d.status = DtypeStatus.PARTIAL if d.phases else DtypeStatus.FAILED
                d.error = stop.detail if stop else "stopped"
        rec.stopped = stop
        rec.status = records.derive_status([d.status for d in rec.dtypes], stop is not None)
        if self._evaluator is not None:
            self._evaluator.close()
        try:
            rec.findings = [*self._changed, *findings(rec, self._model_spec()), *notices(rec)]
            rec.comparisons = comparisons(rec)
            evals = {d.kv_cache_dtype: d.eval for d in rec.dtypes if d.eval}
            quality.compare_conditions(evals, self._eval_items)
            for d in rec.dtypes:
                if d.kv_cache_dtype in evals:
                    d.eval = evals[d.kv_cache_dtype]
            decision = verdict.decide(rec)  # the one recommendation (kvbench/verdict.py), from the typed record
            rec.quality = decision.as_dict()
            rec.findings = [*rec.findings, *decision.findings()]
        except Exception as exc:  # what is derived must never cost what was measured
            error = Finding(level="error", kind=FindingKind.ERROR, text=f"findings not derived: {_one_line(exc)}")
            rec.findings = [*rec.findings, error]
        rec.finished_at = records.utc_iso()
        self.flush()

    # -- one dtype --------------------------------------------------------------------------------

    async def _one_dtype(self, dtype: str, result: DtypeResult) -> None:
        plan = self.plan
        server = None
        sampler = self._nvml = NvmlSampler(interval_s=0.1).start()
        try:
            if plan.endpoints:
                endpoint = plan.endpoints[dtype]
            else:
                server = self.server = self._server(dtype)
                result.log_path = str(server.log_path)
                self.reporter.phase(dtype, "starting vLLM")
                server.start()
                try:
                    await asyncio.to_thread(server.wait_ready, None, None)
                except ServerStartError as exc:
                    result.status, result.error, result.log_tail = DtypeStatus.FAILED, str(exc), exc.log_tail
                    return
                if result.emulated and not _emulation_active(server, result):
                    return
                endpoint = Endpoint(server.base_url)
            headers = endpoint.headers
            facts = await asyncio.to_thread(describe, endpoint.url, headers)
            result.server = _server_info(facts, server)
            served = facts.cache_dtype
            result.kv_dtype_confirmed = None if served is None else served == dtype
            if served is not None and served != dtype:
                if server is None:  # it said otherwise at the start: it was replaced since; do not mislabel
                    raise RuntimeError(
                        f"the server at {facts.redacted} now runs kv-cache-dtype {served!r}, not {dtype!r}"
                    )
                result.warnings.append(f"server reports cache_dtype {served!r}, asked for {dtype!r}")

            before = await asyncio.to_thread(metrics_or_note, endpoint.url, headers, result.warnings)
            result.metrics.before = before.as_dict()
            engine = (server.capacity() if server else None) or capacity_from_metrics(before)
            result.capacity = self._capacity(dtype, engine, before.cache_config, facts)

            backend = OpenAIBackend(
                endpoint.url,
                facts.served_model,
                api=plan.workload.api,
                request_timeout_s=plan.request_timeout_s,
                headers=headers,
            )
            sampler_http = MetricsSampler(endpoint.url, interval_s=1.0, headers=headers)
            sampler_http.start()
            try:
                await self._phases(dtype, backend, result, server, headers)
            finally:
                await sampler_http.stop()
                result.metrics.during = self.samples.add_metrics(dtype, sampler_http.samples)
                await backend.close()
            if server is None or server.alive():
                after = await asyncio.to_thread(metrics_or_note, endpoint.url, headers, result.warnings)
                result.metrics.after = after.as_dict()
            if result.status == DtypeStatus.RUNNING:
                result.status = DtypeStatus.OK
        except Exception as exc:  # one dtype's failure never ends the run
            result.status = DtypeStatus.PARTIAL if result.phases else DtypeStatus.FAILED
            result.error = _one_line(exc)
            if server is not None:
                result.log_tail = server.log_tail()
        finally:
            telemetry = sampler.stop()
            result.telemetry = records.TelemetrySummary(
                available=telemetry.available,
                reason=telemetry.reason,
                interval_s=telemetry.interval_s,
                samples=self.samples.add_telemetry(dtype, telemetry),
            )
            if server is not None:
                if result.status != DtypeStatus.OK and not result.log_tail:
                    result.log_tail = server.log_tail()
                server.stop()

    def _server(self, dtype: str) -> VllmServer:
        plan = self.plan
        cfg = ServerConfig(
            model=plan.model,
            kv_cache_dtype=dtype,
            max_model_len=plan.max_model_len,
            extra_args=plan.extra_args,
            env={"HF_HUB_OFFLINE": "1", **plan.server_env} if Path(plan.model).exists() else plan.server_env,
            startup_timeout_s=plan.startup_timeout_s,
        )
        log = Path(plan.results_dir) / plan.machine / "logs" / self.run_id / f"vllm-{dtype}.log"
        return VllmServer(cfg, log)

    def _model_spec(self):
        return spec_for(self.plan.model)  # None for a hub id whose config is not on disk: no model-side prediction

    def _capacity(self, dtype: str, engine: EngineCapacity | None, cache_config: dict, facts: ServerFacts) -> Capacity:
        """Engine-reported capacity, the capacity model's prediction for the same budget, block size and
        context (the server's own max_model_len where it says it), and for a workload its own lengths'."""
        out = Capacity(engine=EngineCapacityRecord(**vars(engine)) if engine else None)
        context = self._model_capacity(out, dtype, engine, cache_config, facts)
        if self.plan.workload_spec is not None and context:
            out.distribution = self._capacity_under_distribution(
                engine, out.model, _int(cache_config.get("block_size")), context
            )
        return out

    def _model_capacity(self, out: Capacity, dtype: str, engine, cache_config: dict, facts: ServerFacts) -> int | None:
        """Fill out.model (or out.model_note); return the context it used."""
        spec = self._model_spec()
        budget_bytes = _kv_budget_bytes(engine, cache_config)
        block = _int(cache_config.get("block_size"))
        context = facts.max_model_len or self.plan.max_model_len or (engine.tokens_per_request if engine else None)
        missing = [
            what
            for what, have in (
                ("the model's config.json", spec),
                ("the engine's KV budget", budget_bytes),
                ("its block size", block),
                ("max_model_len", context),
            )
            if not have
        ]
        if missing:
            out.model_note = "no capacity-model prediction: unknown " + ", ".join(missing)
            return context
        try:
            fmt = get_format(dtype)
        except UsageError:
            out.model_note = f"no capacity-model prediction: kvbench has no format for {dtype!r}"
            return context
        gpu = self._catalog_gpu()
        row = capacity_row(
            spec, fmt, context, budget_from_bytes(budget_bytes, "engine's KV memory"), gpu, block_size=block
        )
        out.model = ModelCapacity(
            kv_tokens=row.kv_tokens,
            max_concurrency=row.max_concurrency,
            num_blocks=row.num_blocks,
            budget_bytes=budget_bytes,
            block_size=block,
            context=context,
            format=fmt.key,
            gpu=gpu.key if gpu else None,
            activation_overhead_bytes=self._overhead(spec, budget_bytes, cache_config)
            if not self.plan.endpoints
            else None,
        )
        if gpu is not None and not self.plan.endpoints:
            out.non_kv = self._non_kv(spec, gpu, cache_config, context)
        return context

    def _non_kv(self, spec, gpu, cache_config: dict, context: int) -> dict:
        log = self.server.log_path.read_text(errors="replace") if self.server else None
        return non_kv_report(
            spec,
            gpu,
            cache_config,
            context,
            self.plan.extra_args,
            (self.record.environment.get("vllm") or {}).get("version"),
            log,
        )

    def _capacity_under_distribution(
        self, engine: EngineCapacity | None, model: ModelCapacity | None, block: int | None, context: int
    ) -> dict | None:
        """How many requests of the workload's own sequence lengths (prompt + output, what a request holds
        when it finishes) fit at their mean, P90 and P99, beside the max_model_len figure the engine reports:
        the engine's token pool where it said it, else the capacity model's; whole blocks per request."""
        from kvbench.harness.workloads import build

        pool = engine.kv_tokens if engine and engine.kv_tokens else (model.kv_tokens if model else None)
        block = (engine.block_size if engine and engine.block_size else None) or block or 1
        if not pool:
            return None
        stats = build(
            self.plan.workload_spec,
            self._tokenizer,
            seed=self.plan.workload.seed,
            stream=0,
            max_model_len=context,
            api=self.plan.workload.api,
        ).stats["sequence_tokens"]

        def fits(tokens: int) -> int:
            return (pool // block) // max(1, math.ceil(tokens / block))

        worst = fits(context)
        out = {
            "source": "engine" if engine and engine.kv_tokens else "model",
            "pool_tokens": pool,
            "block_size": block,
            "max_model_len": {"tokens": context, "max_concurrency": worst},
        }
        for key in ("mean", "p90", "p99"):
            tokens = max(1, int(round(stats[key])))
            out[key] = {
                "tokens": tokens,
                "max_concurrency": fits(tokens),
                "vs_max_model_len": fits(tokens) / worst if worst else None,
            }
        return out

    def _catalog_gpu(self):
        from kvbench.gpus import match_nvml_name

        gpus = self.record.environment.get("gpus") or []
        return match_nvml_name(gpus[0]["name"]) if gpus else None

    def _overhead(self, spec, budget_bytes: int, cache_config: dict) -> int | None:
        """What vLLM kept back besides weights and KV cache (activations, CUDA graphs, non-torch memory), per
        GPU: device memory x utilization - weights / TP - KV budget. The number `kvbench capacity
        --overhead-gb` asks for; only on a GPU whose KV budget vLLM derived itself."""
        gpus = self.record.environment.get("gpus") or []
        if not gpus or _int(cache_config.get("kv_cache_memory_bytes")):
            return None
        util = float(cache_config.get("gpu_memory_utilization") or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
        tp = _tensor_parallel(self.plan.extra_args)
        return int(gpus[0]["memory_bytes"] * util - spec.weight_bytes / tp - budget_bytes)

    async def _phases(self, dtype: str, backend, result: DtypeResult, server: VllmServer | None, headers: dict) -> None:
        plan = self.plan
        slo = plan.slo

        def prompts(stream: int, n: int):
            # Every phase has its own prompt stream (vLLM's prefix cache must never see a repeat), numbered by
            # what the phase is, so the same fixed phase and repeat gets the same prompts under every dtype.
            w = Workload(**{**plan.workload.as_dict(), "num_requests": n})
            return make_prompts(w, self._tokenizer, stream=stream)

        spec = plan.workload_spec
        max_len = (result.server.max_model_len if result.server else None) or plan.max_model_len

        def traffic(stream: int, n: int | None, load):
            """(prompts, output tokens, mode) of a phase: fixed lengths, or the workload's own requests (a
            trace brings its send times, a multi-turn workload its conversations)."""
            if spec is None:
                return prompts(stream, n), plan.workload.output_tokens, load
            from kvbench.harness.workloads import build

            rp = build(
                spec,
                self._tokenizer,
                seed=plan.workload.seed,
                stream=stream,
                max_model_len=max_len,
                api=plan.workload.api,
                num_requests=n,
            )
            if rp.timed:
                load = Timed(tuple(r.send_at_s or 0.0 for r in rp.requests))
            elif rp.sessions:
                think = [0.0] * len(rp.requests)
                for r in rp.requests:
                    think[r.index] = r.think_s or 0.0
                load = Sessions(
                    tuple(tuple(t.index for t in s.turns) for s in rp.sessions),
                    tuple(think),
                    rp.max_concurrent_sessions or len(rp.sessions),
                )
            return rp.prompts, rp.output_tokens, load

        async def phase(name: str, kind: PhaseKind, load, n: int | None, stream: int, repeat: int = 0):
            items, outputs, load = traffic(stream, n, load)
            self.reporter.phase(dtype, name, total=len(items))
            warm = prompts(stream + WARMUP_STREAM, plan.warmup_requests) if plan.warmup_requests else ()
            rapl_before = energy.rapl_read(self._rapl) if self._rapl else None
            counters = await self._prefix_counters(backend, headers) if kind == PhaseKind.FIXED else None
            riding = asyncio.ensure_future(canaries.ride()) if canaries else None
            load_result = await run_load(
                backend,
                items,
                outputs,
                load,
                stall_timeout_s=plan.stall_timeout_s,
                on_progress=self.reporter.advance,
                warmup_prompts=warm,
                realtime=plan.client_realtime,
            )
            # From here the load is measured: a Ctrl-C while the canaries or /metrics are awaited must not lose
            # the phase, so it is noted, the phase is recorded, and the run stops after that.
            interrupted = load_result.interrupted
            canary = None
            if riding is not None:
                try:
                    canary = await asyncio.wait_for(riding, timeout=plan.stall_timeout_s)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    canary = {"error": _one_line(exc)}
                except asyncio.CancelledError:
                    interrupted, canary = True, {"error": "interrupted before the canaries came back"}
            prefix = None
            if counters:
                try:
                    prefix = await self._prefix_cache(backend, headers, counters, load_result)
                except asyncio.CancelledError:
                    interrupted = True
            run_summary = summarize(load_result, slo)
            summary = run_summary.as_dict()
            summary.pop("definitions", None)  # once per record, not per phase
            index = len(result.phases)
            self.samples.add_requests(dtype, name, kind, index, load_result.warmup, warmup=True)
            count = self.samples.add_requests(dtype, name, kind, index, load_result.results)
            rate = getattr(load, "rate", None)
            start = load_result.started_at_monotonic
            spent = self._energy(start, start + load_result.duration_s, rapl_before)
            spent.per_token(
                run_summary.total_completion_tokens,
                run_summary.total_prompt_tokens + run_summary.total_completion_tokens,
            )
            ph = Phase(
                name=name,
                kind=kind,
                concurrency=getattr(load, "concurrency", None),
                rate_rps=rate if rate is not None and math.isfinite(rate) else None,
                mode=load.describe(),
                summary=PhaseSummary.model_validate(summary),
                requests=count,
                repeat=repeat,
                started_s=start,
                energy=spent.as_dict(),
                canaries=canary,
                prefix_cache=prefix,
            )
            result.phases.append(ph)
            if interrupted:  # run_load keeps what it measured on Ctrl-C; the run stops here
                raise asyncio.CancelledError
            alive = server.alive() if server else True
            if not alive or not await asyncio.to_thread(healthy, backend.base_url, 10.0, headers):
                cause = engine_failure(server.log_lines()) if server else None
                raise RuntimeError(f"vLLM engine died during {name}: {cause or 'server stopped answering /health'}")
            if load_result.stalled:
                raise RuntimeError(f"no progress for {plan.stall_timeout_s:g} s during {name}: server hung")
            if server is None:
                await self._same_server(dtype, backend.base_url, headers, result, name)
            return run_summary

        def ladder_size(c: int) -> int:
            return max(c * plan.probe_rounds, plan.min_probe_requests)

        canaries = None
        if plan.agreement_prompts:
            # Light load first: a dtype whose engine later dies under load still gets its accuracy measured.
            at_rest = await self._agreement(dtype, backend, result, headers)
            if at_rest and plan.canaries:
                canaries = Canaries(
                    backend.base_url, backend.model, at_rest[: plan.canaries], headers, plan.stall_timeout_s
                )

        knee, cap = None, plan.search_cap
        paced = spec is not None and spec.kind in ("trace", "multi-turn")  # its own timing: no ladder
        if paced and (plan.slo is not None or plan.sweep):
            result.warnings.append(
                f"a {spec.kind} workload keeps its own timing: no SLO search or sweep (fixed phase only)"
            )
        if plan.slo is not None and not paced:
            engine_conc = result.capacity.engine.max_concurrency if result.capacity.engine else None
            model_conc = result.capacity.model.max_concurrency if result.capacity.model else None
            hint = engine_conc or model_conc
            cap = plan.search_cap or (max(2, math.ceil(2 * hint)) if hint else 64)
            probe_streams = iter(range(PROBE_STREAM, PROBE_STREAM + 1000))

            async def probe(c: int):
                return await phase(
                    f"slo-c{c}", PhaseKind.SLO_PROBE, Concurrency(c), ladder_size(c), next(probe_streams)
                )

            found = await search(probe, plan.slo, cap=cap, hints=[engine_conc, model_conc], max_probes=plan.max_probes)
            result.capacity.measured = MeasuredCapacity(
                max_concurrency=found.max_concurrency,
                capped=found.capped,
                cap=cap,
                slo=plan.slo.as_dict(),
                probes=[vars(p) for p in found.probes],
            )
            knee = found.max_concurrency or None

        if plan.sweep and not paced:
            measured = {p.concurrency for p in result.phases if p.concurrency and p.kind == PhaseKind.SLO_PROBE}
            engine_conc = result.capacity.engine.max_concurrency if result.capacity.engine else None
            top = min(x for x in (plan.sweep_max, cap) if x) if (plan.sweep_max or cap) else None
            for c in sweep_ladder(knee or (int(engine_conc) if engine_conc else None), top):
                if c not in measured:  # a probe at this concurrency is already a point on the curve
                    await phase(f"sweep-c{c}", PhaseKind.SWEEP, Concurrency(c), ladder_size(c), SWEEP_STREAM + c)

        if plan.eval_tasks:
            first = plan.loads[0] if plan.loads else None
            at_load = knee or getattr(first, "concurrency", None) or 1
            await self._evaluate(dtype, backend, result, headers, at_load, first, prompts)

        headline_runs = []
        for i, load in enumerate(plan.loads):
            for r in range(plan.repeat):
                name = ("fixed" if i == 0 else f"fixed-{_load_name(load)}") + (f"-r{r + 1}" if plan.repeat > 1 else "")
                stream = FIXED_STREAM + i * 100 + r
                n = plan.workload_requests if spec is not None else plan.workload.num_requests
                summary = await phase(name, PhaseKind.FIXED, load, n, stream, repeat=r)
                if i == 0:
                    headline_runs.append(result.phases[-1].summary)
                if summary.all_failed:
                    raise RuntimeError(f"every request of phase {name} failed: {summary.failure_reasons}")
        if len(headline_runs) > 1:
            result.fixed_stats = repeats.stats(headline_runs)
        result.front = self._front(result)

    async def _same_server(self, dtype: str, url: str, headers: dict, result: DtypeResult, after: str) -> None:
        """An --endpoint server must be the one described at the start after every phase (same model, context
        and cache configuration); a changed one ends the dtype (its measured phases are kept) with an error."""
        changes = server_changes(result.server, await asyncio.to_thread(describe, url, headers))
        if changes:
            text = f"the server changed after phase {after}: {'; '.join(changes)}; later phases not run"
            self._changed.append(
                Finding(level="error", kind=FindingKind.SERVER_CHANGED, dtype=dtype, text=f"{dtype}: {text}")
            )
            raise RuntimeError(text)

    async def _evaluate(
        self, dtype: str, backend, result: DtypeResult, headers: dict, at_load: int, load, prompts
    ) -> None:
        """The dtype's eval phase in every condition (harness/evalphase.py), into `result.eval`."""
        plan = self.plan
        tok = self._tokenizer
        phase = evalphase.EvalPhase(
            plan=plan,
            dtype=dtype,
            backend=backend,
            headers=headers,
            evaluator=self._evaluator,
            reporter=self.reporter,
            samples=self.samples,
            items=self._eval_items,
            tokenizer=tok,
            tokenizer_dir=str(plan.tokenizer or plan.model),
            max_len=(result.server.max_model_len if result.server else None) or plan.max_model_len,
            id0_text=tok.convert_ids_to_tokens(0) if hasattr(tok, "convert_ids_to_tokens") else None,
        )
        evals: dict[str, dict] = {}
        result.eval = evals  # filled condition by condition: a run stopped mid-eval keeps the finished ones
        await phase.run(evals, at_load, load, prompts)
        result.eval = dict(evals)

    async def _prefix_counters(self, backend, headers: dict) -> dict | None:
        """vLLM's prefix-cache and preemption counters now (None when the server does not say them)."""
        try:
            snap = await asyncio.to_thread(fetch_metrics, backend.base_url, 5.0, headers)
        except Exception:  # a server without /metrics: the phase simply has no prefix-cache numbers
            return None
        return {k: snap.values.get(k) for k in ("prefix_cache_queries", "prefix_cache_hits", "preemptions")}

    async def _prefix_cache(self, backend, headers: dict, before: dict, load_result) -> dict:
        """The phase's prefix-cache hit rate (from /metrics, in tokens), preemptions, and TTFT of requests that
        hit the cache against those that did not (from usage.prompt_tokens_details.cached_tokens)."""
        after = await self._prefix_counters(backend, headers) or {}

        def delta(key):
            a, b = after.get(key), before.get(key)
            return a - b if a is not None and b is not None else None

        queries, hits = delta("prefix_cache_queries"), delta("prefix_cache_hits")
        done = [r for r in load_result.results if r.ok and r.ttft_s is not None]
        known = [r for r in done if r.cached_tokens is not None]
        hit = [r.ttft_s * 1e3 for r in known if r.cached_tokens > 0]
        miss = [r.ttft_s * 1e3 for r in known if r.cached_tokens == 0]
        return {
            "queries_tokens": queries,
            "hits_tokens": hits,
            "hit_rate": hits / queries if queries else None,
            "preemptions": delta("preemptions"),
            "requests_with_cached_tokens": len(hit),
            "requests_reporting": len(known),
            "ttft_hit_ms": distribution(hit),
            "ttft_miss_ms": distribution(miss),
        }

    def _energy(self, start: float, end: float, rapl_before) -> energy.Energy:
        """Energy of the phase just measured: NVML on a GPU, RAPL on a CPU that exposes it, else unavailable."""
        nvml = self._nvml
        if nvml is not None and nvml.result.available:
            return energy.nvml_energy(list(nvml.result.samples), list(nvml.result.fields), start, end)
        if self._rapl:
            return energy.rapl_energy(rapl_before, energy.rapl_read(self._rapl), end - start)
        return energy.unavailable()

    def _front(self, result: DtypeResult) -> Front | None:
        """Every closed-loop phase as a point (one per concurrency: a sweep point, else a probe, else the first
        fixed run), the Pareto front, and the cost where a price was given."""
        plan = self.plan
        by_c: dict[int, Phase] = {}
        rank = {PhaseKind.SWEEP: 0, PhaseKind.SLO_PROBE: 1, PhaseKind.FIXED: 2}
        for ph in result.phases:
            if ph.concurrency and (ph.concurrency not in by_c or rank[ph.kind] < rank[by_c[ph.concurrency].kind]):
                by_c[ph.concurrency] = ph
        if not by_c:
            return None
        pts = []
        for c in sorted(by_c):
            ph = by_c[c]
            summary = ph.summary.model_dump()
            met = plan.slo.check(ph.summary)[0] if plan.slo else None
            pts.append(front.point(c, ph.name, summary, plan.gpus, met))
        if result.emulated:  # the emulation's speed: its points are kept, but it has no front, best point or cost
            return Front(gpus=plan.gpus, points=[p.as_dict() for p in pts])
        front.mark_front(pts)
        front.price(pts, plan.price_per_gpu_hour)
        target = plan.target_user_tps or (1000.0 / plan.slo.tpot_ms if plan.slo and plan.slo.tpot_ms else None)
        best = front.best_under_slo(pts)
        at_target = front.at_interactivity(pts, target) if target else None
        if at_target is not None and plan.price_per_gpu_hour is not None:
            at_target["usd_per_m_output"] = front.usd_per_million(
                at_target["output_tps_per_gpu"], plan.price_per_gpu_hour
            )
        return Front(
            gpus=plan.gpus,
            price_per_gpu_hour=plan.price_per_gpu_hour,
            price_key=plan.price_key,
            points=[p.as_dict() for p in pts],
            at_slo=best.as_dict() if best else None,
            at_target=at_target,
            target_user_tps=target,
        )

    async def _agreement(self, dtype: str, backend, result: DtypeResult, headers: dict) -> list[dict] | None:
        plan = self.plan
        self.reporter.phase(dtype, "agreement (greedy outputs vs auto)")
        tokens, prompt_tokens = plan.agreement_tokens, plan.workload.prompt_tokens
        max_len = (result.server.max_model_len if result.server else None) or plan.max_model_len
        if max_len:
            # Scoring sends prompt + continuation + 1 new token: all of it must fit in max_model_len.
            tokens = min(tokens, max(1, max_len // 4))
            prompt_tokens = max(1, min(prompt_tokens, max_len - tokens - 1))
        w = Workload(
            **{
                **plan.workload.as_dict(),
                "prompt_tokens": prompt_tokens,
                "num_requests": plan.agreement_prompts,
                "api": "completions",
            }
        )
        prompts = [p.content for p in make_prompts(w, self._tokenizer, stream=AGREEMENT_STREAM)]
        agreement = Agreement(prompts=len(prompts), prompt_tokens=prompt_tokens, tokens=tokens)
        result.agreement = agreement
        try:
            reference = [Sample(**r) for r in self._reference] if self._reference is not None else None
            data = await collect(
                backend.base_url, backend.model, prompts, tokens, reference, plan.stall_timeout_s, headers
            )
        except (TimeoutError, aiohttp.ClientError, KeyError, ValueError) as exc:
            # This part failed; the load phases still run (and find out for themselves if the server is gone).
            agreement.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return None
        self.samples.add_agreement(dtype, data["samples"], data["teacher_forced"])
        if dtype == "auto":
            self._reference = data["samples"]
        elif self._reference is not None:
            agreement.vs_auto = compare(self._reference, data["samples"], data["teacher_forced"])
        return data["samples"]

    @property
    def _tokenizer(self):
        if not hasattr(self, "_tok"):
            from kvbench.harness.workload import load_tokenizer

            self._tok = load_tokenizer(self.plan.tokenizer or self.plan.model)
        return self._tok


def sweep_ladder(knee: int | None, top: int | None = None) -> list[int]:
    """Concurrencies of the trade-off curve: 1, 2, 4, ... up to the first power of two past the knee (1..16
    when no knee is known), and the knee itself; none above `top` (the search's cap, --sweep-max)."""
    out, c = [], 1
    while c <= (top or math.inf):
        out.append(c)
        if c > (knee or 8):
            break
        c *= 2
    if knee and (not top or knee <= top):
        out.append(knee)
    return sorted(set(out))


def _server_info(facts: ServerFacts, server: VllmServer | None) -> ServerInfo:
    cc = facts.cache_config
    return ServerInfo(
        managed=server is not None,
        base_url=redact_url(facts.base_url),
        ready_after_s=server.ready_after_s if server else None,
        served_model=facts.served_model,
        model_root=facts.model_root,
        max_model_len=facts.max_model_len,
        vllm_version=facts.vllm_version,
        cache_dtype=facts.cache_dtype,
        block_size=_int(cc.get("block_size")),
        num_gpu_blocks=_int(cc.get("num_gpu_blocks")),
    )


def _emulation_active(server: VllmServer, result: DtypeResult) -> bool:
    """The server's log says kvbench's emulation built its layers; else the dtype fails here (the stock
    code would have served it, wrongly)."""
    from kvbench.kernels.vllm_plugin import ACTIVE_MARK

    line = next((x for x in server.log_lines() if ACTIVE_MARK in x and " active: " in x), None)
    if line is None:
        result.status, result.log_tail = DtypeStatus.FAILED, server.log_tail()
        name = result.implementation["name"]
        result.error = f"{name} did not load in the server (no '{ACTIVE_MARK} ... active' line in its log)"
        return False
    result.implementation["log"] = line.split("] ", 1)[-1].strip()
    return True


def _load_name(load) -> str:
    return f"c{load.concurrency}" if isinstance(load, Concurrency) else f"r{load.rate:g}"


def non_kv_report(
    spec, gpu, cache_config: dict, context: int, vllm_args: list[str], vllm_version: str | None, log_text: str | None
) -> dict:
    """kvbench's prediction of every non-KV term (kvbench.vllm_memory) beside what the server's own start-up
    log says, per rank: weights, activation peak, non-torch memory, CUDA graphs, the KV pool (GiB)."""
    from kvbench.startuplog import parse_startup_log
    from kvbench.vllm_memory import VLLM_DTYPE_ARGS, VLLM_QUANTIZATION_WEIGHTS, predict_non_kv

    try:
        util = cache_config.get("gpu_memory_utilization")
        dtype = _flag(vllm_args, ("--dtype",))
        predicted = predict_non_kv(
            spec,
            gpu,
            utilization=float(util) if util else None,
            tensor_parallel_size=_tensor_parallel(vllm_args),
            pipeline_parallel_size=_tensor_parallel(vllm_args, ("--pipeline-parallel-size", "-pp")),
            # what the server was started with changes the terms: the profiling batch, the weights' format
            weights=VLLM_QUANTIZATION_WEIGHTS.get((_flag(vllm_args, ("--quantization", "-q")) or "").lower(), "auto"),
            dtype=VLLM_DTYPE_ARGS.get(dtype.lower()) if dtype else None,
            vllm_version=vllm_version,
            max_num_seqs=_int(_flag(vllm_args, ("--max-num-seqs",))),
            max_num_batched_tokens=_int(_flag(vllm_args, ("--max-num-batched-tokens",))),
            max_model_len=context,
        ).as_dict()
    except Exception as exc:  # a prediction kvbench cannot make is a note, never a lost run
        return {"error": _one_line(exc)}
    log = parse_startup_log(log_text) if log_text else None
    measured = (
        None
        if log is None
        else {
            "weights_gib": log.weights_gib,
            "activation_gib": log.activation_gib,
            "non_torch_gib": log.non_torch_gib,
            "cudagraph_gib": log.cudagraph_actual_gib,
            "kv_pool_gib": log.available_kv_gib,
        }
    )
    return {"predicted": predicted, "measured_from_log": measured}


def _flag(args: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the first of `flags` in the vLLM arguments (`--flag V` or `--flag=V`), else None."""
    for i, arg in enumerate(args):
        for flag in flags:
            if arg == flag and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def _tensor_parallel(args: list[str], flags: tuple[str, ...] = ("--tensor-parallel-size", "-tp")) -> int:
    """--tensor-parallel-size / -tp (or the given flags) from the vLLM arguments (1 when absent)."""
    return max(1, _int(_flag(args, flags)) or 1)


def _int(text) -> int | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return int(value) if math.isfinite(value) else None


def _kv_budget_bytes(engine: EngineCapacity | None, cache_config: dict) -> int | None:
    """The bytes the engine gave its KV cache: the explicit setting, else what its log reported."""
    explicit = _int(cache_config.get("kv_cache_memory_bytes"))
    if explicit:
        return explicit
    if engine and engine.kv_cache_gib:
        return int(engine.kv_cache_gib * 2**30)
    return None


def findings(record: RunRecord, spec) -> list[Finding]:
    """Loud, plain-language findings: dtypes the platform probably did not honour, a starved client.

    A dtype whose server did not say what it runs (kv_dtype_confirmed None) gives no "not honoured"
    finding: its capacity may belong to any dtype."""
    out = _starved_client(record)
    engine = {
        d.kv_cache_dtype: d.capacity.engine.kv_tokens
        for d in record.dtypes
        if d.capacity.engine and d.kv_dtype_confirmed is not None
    }
    base = engine.get("auto")
    if spec is None or not base:
        return out
    for dtype, tokens in engine.items():
        if dtype == "auto":
            continue
        try:
            expected = format_ratio(get_format(dtype), get_format("auto"), spec)
        except UsageError:
            continue
        actual = tokens / base
        if abs(actual / expected - 1) > HONOURED_TOLERANCE:
            out.append(
                Finding(
                    level="warning",
                    kind=FindingKind.NOT_HONOURED,
                    dtype=dtype,
                    engine_ratio=actual,
                    format_ratio=expected,
                    text=(
                        f"{dtype} was probably NOT honoured on this platform: the engine holds "
                        f"{actual:.2f}x the tokens of auto, but the {dtype} format implies {expected:.2f}x "
                        f"({abs(actual / expected - 1) * 100:.0f}% off; tolerance {HONOURED_TOLERANCE * 100:.0f}%)."
                    ),
                )
            )
    return out


def comparisons(record: RunRecord) -> list[dict]:
    """Each dtype against auto: the paired difference of every repeated headline metric (95% t interval;
    beyond noise when it excludes 0), and what the front says about cost at the SLO and at the target."""
    auto = record.dtype("auto")
    if auto is None:
        return []
    out = []
    for d in record.dtypes:
        if d.kv_cache_dtype == "auto" or d.status != DtypeStatus.OK or d.emulated:  # emulated speed: not compared
            continue
        row: dict = {"kv_cache_dtype": d.kv_cache_dtype, "metrics": {}, "cost": {}}
        for metric, st in (d.fixed_stats or {}).items():
            base = (auto.fixed_stats or {}).get(metric)
            if base is not None:
                diff = repeats.paired(st.values, base.values)
                if diff is not None:
                    row["metrics"][metric] = diff
        if d.front and auto.front:
            for where in ("at_slo", "at_target"):
                mine, theirs = getattr(d.front, where), getattr(auto.front, where)
                if mine and theirs:
                    saving = front.saving_pct(mine.get("usd_per_m_output"), theirs.get("usd_per_m_output"))
                    a, b = mine.get("output_tps_per_gpu"), theirs.get("output_tps_per_gpu")
                    gain = (a / b - 1) * 100 if a and b else None
                    row["cost"][where] = {
                        "usd_per_m_output": mine.get("usd_per_m_output"),
                        "auto_usd_per_m_output": theirs.get("usd_per_m_output"),
                        "saving_pct": saving,
                        "throughput_gain_pct": gain,
                        "user_tps": mine.get("user_tps"),
                        "concurrency": mine.get("concurrency"),
                    }
        out.append(row)
    return out


def _starved_client(record: RunRecord) -> list[Finding]:
    worst = (0.0, None, None)
    for d in record.dtypes:
        for phase in d.phases:
            frac = phase.summary.client_runqueue_wait_fraction or 0.0
            if frac > worst[0]:
                worst = (frac, d.kv_cache_dtype, phase.name)
    frac, dtype, name = worst
    if frac <= STARVED_CLIENT_FRACTION:
        return []
    return [
        Finding(
            level="warning",
            kind=FindingKind.STARVED_CLIENT,
            dtype=dtype,
            text=(
                f"the load generator waited for a CPU {frac:.0%} of phase {name} ({dtype}): "
                "its latencies include its own queueing. Run on a quieter machine, "
                "or with --realtime (SCHED_FIFO; needs root or CAP_SYS_NICE)."
            ),
        )
    ]


# -- the one entry point ------------------------------------------------------------------------------


def _sigterm(*_):  # SIGTERM takes the same clean path as Ctrl-C
    raise KeyboardInterrupt


def execute(
    plan: RunPlan,
    reporter: Reporter | None = None,
    *,
    extra: dict | None = None,
    deadline_s: float | None = None,
    deadline_note: str | None = None,
    on_finish: Callable[[RunRecord], None] | None = None,
) -> tuple[RunRecord, Path]:
    """Run a plan to its record: (record, path). Every server is stopped however it ends.

    extra: top-level record fields the caller adds (asv link, nightly entry). deadline_s: stop after this
    many seconds (the record is kept, status interrupted, reason deadline). on_finish(record): called before
    the final write (e.g. to note the host load after the run). Raises RunInterrupted after writing the
    partial record when a signal or the deadline stopped the run."""
    records.check_writable(plan.results_dir, plan.machine)
    spill.check_space(plan.results_dir)
    runner = Runner(plan, reporter, extra)
    main = threading.current_thread() is threading.main_thread()
    # SIGTERM and SIGHUP (a closed terminal or ssh session) take Ctrl-C's path: the partial record is kept
    previous = {s: signal.signal(s, _sigterm) for s in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        try:
            asyncio.run(runner.run(deadline_s, deadline_note))
        except KeyboardInterrupt:
            if runner.record.stopped is None:  # before the runner could mark it (e.g. while the loop started)
                runner._finish(Stop(reason=StopReason.SIGNAL, detail="interrupted (Ctrl-C, SIGTERM or SIGHUP)"))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_all()
    if on_finish is not None:
        on_finish(runner.record)
        runner.flush()
    if runner.record.stopped is not None:
        raise RunInterrupted(runner.record, runner.path)
    if runner.spilled:
        raise spill.DiskFull(runner.record, runner.path, runner.spilled)
    return runner.record, runner.path
