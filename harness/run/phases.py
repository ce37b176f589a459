"""The phases of one dtype's run, in order, as functions over its DtypeRun (harness/run/runcontext.py):

  1. its server: started here (managed) or the --endpoint's, described and checked to run the dtype asked for;
  2. its capacity three ways (harness/server/capacitychecks.py), with /metrics before, during and after;
  3. agreement at rest: greedy outputs against auto's (the canaries then ride every load phase);
  4. the SLO search (its probes), then the concurrency sweep: the trade-off curve;
  5. the eval phase in every condition (harness/quality/evalphase.py);
  6. the fixed-load phases, each repeated; then the dtype's front.

Each load phase is harness/loadphase.load_phase. A failure ends the dtype, never the run: what it measured
is kept and the dtype is recorded partial or failed with its error and log tail.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import aiohttp

from kvbench import records
from kvbench.core import front, kvscales
from kvbench.core.errors import one_line as _one_line
from kvbench.core.telemetry import NvmlSampler
from kvbench.harness.client.backend import OpenAIBackend
from kvbench.harness.client.scheduler import Concurrency
from kvbench.harness.client.workload import Workload, make_prompts
from kvbench.harness.quality import evalphase, fidelity
from kvbench.harness.quality.agreement import Canaries, Sample, collect, compare
from kvbench.harness.run.loadphase import load_phase
from kvbench.harness.run.runcontext import (
    AGREEMENT_STREAM,
    FIXED_STREAM,
    PROBE_STREAM,
    SWEEP_STREAM,
    DtypeRun,
    prompts,
)
from kvbench.harness.run.slo import search
from kvbench.harness.server import capacitychecks, scales
from kvbench.harness.server.endpoint import Endpoint, ServerFacts, describe, redact_url
from kvbench.harness.server.lifecycle import ServerStartError, VllmServer
from kvbench.harness.server.promscrape import MetricsSampler, capacity_from_metrics, metrics_or_note
from kvbench.records import (
    Agreement,
    DtypeResult,
    DtypeStatus,
    Front,
    MeasuredCapacity,
    Phase,
    PhaseKind,
    ServerInfo,
    repeats,
)
from kvbench.specs import evaltasks
from kvbench.specs.vllm_memory import int_arg


async def measure_dtype(ctx: DtypeRun) -> None:
    """The dtype's whole run into ctx.result; its server is stopped and its telemetry kept however it ends."""
    result = ctx.result
    sampler = ctx.nvml = NvmlSampler(interval_s=0.1).start()
    try:
        endpoint = await _endpoint(ctx)
        if endpoint is None:  # the server did not start (or its emulation did not load): recorded as failed
            return
        await _measure(ctx, endpoint)
        if result.status == DtypeStatus.RUNNING:
            result.status = DtypeStatus.OK
    except Exception as exc:  # one dtype's failure never ends the run
        result.status = DtypeStatus.PARTIAL if records.measured_anything(result) else DtypeStatus.FAILED
        result.error = _one_line(exc)
        if ctx.server is not None:
            result.log_tail = ctx.server.log_tail()
    finally:
        telemetry = sampler.stop()
        result.telemetry = records.TelemetrySummary(
            available=telemetry.available,
            reason=telemetry.reason,
            interval_s=telemetry.interval_s,
            samples=ctx.run.samples.add_telemetry(ctx.dtype, telemetry),
        )
        server = ctx.server
        if server is not None:
            if result.status != DtypeStatus.OK and not result.log_tail:
                result.log_tail = server.log_tail()
            server.stop()


async def _endpoint(ctx: DtypeRun) -> Endpoint | None:
    """The --endpoint of the dtype, or its managed server started and ready (None when it failed to)."""
    plan, result, dtype = ctx.plan, ctx.result, ctx.dtype
    if plan.endpoints:
        return plan.endpoints[dtype]
    server = ctx.server = ctx.run.make_server(dtype)
    result.log_path = str(server.log_path)
    ctx.run.reporter.phase(dtype, "starting vLLM")
    server.start()
    try:
        await asyncio.to_thread(server.wait_ready, None, None)
    except ServerStartError as exc:
        result.status, result.error, result.log_tail = DtypeStatus.FAILED, str(exc), exc.log_tail
        return None
    if result.emulated and not capacitychecks.emulation_active(server, result):
        return None
    return Endpoint(server.base_url)


