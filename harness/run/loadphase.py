"""One load phase of a dtype's run, measured and recorded: the load itself (harness/scheduler.run_load) with
its warm-up, the canaries riding inside it, the prefix cache's counters around it, its energy, then the
server's health (and for an --endpoint, that it is still the server described at the start).

Once the load has run, what it measured is recorded even when a Ctrl-C arrives while the canaries or
/metrics are awaited: the phase is appended to the dtype's record first, and the run stops after that.
"""

from __future__ import annotations

import asyncio
import math

import aiohttp

from kvbench.core.errors import one_line as _one_line
from kvbench.core.logparse import engine_failure
from kvbench.harness.client.metrics import distribution, summarize
from kvbench.harness.client.scheduler import run_load
from kvbench.harness.run.runcontext import WARMUP_STREAM, DtypeRun, prompts, traffic
from kvbench.harness.server import energy
from kvbench.harness.server.endpoint import describe, server_changes
from kvbench.harness.server.lifecycle import healthy
from kvbench.harness.server.promscrape import fetch_metrics
from kvbench.records import Finding, Phase, PhaseKind, PhaseSummary
from kvbench.records.findings import FindingKind


async def load_phase(ctx: DtypeRun, name: str, kind: PhaseKind, load, n: int | None, stream: int, repeat: int = 0):
    """Run one phase (n requests from seed stream `stream`), append it to the dtype's phases and return its
    metrics summary; raise when the engine died, hung or (an --endpoint) changed during it."""
    plan, run, backend = ctx.plan, ctx.run, ctx.backend
    items, outputs, load = traffic(ctx, stream, n, load)
    run.reporter.phase(ctx.dtype, name, total=len(items))
    warm = prompts(run, stream + WARMUP_STREAM, plan.warmup_requests) if plan.warmup_requests else ()
    rapl_before = energy.rapl_read(run.rapl) if run.rapl else None
    counters = await prefix_counters(backend, ctx.headers) if kind == PhaseKind.FIXED else None
    riding = asyncio.ensure_future(ctx.canaries.ride()) if ctx.canaries else None
    load_result = await run_load(
        backend,
        items,
        outputs,
        load,
        stall_timeout_s=plan.stall_timeout_s,
        on_progress=run.reporter.advance,
        warmup_prompts=warm,
        realtime=plan.client_realtime,
    )
    interrupted, canary, prefix = await _after_load(ctx, load_result, riding, counters)
    run_summary = _record(ctx, name, kind, load, repeat, load_result, rapl_before, canary, prefix)
    if interrupted:  # run_load keeps what it measured on Ctrl-C; the run stops here
        raise asyncio.CancelledError
    await _check_server(ctx, name, load_result)
    return run_summary


async def _after_load(ctx: DtypeRun, load_result, riding, counters) -> tuple[bool, dict | None, dict | None]:
    """(interrupted, canaries, prefix cache) of a phase whose load has run."""
    # From here the load is measured: a Ctrl-C while the canaries or /metrics are awaited must not lose
    # the phase, so it is noted, the phase is recorded, and the run stops after that.
    interrupted = load_result.interrupted
    canary = None
    if riding is not None:
        try:
            canary = await asyncio.wait_for(riding, timeout=ctx.plan.stall_timeout_s)
        except (TimeoutError, aiohttp.ClientError) as exc:
            canary = {"error": _one_line(exc)}
        except asyncio.CancelledError:
            interrupted, canary = True, {"error": "interrupted before the canaries came back"}
    prefix = None
    if counters:
        try:
            prefix = await prefix_cache(ctx.backend, ctx.headers, counters, load_result)
        except asyncio.CancelledError:
            interrupted = True
    return interrupted, canary, prefix


def _record(ctx: DtypeRun, name, kind, load, repeat, load_result, rapl_before, canary, prefix):
    """Append the phase (and its requests to the samples); return its metrics summary."""
    slo, samples, result = ctx.plan.slo, ctx.run.samples, ctx.result
    run_summary = summarize(load_result, slo)
    summary = run_summary.as_dict()
    summary.pop("definitions", None)  # once per record, not per phase
    index = len(result.phases)
    samples.add_requests(ctx.dtype, name, kind, index, load_result.warmup, warmup=True)
    count = samples.add_requests(ctx.dtype, name, kind, index, load_result.results)
    rate = getattr(load, "rate", None)
    start = load_result.started_at_monotonic
    spent = phase_energy(ctx, start, start + load_result.duration_s, rapl_before)
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
    return run_summary


async def _check_server(ctx: DtypeRun, name: str, load_result) -> None:
    """The engine must be alive and answering /health after the phase, and have made progress during it."""
    server, backend, plan = ctx.server, ctx.backend, ctx.plan
    alive = server.alive() if server else True
    if not alive or not await asyncio.to_thread(healthy, backend.base_url, 10.0, ctx.headers):
        cause = engine_failure(server.log_lines()) if server else None
        raise RuntimeError(f"vLLM engine died during {name}: {cause or 'server stopped answering /health'}")
    if load_result.stalled:
        raise RuntimeError(f"no progress for {plan.stall_timeout_s:g} s during {name}: server hung")
    if server is None:
        await same_server(ctx, backend.base_url, name)


async def same_server(ctx: DtypeRun, url: str, after: str) -> None:
    """An --endpoint server must be the one described at the start after every phase (same model, context
    and cache configuration); a changed one ends the dtype (its measured phases are kept) with an error."""
    changes = server_changes(ctx.result.server, await asyncio.to_thread(describe, url, ctx.headers))
    if changes:
        text = f"the server changed after phase {after}: {'; '.join(changes)}; later phases not run"
        dtype = ctx.dtype
        ctx.run.changed.append(
            Finding(level="error", kind=FindingKind.SERVER_CHANGED, dtype=dtype, text=f"{dtype}: {text}")
        )
        raise RuntimeError(text)


async def prefix_counters(backend, headers: dict) -> dict | None:
    """vLLM's prefix-cache and preemption counters now (None when the server does not say them)."""
    try:
        snap = await asyncio.to_thread(fetch_metrics, backend.base_url, 5.0, headers)
    except Exception:  # a server without /metrics: the phase simply has no prefix-cache numbers
        return None
    return {k: snap.values.get(k) for k in ("prefix_cache_queries", "prefix_cache_hits", "preemptions")}


async def prefix_cache(backend, headers: dict, before: dict, load_result) -> dict:
    """The phase's prefix-cache hit rate (from /metrics, in tokens), preemptions, and TTFT of requests that
    hit the cache against those that did not (from usage.prompt_tokens_details.cached_tokens)."""
    after = await prefix_counters(backend, headers) or {}

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


def phase_energy(ctx: DtypeRun, start: float, end: float, rapl_before) -> energy.Energy:
    """Energy of the phase just measured: NVML on a GPU, RAPL on a CPU that exposes it, else unavailable."""
    nvml, rapl = ctx.nvml, ctx.run.rapl
    if nvml is not None and nvml.result.available:
        return energy.nvml_energy(list(nvml.result.samples), list(nvml.result.fields), start, end)
    if rapl:
        return energy.rapl_energy(rapl_before, energy.rapl_read(rapl), end - start)
    return energy.unavailable()
