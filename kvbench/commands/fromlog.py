"""`kvbench capacity --from-log FILE`: vLLM's own start-up figures next to kvbench's prediction, term by term."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from kvbench.capacity import capacity_for_ranks
from kvbench.commands.fromlog_hybrid import cut_settings, kv_terms, print_kv_terms, terms_as_json
from kvbench.errors import UsageError
from kvbench.formats import get_format, tracked_dtypes
from kvbench.gpus import GpuSpec, catalog, get_gpu
from kvbench.logparse import StartupLog, parse_startup_log, split_startups
from kvbench.models import ModelSpec, by_hf_id, load_model
from kvbench.output import console, err_console, print_json
from kvbench.units import GiB
from kvbench.vllm_memory import NonKvEstimate, predict_non_kv, server_inputs

MAX_LOG_BYTES = 256 << 20  # a start-up log is kilobytes; a request log of days is not what --from-log reads


@dataclass(frozen=True)
class Comparison:
    term: str
    logged: float | None  # GiB, or tokens for kv_tokens
    predicted: float
    unit: str

    @property
    def error(self) -> float | None:
        return None if self.logged is None else self.predicted - self.logged

    @property
    def error_pct(self) -> float | None:
        return None if not self.logged else 100 * (self.predicted - self.logged) / self.logged


def gpu_for_total(total_gib: float | None) -> GpuSpec | None:
    """The catalog GPU whose torch-reported total is within 0.1 GiB of what the log says."""
    if total_gib is None:
        return None
    near = [g for g in catalog().values() if g.torch_total_gib and abs(g.torch_total_gib - total_gib) <= 0.1]
    return min(near, key=lambda g: abs(g.torch_total_gib - total_gib)) if near else None


@dataclass(frozen=True)
class LogOverrides:
    """What the command line says over (or in place of) the log: `capacity`'s flags, None where not given."""

    model: str | None = None
    gpu: str | None = None
    context: int | None = None
    kv_dtype: str | None = None
    utilization: float | None = None
    tp: int | None = None
    pp: int | None = None
    weights: str | None = None
    vllm_version: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None


def predict_for_log(log: StartupLog, source: Path, flags: LogOverrides = LogOverrides()):
    """kvbench's prediction with the log's settings, flags filling what it does not say (and overriding it)."""
    spec = resolve_model_for_log(flags.model, log.model, source)
    card = get_gpu(flags.gpu) if flags.gpu else gpu_for_total(log.total_gib)
    if card is None:
        raise UsageError(f"{source}: no GPU in kvbench's catalog reports {log.total_gib} GiB; pass --gpu")
    max_len = flags.context or log.max_model_len
    if max_len is None:
        raise UsageError(f"{source}: the log does not say max_model_len; pass --context")
    args = log.args
    inputs = server_inputs(args)  # what the server was started with, by vLLM's names; the flags override it
    if flags.weights not in (None, "auto"):
        inputs.update(weights=flags.weights, dtype=None)
    if flags.tp and flags.tp > 1:
        inputs["tensor_parallel_size"] = flags.tp
    if flags.pp and flags.pp > 1:
        inputs["pipeline_parallel_size"] = flags.pp
    inputs["max_num_seqs"] = flags.max_num_seqs or inputs["max_num_seqs"]
    inputs["max_num_batched_tokens"] = flags.max_num_batched_tokens or inputs["max_num_batched_tokens"]
    fmt = get_format(flags.kv_dtype or str(args.get("kv_cache_dtype", "auto")))
    est = predict_non_kv(
        spec,
        card,
        utilization=flags.utilization if flags.utilization is not None else log.utilization,
        **inputs,
        vllm_version=flags.vllm_version or log.vllm_version,
        max_model_len=max_len,
    )
    block = flags.block_size or args.get("block_size") or 16
    version = flags.vllm_version or log.vllm_version
    row = capacity_for_ranks(spec, [fmt], max_len, est, card, block, vllm_version=version)[0]
    return spec, card, est, row, max_len


def row_format(row):
    """The CacheFormat a capacity row was computed for."""
    return get_format(row.dtype)