async def _measure(ctx: DtypeRun, endpoint: Endpoint) -> None:
    """Describe the server, its capacity, then every phase with /metrics sampled alongside."""
    plan, result, dtype, server = ctx.plan, ctx.result, ctx.dtype, ctx.server
    headers = ctx.headers = endpoint.headers
    facts = await asyncio.to_thread(describe, endpoint.url, headers)
    result.server = server_info(facts, server)
    result.scales = scale_block(ctx)
    served, asked = facts.cache_dtype, kvscales.base_dtype(dtype)  # a --kv-scales variant runs its base dtype
    result.kv_dtype_confirmed = None if served is None else served == asked
    if served is not None and served != asked:
        if server is None:  # it said otherwise at the start: it was replaced since; do not mislabel
            raise RuntimeError(f"the server at {facts.redacted} now runs kv-cache-dtype {served!r}, not {dtype!r}")
        result.warnings.append(f"server reports cache_dtype {served!r}, asked for {dtype!r}")

    before = await asyncio.to_thread(metrics_or_note, endpoint.url, headers, result.warnings)
    result.metrics.before = before.as_dict()
    engine = (server.capacity() if server else None) or capacity_from_metrics(before)
    run = ctx.run
    result.capacity = capacitychecks.capacity(
        plan, run.environment, dtype, engine, before.cache_config, facts, server, lambda: run.tokenizer
    )

    backend = ctx.backend = OpenAIBackend(
        endpoint.url,
        facts.served_model,
        api=plan.workload.api,
        request_timeout_s=plan.request_timeout_s,
        headers=headers,
    )
    sampler_http = MetricsSampler(endpoint.url, interval_s=1.0, headers=headers)
    sampler_http.start()
    try:
        await run_phases(ctx)
    finally:
        await sampler_http.stop()
        result.metrics.during = run.samples.add_metrics(dtype, sampler_http.samples)
        await backend.close()
    if server is None or server.alive():
        after = await asyncio.to_thread(metrics_or_note, endpoint.url, headers, result.warnings)
        result.metrics.after = after.as_dict()


def scale_block(ctx: DtypeRun) -> dict:
    """Where the dtype's KV scales came from (harness/server/scales.py): the checkpoint the server loaded (the run's
    model, a --kv-scales copy, or an --endpoint's local copy) and vLLM's own start-up lines."""
    server, plan = ctx.server, ctx.plan
    folder = server.config.model if server is not None else plan.model
    local = folder is not None and Path(folder).expanduser().is_dir()
    lines = server.log_lines() if server is not None else None
    return scales.block(ctx.dtype, folder if local else None, lines, scales.calibration_of(folder if local else None))


async def run_phases(ctx: DtypeRun) -> None:
    """Agreement, SLO search, sweep, eval and fixed loads, in that order, then the front."""
    plan, result = ctx.plan, ctx.result
    if plan.agreement_prompts:
        # Light load first: a dtype whose engine later dies under load still gets its accuracy measured.
        at_rest = await agreement(ctx)
        if at_rest and plan.canaries:
            backend = ctx.backend
            ctx.canaries = Canaries(
                backend.base_url, backend.model, at_rest[: plan.canaries], ctx.headers, plan.stall_timeout_s
            )

    spec = plan.workload_spec
    knee, cap = None, plan.search_cap
    paced = spec is not None and spec.kind in ("trace", "multi-turn")  # its own timing: no ladder
    if paced and (plan.slo is not None or plan.sweep):
        result.warnings.append(
            f"a {spec.kind} workload keeps its own timing: no SLO search or sweep (fixed phase only)"
        )
    if plan.slo is not None and not paced:
        knee, cap = await slo_search(ctx)
    if plan.sweep and not paced:
        await sweep(ctx, knee, cap)
    if plan.eval_tasks:
        await evaluate(ctx, knee)
    await fixed_loads(ctx)
    result.front = dtype_front(plan, result)


def _ladder_size(plan, c: int) -> int:
    """Requests of a probe or sweep point at concurrency c."""
    return max(c * plan.probe_rounds, plan.min_probe_requests)


