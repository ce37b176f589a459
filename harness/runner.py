"""One `kvbench run`: for each KV-cache dtype, a vLLM server, its capacity three ways, an SLO search and
fixed-load phases, with /metrics and NVML alongside; one record, flushed after every dtype.

A dtype that fails (bad flag, OOM, server killed mid-run) is recorded as that dtype's failure with its log
tail, and the run goes on with the next one. Nothing measured is dropped: an interrupted run writes what
it has, marked "interrupted".
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kvbench.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, budget_from_bytes, capacity_row
from kvbench.errors import UsageError
from kvbench.formats import format_ratio, get_format
from kvbench.harness import records
from kvbench.harness.agreement import Sample, collect, compare
from kvbench.harness.backend import OpenAIBackend
from kvbench.harness.logparse import EngineCapacity, engine_failure
from kvbench.harness.machine import environment, machine_name
from kvbench.harness.metrics import SLO, summarize
from kvbench.harness.promscrape import MetricsSampler, capacity_from_metrics, fetch_metrics
from kvbench.harness.scheduler import Concurrency, Rate, run_load
from kvbench.harness.server import ServerConfig, ServerStartError, VllmServer, healthy
from kvbench.harness.slo import Objective, search
from kvbench.harness.telemetry import NvmlSampler
from kvbench.harness.workload import Workload, make_prompts
from kvbench.models import load_model

# Two capacity ratios (engine vs format) further apart than this mean the dtype was probably not honoured.
HONOURED_TOLERANCE = 0.05
# A client that waited for a CPU this share of a phase measured its own queueing, not the server.
STARVED_CLIENT_FRACTION = 0.05
# The agreement prompts' seed stream: the same prompts for every dtype, never reused by a load phase.
AGREEMENT_STREAM = 10_000
# A P95 needs enough samples to mean something; small concurrencies still get this many requests.
MIN_PROBE_REQUESTS = 16


@dataclass
class RunPlan:
    model: str  # local path or HF id (the server's --model)
    kv_dtypes: list[str]
    workload: Workload
    loads: list[Concurrency | Rate]  # the fixed-load phases, in order
    objective: Objective | None = None  # SLO search when set
    search_cap: int | None = None  # highest concurrency to probe (default: 2x the engine's capacity)
    max_probes: int = 12
    probe_rounds: int = 3  # requests per probe = rounds x concurrency
    endpoint: str | None = None  # benchmark a running server instead of starting one
    extra_args: list[str] = field(default_factory=list)
    server_env: dict[str, str] = field(default_factory=dict)
    max_model_len: int | None = None
    results_dir: Path = Path("results")
    startup_timeout_s: float = 600.0
    stall_timeout_s: float = 60.0
    request_timeout_s: float = 600.0
    warmup_requests: int = 2
    model_name: str | None = None  # how records name the model (the tiny model's short name, an HF id)
    unsupported: dict[str, str] = field(default_factory=dict)  # dtype -> why it is recorded, not run
    client_realtime: bool = False  # SCHED_FIFO for the client (see harness/clientsched.py), where permitted
    agreement_prompts: int = 8  # end-to-end accuracy vs auto (harness/agreement.py); 0 turns it off
    agreement_tokens: int = 32
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "model_name": self.model_name or self.model,
            "kv_dtypes": self.kv_dtypes,
            "workload": self.workload.as_dict(),
            "loads": [load.describe() for load in self.loads],
            "slo": vars(self.objective) if self.objective else None,
            "search_cap": self.search_cap,
            "max_probes": self.max_probes,
            "probe_rounds": self.probe_rounds,
            "endpoint": self.endpoint,
            "extra_args": self.extra_args,
            "server_env": self.server_env,
            "max_model_len": self.max_model_len,
            "stall_timeout_s": self.stall_timeout_s,
            "unsupported": self.unsupported,
            "client_realtime": self.client_realtime,
            "agreement": {"prompts": self.agreement_prompts, "tokens": self.agreement_tokens},
            "notes": self.notes,
        }


def _load_name(load) -> str:
    return f"c{load.concurrency}" if isinstance(load, Concurrency) else f"r{load.rate:g}"


class Reporter:
    """What the runner tells its caller (the CLI draws progress bars from it). Silent by default."""

    def dtype_started(self, dtype: str, index: int, total: int) -> None: ...
    def phase(self, dtype: str, text: str, total: int | None = None) -> None: ...
    def advance(self, done: int, total: int) -> None: ...
    def note(self, text: str) -> None: ...


class Runner:
    def __init__(self, plan: RunPlan, reporter: Reporter | None = None):
        self.plan = plan
        self.reporter = reporter or Reporter()
        self.machine = machine_name()
        self.run_id = records.new_run_id(self.machine)
        self.path = records.record_path(plan.results_dir, self.machine, self.run_id)
        self._current: VllmServer | None = None  # the server of the dtype being measured
        self._reference: list[dict] | None = None  # auto's greedy samples, for end-to-end agreement
        self.doc = {
            "schema": records.SCHEMA,
            "run_id": self.run_id,
            "created_at": records.utc_now(),
            "status": "running",
            "machine": self.machine,
            "config": plan.as_dict(),
            "environment": environment(),
            "dtypes": [],
            "findings": [],
        }

    def flush(self) -> Path:
        return records.write_atomic(self.path, self.doc)

    async def run(self) -> dict:
        # The 16-bit baseline runs first, so every quantized dtype can be compared with its outputs.
        order = sorted(self.plan.kv_dtypes, key=lambda d: d != "auto")
        try:
            for i, dtype in enumerate(order):
                self.reporter.dtype_started(dtype, i, len(self.plan.kv_dtypes))
                result = {"kv_cache_dtype": dtype, "status": "running", "phases": []}
                self.doc["dtypes"].append(result)
                if dtype in self.plan.unsupported:
                    result.update(status="unsupported", error=self.plan.unsupported[dtype])
                else:
                    await self._one_dtype(dtype, result)
                self.flush()
            self.doc["findings"] = findings(self.doc, self._model_spec())
            statuses = {d["status"] for d in self.doc["dtypes"]}
            if statuses <= {"ok", "unsupported"}:
                self.doc["status"] = "complete"
            else:
                self.doc["status"] = "failed" if statuses <= {"failed", "unsupported"} else "partial"
        except (KeyboardInterrupt, asyncio.CancelledError):
            self.doc["status"] = "interrupted"
            for d in self.doc["dtypes"]:
                if d["status"] == "running":
                    d["status"] = "partial"
                    d["error"] = "interrupted (Ctrl-C)"
            raise
        finally:
            self.doc["finished_at"] = records.utc_now()
            self.flush()
        return self.doc

    # -- one dtype --------------------------------------------------------------------------------

    async def _one_dtype(self, dtype: str, result: dict) -> None:
        plan = self.plan
        server = None
        sampler = NvmlSampler(interval_s=0.1).start()
        try:
            if plan.endpoint:
                base_url = plan.endpoint.rstrip("/")
            else:
                server = self._current = self._server(dtype)
                result["log_path"] = str(server.log_path)
                self.reporter.phase(dtype, "starting vLLM")
                server.start()
                try:
                    await asyncio.to_thread(server.wait_ready, None, None)
                except ServerStartError as exc:
                    result.update(status="failed", error=str(exc), log_tail=exc.log_tail)
                    return
                result["server"] = {"base_url": server.base_url, "ready_after_s": server.ready_after_s}
                base_url = server.base_url

            before = await asyncio.to_thread(fetch_metrics, base_url)
            result["metrics"] = {"before": before.as_dict()}
            engine = (server.capacity() if server else None) or capacity_from_metrics(before)
            result["capacity"] = self._capacity(dtype, engine, before.cache_config)
            served = before.cache_config.get("cache_dtype")
            if served and served != dtype:
                result.setdefault("warnings", []).append(f"server reports cache_dtype {served!r}, asked for {dtype!r}")

            backend = OpenAIBackend(base_url, await self._served_model(base_url), api=plan.workload.api,
                                    request_timeout_s=plan.request_timeout_s)
            sampler_http = MetricsSampler(base_url, interval_s=1.0)
            sampler_http.start()
            try:
                await self._phases(dtype, backend, result, server)
            finally:
                await sampler_http.stop()
                result["metrics"]["during"] = [s.as_dict() for s in sampler_http.samples]
                await backend.close()
            if server is None or server.alive():
                result["metrics"]["after"] = (await asyncio.to_thread(fetch_metrics, base_url)).as_dict()
            if result["status"] == "running":
                result["status"] = "ok"
        except Exception as exc:  # one dtype's failure never ends the run
            result["status"] = "partial" if result.get("phases") else "failed"
            result["error"] = f"{type(exc).__name__}: {exc}"
            if server is not None:
                result["log_tail"] = server.log_tail()
        finally:
            result["telemetry"] = sampler.stop().as_dict()
            if server is not None:
                if result["status"] != "ok" and "log_tail" not in result:
                    result["log_tail"] = server.log_tail()
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
        log = Path(plan.results_dir) / self.machine / "logs" / self.run_id / f"vllm-{dtype}.log"
        return VllmServer(cfg, log)

    async def _served_model(self, base_url: str) -> str:
        async with aiohttp.ClientSession() as s, s.get(f"{base_url}/v1/models") as resp:
            data = await resp.json()
        return data["data"][0]["id"]

    def _model_spec(self):
        try:
            return load_model(self.plan.model)
        except UsageError:
            return None  # an HF id whose config is not on disk: no model-side prediction

    def _capacity(self, dtype: str, engine: EngineCapacity | None, cache_config: dict) -> dict:
        """Engine-reported capacity, and the capacity model's prediction for the same budget and block size."""
        out: dict = {"engine": vars(engine) if engine else None, "model": None, "measured": None}
        spec = self._model_spec()
        budget_bytes = _kv_budget_bytes(engine, cache_config)
        block = _int(cache_config.get("block_size"))
        context = self.plan.max_model_len or (engine.tokens_per_request if engine else None)
        if spec and budget_bytes and block and context:
            try:
                fmt = get_format(dtype)
            except UsageError:
                fmt = None
            if fmt is not None:
                gpu = self._catalog_gpu()
                row = capacity_row(spec, fmt, context, budget_from_bytes(budget_bytes, "engine's KV memory"), gpu, block_size=block)
                out["model"] = {
                    "kv_tokens": row.kv_tokens,
                    "max_concurrency": row.max_concurrency,
                    "num_blocks": row.num_blocks,
                    "budget_bytes": budget_bytes,
                    "block_size": block,
                    "context": context,
                    "format": fmt.key,
                    "gpu": gpu.key if gpu else None,
                    "activation_overhead_bytes": self._overhead(spec, budget_bytes, cache_config),
                }
        return out

    def _catalog_gpu(self):
        from kvbench.gpus import match_nvml_name

        gpus = self.doc["environment"].get("gpus") or []
        return match_nvml_name(gpus[0]["name"]) if gpus else None

    def _overhead(self, spec, budget_bytes: int, cache_config: dict) -> int | None:
        """What vLLM kept back besides weights and KV cache (activations, CUDA graphs, non-torch memory), per
        GPU: device memory x utilization - weights / TP - KV budget. The number `kvbench capacity
        --overhead-gb` asks for; only on a GPU whose KV budget vLLM derived itself."""
        gpus = self.doc["environment"].get("gpus") or []
        if not gpus or _int(cache_config.get("kv_cache_memory_bytes")):
            return None
        util = float(cache_config.get("gpu_memory_utilization") or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
        tp = _tensor_parallel(self.plan.extra_args)
        return int(gpus[0]["memory_bytes"] * util - spec.weight_bytes / tp - budget_bytes)

    async def _phases(self, dtype: str, backend, result: dict, server: VllmServer | None) -> None:
        plan = self.plan
        slo = SLO(ttft_ms=plan.objective.ttft_p95_ms, tpot_ms=plan.objective.tpot_p95_ms) if plan.objective else None
        stream = 0

        def prompts(n: int):
            # A fresh prompt stream per phase: vLLM's prefix cache must never see a repeat.
            nonlocal stream
            stream += 1
            w = Workload(**{**plan.workload.as_dict(), "num_requests": n})
            return make_prompts(w, self._tokenizer, stream=stream)

        async def phase(name: str, load, n: int):
            self.reporter.phase(dtype, name, total=n)
            warm = prompts(plan.warmup_requests) if plan.warmup_requests else ()
            load_result = await run_load(
                backend,
                prompts(n),
                plan.workload.output_tokens,
                load,
                stall_timeout_s=plan.stall_timeout_s,
                on_progress=self.reporter.advance,
                warmup_prompts=warm,
                realtime=plan.client_realtime,
            )
            summary = summarize(load_result, slo)
            result["phases"].append(
                {"name": name, "mode": load.describe(), "summary": summary.as_dict(), "requests": [r.as_dict() for r in load_result.results]}
            )
            if load_result.interrupted:  # run_load keeps what it measured on Ctrl-C; the run stops here
                raise asyncio.CancelledError
            if not (server.alive() if server else True) or not await asyncio.to_thread(healthy, backend.base_url, 10.0):
                cause = engine_failure(server.log_lines()) if server else None
                raise RuntimeError(f"vLLM engine died during {name}: {cause or 'server stopped answering /health'}")
            if load_result.stalled:
                raise RuntimeError(f"no progress for {plan.stall_timeout_s:g} s during {name}: server hung")
            return summary

        if plan.agreement_prompts:
            # Light load first: a dtype whose engine later dies under load still gets its accuracy measured.
            await self._agreement(dtype, backend, result)

        if plan.objective is not None:
            engine = (result["capacity"] or {}).get("engine") or {}
            engine_conc = engine.get("max_concurrency")
            cap = plan.search_cap or (max(2, math.ceil(2 * engine_conc)) if engine_conc else 64)

            async def probe(c: int):
                return await phase(f"slo-c{c}", Concurrency(c), max(c * plan.probe_rounds, MIN_PROBE_REQUESTS))

            found = await search(probe, plan.objective, cap=cap, max_probes=plan.max_probes)
            result["capacity"]["measured"] = {
                "max_concurrency": found.max_concurrency,
                "capped": found.capped,
                "cap": cap,
                "slo": vars(plan.objective),
                "probes": [vars(p) for p in found.probes],
            }

        for i, load in enumerate(plan.loads):
            name = "fixed" if i == 0 else f"fixed-{_load_name(load)}"
            summary = await phase(name, load, plan.workload.num_requests)
            if summary.all_failed:
                raise RuntimeError(f"every request of phase {name} failed: {summary.failure_reasons}")

    async def _agreement(self, dtype: str, backend, result: dict) -> None:
        plan = self.plan
        self.reporter.phase(dtype, "agreement (greedy outputs vs auto)")
        tokens, prompt_tokens = plan.agreement_tokens, plan.workload.prompt_tokens
        if plan.max_model_len:
            # Scoring sends prompt + continuation + 1 new token: all of it must fit in max_model_len.
            tokens = min(tokens, max(1, plan.max_model_len // 4))
            prompt_tokens = max(1, min(prompt_tokens, plan.max_model_len - tokens - 1))
        w = Workload(**{**plan.workload.as_dict(), "prompt_tokens": prompt_tokens, "num_requests": plan.agreement_prompts, "api": "completions"})
        prompts = [p.content for p in make_prompts(w, self._tokenizer, stream=AGREEMENT_STREAM)]
        try:
            reference = [Sample(**r) for r in self._reference] if self._reference is not None else None
            data = await collect(backend.base_url, backend.model, prompts, tokens, reference, plan.stall_timeout_s)
        except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError) as exc:
            # This part failed; the load phases still run (and find out for themselves if the server is gone).
            result["agreement"] = {"error": f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__}
            return
        data.update(prompt_tokens=prompt_tokens, tokens=tokens)
        if dtype == "auto":
            self._reference = data["samples"]
        elif self._reference is not None:
            data["vs_auto"] = compare(self._reference, data["samples"], data["teacher_forced"])
        result["agreement"] = data

    @property
    def _tokenizer(self):
        if not hasattr(self, "_tok"):
            from kvbench.harness.workload import load_tokenizer

            self._tok = load_tokenizer(self.plan.model)
        return self._tok



def _tensor_parallel(args: list[str]) -> int:
    """--tensor-parallel-size / -tp from the vLLM arguments (1 when absent)."""
    for i, arg in enumerate(args):
        for flag in ("--tensor-parallel-size", "-tp"):
            if arg == flag and i + 1 < len(args):
                return max(1, _int(args[i + 1]) or 1)
            if arg.startswith(flag + "="):
                return max(1, _int(arg.split("=", 1)[1]) or 1)
    return 1


def _int(text) -> int | None:
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return None


def _kv_budget_bytes(engine: EngineCapacity | None, cache_config: dict) -> int | None:
    """The bytes the engine gave its KV cache: the explicit setting, else what its log reported."""
    explicit = _int(cache_config.get("kv_cache_memory_bytes"))
    if explicit:
        return explicit
    if engine and engine.kv_cache_gib:
        return int(engine.kv_cache_gib * 2**30)
    return None


def findings(doc: dict, spec) -> list[dict]:
    """Loud, plain-language findings: dtypes the platform probably did not honour, a starved client."""
    out = _starved_client(doc)
    engine = {
        d["kv_cache_dtype"]: ((d.get("capacity") or {}).get("engine") or {}).get("kv_tokens")
        for d in doc["dtypes"]
    }
    base = engine.get("auto")
    if spec is None or not base:
        return out
    for dtype, tokens in engine.items():
        if dtype == "auto" or not tokens:
            continue
        try:
            expected = format_ratio(get_format(dtype), get_format("auto"), spec)
        except UsageError:
            continue
        actual = tokens / base
        if abs(actual / expected - 1) > HONOURED_TOLERANCE:
            out.append(
                {
                    "level": "warning",
                    "dtype": dtype,
                    "engine_ratio": actual,
                    "format_ratio": expected,
                    "text": (
                        f"{dtype} was probably NOT honoured on this platform: the engine holds {actual:.2f}x the tokens of "
                        f"auto, but the {dtype} format implies {expected:.2f}x ({abs(actual / expected - 1) * 100:.0f}% off; "
                        f"tolerance {HONOURED_TOLERANCE * 100:.0f}%)."
                    ),
                }
            )
    return out


def run_plan(plan: RunPlan, reporter: Reporter | None = None) -> tuple[dict, Path]:
    runner = Runner(plan, reporter)
    doc = asyncio.run(runner.run())
    return doc, runner.path


def _starved_client(doc: dict) -> list[dict]:
    worst = (0.0, None, None)
    for d in doc["dtypes"]:
        for phase in d.get("phases", []):
            frac = (phase.get("summary") or {}).get("client_runqueue_wait_fraction") or 0.0
            if frac > worst[0]:
                worst = (frac, d["kv_cache_dtype"], phase["name"])
    frac, dtype, name = worst
    if frac <= STARVED_CLIENT_FRACTION:
        return []
    return [{
        "level": "warning",
        "dtype": dtype,
        "text": (
            f"the load generator waited for a CPU {frac:.0%} of phase {name} ({dtype}): its latencies include its own "
            "queueing. Run on a quieter machine, or with --realtime (SCHED_FIFO; needs root or CAP_SYS_NICE)."
        ),
    }]