def read_log(path: Path) -> str:
    """The log's text; a folder, a device, a pipe or a file of more than MAX_LOG_BYTES is one line, not a hang."""
    try:
        if not path.is_file():
            raise UsageError(f"--from-log {path}: not a regular file; give a vLLM start-up log")
        if path.stat().st_size > MAX_LOG_BYTES:
            raise UsageError(
                f"--from-log {path}: {path.stat().st_size / 2**20:,.0f} MiB is more than a start-up log "
                f"({MAX_LOG_BYTES >> 20} MiB at most); cut the start-up out (e.g. with head or grep)"
            )
        with path.open("rb") as fh:
            return fh.read(MAX_LOG_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"--from-log {path}: cannot read ({exc.strerror or exc})") from None


def choose_startup(path: Path, text: str, start: int | None) -> tuple[StartupLog, int, int]:
    """(the start-up to read, its number from 1, how many the log holds): `start`, else the last complete one (a
    restarted container's log holds several, and figures from two start-ups must never mix)."""
    logs = [parse_startup_log(part) for part in split_startups(text)]
    complete = [i + 1 for i, log in enumerate(logs) if log.has_capacity]
    if start is not None:
        if not 1 <= start <= len(logs):
            raise UsageError(f"--start {start}: {path} holds {len(logs)} start-up(s); choose from 1 to {len(logs)}")
        if start not in complete:
            raise UsageError(
                f"--start {start}: start-up {start} of {path} has no KV-cache capacity line (it did not finish "
                f"starting); complete start-ups: {', '.join(map(str, complete)) or 'none'}"
            )
        return logs[start - 1], start, len(logs)
    if not complete:
        raise UsageError(
            f"{path}: no KV-cache capacity line ('Available KV cache memory' or 'KV cache size') in this log"
        )
    return logs[complete[-1] - 1], complete[-1], len(logs)


def comparisons(log: StartupLog, est: NonKvEstimate, kv_tokens: int) -> list[Comparison]:
    """Term by term; the first stage's rank is the one whose figures vLLM logs first."""
    s = est.stages[0]
    graph_logged = (
        log.cudagraph_estimate_gib
        if est.release.subtracts_cudagraph
        else (0.0 if log.cudagraph_estimate_gib is not None else None)
    )
    out = [
        Comparison("device total", log.total_gib, s.total.bytes / GiB, "GiB"),
        Comparison(
            "requested (x utilization)",
            log.total_gib * log.utilization if log.total_gib and log.utilization else None,
            s.requested.bytes / GiB,
            "GiB",
        ),
        Comparison("weights", log.weights_gib, s.weights.bytes / GiB, "GiB"),
        Comparison("activation peak", log.activation_gib, s.activation.bytes / GiB, "GiB"),
        Comparison("non-torch", log.non_torch_gib, s.non_torch.bytes / GiB, "GiB"),
        Comparison("CUDA graphs subtracted", graph_logged, s.cudagraph.bytes / GiB, "GiB"),
        Comparison("KV pool per GPU", log.available_kv_gib, s.kv_pool.bytes / GiB, "GiB"),
        Comparison("KV tokens (group)", log.kv_tokens, kv_tokens, "tokens"),
    ]
    return out


def compare_log(settings) -> None:
    """`capacity --from-log`: `settings` are the command's CapacitySettings (kvbench/commands/capacity_settings.py)."""
    s = settings
    path, picked, as_json, vllm_version = s.from_log, s.start, s.as_json, s.vllm_version
    text = read_log(Path(path))
    log, start, count = choose_startup(Path(path), text, picked)
    note = _start_note(path, count, start, picked)
    kv = None if s.kv_dtype == ",".join(tracked_dtypes()) else s.kv_dtype  # the default: take the log's dtype instead
    flags = LogOverrides(
        model=s.model,
        gpu=s.gpu,
        context=s.context,
        kv_dtype=kv,
        utilization=s.gpu_memory_utilization,
        tp=s.tensor_parallel_size,
        pp=s.pipeline_parallel_size,
        weights=s.weights,
        vllm_version=vllm_version,
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        block_size=s.block_size,
    )
    cut = cut_settings(text)
    try:
        spec, card, est, row, max_len = predict_for_log(log, Path(path), flags)
    except UsageError as exc:
        raise UsageError(f"{exc}; {cut}" if cut else str(exc)) from None
    # --kv-budget-gb replaces the log's pool in the KV accounting (never ignored); else the log's own pool
    if s.kv_budget_gb is not None:
        pool, pool_how = s.kv_budget_gb * 1e9, f"--kv-budget-gb {s.kv_budget_gb:g} GB replaces the pool"
        row = capacity_for_ranks(
            spec, [row_format(row)], max_len, est, card, flags.block_size or 16, pool, vllm_version=vllm_version
        )[0]
    elif log.available_kv_gib:
        pool, pool_how = log.available_kv_gib * GiB, "the log's own pool (isolates the KV accounting)"
    else:
        pool, pool_how = est.stages[0].kv_pool.bytes, "kvbench's predicted pool (the log gives none)"
    version = vllm_version or log.vllm_version or est.release.version
    _, kv = kv_terms(text, log, spec, est, row_format(row), max_len, (pool, pool_how), version)
    rows = comparisons(log, est, row.kv_tokens)
    if as_json:
        print_json(
            {
                "log": str(path),
                "model": spec.name,
                "gpu": card.key,
                "max_model_len": max_len,
                "vllm_version": est.release.version,
                "logged_vllm_version": log.vllm_version,
                "startups": count,
                "start": start,
                "start_note": note,
                "terms": [
                    {
                        "term": c.term,
                        "unit": c.unit,
                        "logged": c.logged,
                        "predicted": c.predicted,
                        "error": c.error,
                        "error_pct": c.error_pct,
                    }
                    for c in rows
                ],
                "non_kv": est.as_dict(),
                "kv_terms": terms_as_json(kv),
                "settings_cut": cut,
            }
        )
        return
    if note:
        err_console.print(escape(note))
    _print_header(path, log, spec.name, card.name, est, max_len, vllm_version)
    _print_terms(rows, est, row)
    print_kv_terms(kv)
    if cut:
        console.print(escape(cut))