async def slo_search(ctx: DtypeRun) -> tuple[int | None, int]:
    """The highest concurrency that meets the SLO (harness/slo.search), probed up to a cap: (knee, cap)."""
    plan, result = ctx.plan, ctx.result
    engine_conc = result.capacity.engine.max_concurrency if result.capacity.engine else None
    model_conc = result.capacity.model.max_concurrency if result.capacity.model else None
    hint = engine_conc or model_conc
    cap = plan.search_cap or (max(2, math.ceil(2 * hint)) if hint else 64)
    probe_streams = iter(range(PROBE_STREAM, PROBE_STREAM + 1000))

    async def probe(c: int):
        name, n = f"slo-c{c}", _ladder_size(plan, c)
        return await load_phase(ctx, name, PhaseKind.SLO_PROBE, Concurrency(c), n, next(probe_streams))

    found = await search(probe, plan.slo, cap=cap, hints=[engine_conc, model_conc], max_probes=plan.max_probes)
    result.capacity.measured = MeasuredCapacity(
        max_concurrency=found.max_concurrency,
        capped=found.capped,
        cap=cap,
        slo=plan.slo.as_dict(),
        probes=[vars(p) for p in found.probes],
    )
    return found.max_concurrency or None, cap


async def sweep(ctx: DtypeRun, knee: int | None, cap: int | None) -> None:
    """The concurrency ladder (sweep_ladder) past the knee; a concurrency already probed is not run again."""
    plan, result = ctx.plan, ctx.result
    measured = {p.concurrency for p in result.phases if p.concurrency and p.kind == PhaseKind.SLO_PROBE}
    engine_conc = result.capacity.engine.max_concurrency if result.capacity.engine else None
    top = min(x for x in (plan.sweep_max, cap) if x) if (plan.sweep_max or cap) else None
    for c in sweep_ladder(knee or (int(engine_conc) if engine_conc else None), top):
        if c not in measured:  # a probe at this concurrency is already a point on the curve
            n = _ladder_size(plan, c)
            await load_phase(ctx, f"sweep-c{c}", PhaseKind.SWEEP, Concurrency(c), n, SWEEP_STREAM + c)


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


async def fixed_loads(ctx: DtypeRun) -> None:
    """Every fixed load of the plan, each `repeat` times with fresh prompts (the first load's repeats give
    the headline's confidence intervals); repeat r of load i has the same prompts under every dtype."""
    plan, result = ctx.plan, ctx.result
    headline_runs = []
    for i, load in enumerate(plan.loads):
        for r in range(plan.repeat):
            name = ("fixed" if i == 0 else f"fixed-{_load_name(load)}") + (f"-r{r + 1}" if plan.repeat > 1 else "")
            stream = FIXED_STREAM + i * 100 + r
            n = plan.workload_requests if plan.workload_spec is not None else plan.workload.num_requests
            summary = await load_phase(ctx, name, PhaseKind.FIXED, load, n, stream, repeat=r)
            if i == 0:
                headline_runs.append(result.phases[-1].summary)
            if summary.all_failed:
                raise RuntimeError(f"every request of phase {name} failed: {summary.failure_reasons}")
    if len(headline_runs) > 1:
        result.fixed_stats = repeats.stats(headline_runs)


def _load_name(load) -> str:
    return f"c{load.concurrency}" if isinstance(load, Concurrency) else f"r{load.rate:g}"


async def evaluate(ctx: DtypeRun, knee: int | None) -> None:
    """The dtype's eval phase in every condition (harness/quality/evalphase.py), into `result.eval`: at load at the
    SLO's knee (else the first fixed load's concurrency), during load beside the first fixed load."""
    plan, run, result = ctx.plan, ctx.run, ctx.result
    first = plan.loads[0] if plan.loads else None
    at_load = knee or getattr(first, "concurrency", None) or 1
    tok = run.tokenizer
    phase = evalphase.EvalPhase(
        plan=plan,
        dtype=ctx.dtype,
        backend=ctx.backend,
        headers=ctx.headers,
        evaluator=run.evaluator,
        reporter=run.reporter,
        samples=run.samples,
        items=run.eval_items,
        tokenizer=tok,
        tokenizer_dir=str(plan.tokenizer or plan.model),
        max_len=ctx.max_len,
        id0_text=tok.convert_ids_to_tokens(0) if hasattr(tok, "convert_ids_to_tokens") else None,
    )
    evals: dict[str, dict] = {}
    result.eval = evals  # filled condition by condition: a run stopped mid-eval keeps the finished ones
    await phase.run(evals, at_load, first, lambda stream, n: prompts(run, stream, n))
    result.eval = dict(evals)
    await measure_fidelity(ctx, at_load)


async def measure_fidelity(ctx: DtypeRun, at_load: int) -> None:
    """Fidelity per token (harness/quality/fidelity.py) into `result.fidelity`; a failure is a warning, never raised."""
    plan, run, result = ctx.plan, ctx.run, ctx.result
    if run.fidelity is None and plan.text_fidelity:  # a real model: natural text, not the tasks' items
        from kvbench.harness.quality.textfidelity import TextFidelity

        run.fidelity = TextFidelity(run.tokenizer, **plan.text_fidelity, model=plan.model)
    if run.fidelity is None:  # every item the eval scores at rest (its first look), so KLD's interval is the items'
        per_task = plan.eval_limit or evaltasks.DEFAULT_ITEMS
        load = fidelity.LOAD_ITEMS_PER_TASK
        run.fidelity = fidelity.Fidelity(run.tokenizer, list(plan.eval_tasks), per_task, load_per_task=load)
    fid = run.fidelity
    if not fid.items:
        return

    def progress(condition: str, done: int, total: int) -> None:
        if done == 0:
            where = "at rest" if condition == "rest" else f"at concurrency {at_load}"
            run.reporter.phase(ctx.dtype, f"fidelity {where} ({total} items, top-{fid.k} prompt_logprobs)", total)
        else:
            run.reporter.advance(done, total)

    fid.on_progress = progress
    try:
        backend = ctx.backend
        args = (backend.base_url, backend.model, ctx.dtype, at_load, ctx.headers, plan.stall_timeout_s, run.samples)
        result.fidelity = await fid.measure(*args) or None
    except Exception as exc:  # a server gone mid-scoring: the record says so, the run goes on
        result.warnings.append(f"fidelity not measured: {_one_line(exc)}")
    result.warnings.extend(fid.problems.pop(ctx.dtype, []))  # a condition the server's answers broke (K-B18)


async def agreement(ctx: DtypeRun) -> list[dict] | None:
    """Greedy outputs of the agreement prompts, against auto's (auto's become the reference); returns the
    samples (the canaries' answers at rest), None when this part failed."""
    plan, run, result, dtype, backend = ctx.plan, ctx.run, ctx.result, ctx.dtype, ctx.backend
    run.reporter.phase(dtype, "agreement (greedy outputs vs auto)")
    tokens, prompt_tokens = plan.agreement_tokens, plan.workload.prompt_tokens
    max_len = ctx.max_len
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
    texts = [p.content for p in make_prompts(w, run.tokenizer, stream=AGREEMENT_STREAM)]
    record = Agreement(prompts=len(texts), prompt_tokens=prompt_tokens, tokens=tokens)
    result.agreement = record
    try:
        reference = [Sample(**r) for r in run.reference] if run.reference is not None else None
        data = await collect(
            backend.base_url, backend.model, texts, tokens, reference, plan.stall_timeout_s, ctx.headers
        )
    except (TimeoutError, aiohttp.ClientError, KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        # This part failed; the load phases still run (and find out for themselves if the server is gone): an
        # answer of the wrong shape is this optional part's failure, never the dtype's (K-B19).
        record.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return None
    run.samples.add_agreement(dtype, data["samples"], data["teacher_forced"])
    if dtype == "auto":
        run.reference = data["samples"]
    elif run.reference is not None:
        record.vs_auto = compare(run.reference, data["samples"], data["teacher_forced"])
    return data["samples"]


def dtype_front(plan, result: DtypeResult) -> Front | None:
    """Every closed-loop phase as a point (one per concurrency: a sweep point, else a probe, else the first
    fixed run), the Pareto front, and the cost where a price was given."""
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
        at_target["usd_per_m_output"] = front.usd_per_million(at_target["output_tps_per_gpu"], plan.price_per_gpu_hour)
    return Front(
        gpus=plan.gpus,
        price_per_gpu_hour=plan.price_per_gpu_hour,
        price_key=plan.price_key,
        points=[p.as_dict() for p in pts],
        at_slo=best.as_dict() if best else None,
        at_target=at_target,
        target_user_tps=target,
    )


def server_info(facts: ServerFacts, server: VllmServer | None) -> ServerInfo:
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
        block_size=int_arg(cc.get("block_size")),
        num_gpu_blocks=int_arg(cc.get("num_gpu_blocks")),
    )