def _start_note(path: Path, count: int, start: int, picked: int | None) -> str | None:
    """Which start-up of a log holding several was read (None when it holds one)."""
    return (
        f"{path} holds {count} vLLM start-ups: read start-up {start}"
        + (" (the last complete one; --start K reads another)" if picked is None else "")
        if count > 1
        else None
    )


def _print_header(path: Path, log, model: str, gpu: str, est, max_len: int, vllm_version: str | None) -> None:
    console.print(
        f"[bold]{escape(str(path))}[/]: {escape(log.model or model)} on {gpu}, "
        f"TP {est.tensor_parallel_size} PP {est.pipeline_parallel_size}, max_model_len {max_len:,}, "
        f"utilization {est.utilization:g}; "
        f"vLLM {escape(log.vllm_version or 'version not in log')} (kvbench models {est.release.version}"
        + ("" if log.vllm_version or vllm_version else "; pass --vllm-version if the server ran another")
        + ")"
    )


def _print_terms(rows: list[Comparison], est: NonKvEstimate, row) -> None:
    """The side-by-side table, term by term, and the activation peak's parts."""
    table = Table(title="vLLM's figures vs kvbench's prediction (GiB = 2^30 bytes, per GPU)", title_justify="left")
    for col in ("term", "vLLM logged", "kvbench", "error", "error %", "kvbench's source"):
        table.add_column(col, justify="left" if col in ("term", "kvbench's source") else "right")
    sources = {t.name: t for t in est.stages[0].terms}
    keys = ["total", "requested", "weights", "activation", "non_torch", "cudagraph", "kv_pool", None]
    for c, key in zip(rows, keys, strict=True):
        fmt = (lambda v: f"{v:,.0f}") if c.unit == "tokens" else (lambda v: f"{v:.2f}")
        src = sources[key].source if key else f"{row.num_blocks:,} blocks of {row.block_size} tokens"
        table.add_row(
            c.term,
            "—" if c.logged is None else fmt(c.logged),
            fmt(c.predicted),
            "—" if c.error is None else ("{:+,.0f}" if c.unit == "tokens" else "{:+.2f}").format(c.error),
            "—" if c.error_pct is None else f"{c.error_pct:+.1f}%",
            src,
        )
    console.print(table)
    parts = est.stages[0].activation_parts
    console.print("activation peak = " + " + ".join(f"{t.name} {t.bytes / GiB:.2f}" for t in parts) + " GiB")


def resolve_model_for_log(model: str | None, hf_id: str | None, source: Path) -> ModelSpec:
    """--model's spec, else the shipped model the log names (a log-only question: `capacity` imports this
    module for --from-log, never the other way round)."""
    if model is not None:
        return load_model(model)
    name = by_hf_id(hf_id) if hf_id else None
    if name is None:
        if not hf_id:
            raise UsageError(f"{source}: the log does not name the model; pass --model NAME or PATH/config.json")
        raise UsageError(
            f"{source}: model {hf_id!r} is not among kvbench's shipped models; pass --model NAME or PATH/config.json"
        )
    return load_model(name)
