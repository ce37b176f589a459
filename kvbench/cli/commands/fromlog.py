"""`kvbench capacity --from-log FILE`: vLLM's own start-up figures next to kvbench's prediction, term by term, and
where each of the server's settings came from (kvbench/cli/commands/fromlog_inputs.py). Reading the log, choosing the
start-up and the term-by-term comparison are kvbench.specs.logcompare's; this module applies the flags and prints."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from kvbench.cli.commands.fromlog_hybrid import kv_terms, print_kv_terms, terms_as_json
from kvbench.cli.commands.fromlog_inputs import Inputs, args_summary
from kvbench.cli.commands.fromlog_predict import (
    LogOverrides,
    LogPrediction,
    gpu_for_total,
    log_prediction,
    predict_for_log,
    resolve_model_for_log,
)
from kvbench.core.errors import UsageError
from kvbench.core.logparse import StartupLog
from kvbench.core.output import console, err_console, print_json
from kvbench.core.scrub import strip_control
from kvbench.core.units import GiB
from kvbench.specs.capacity import VLLM_DEFAULT_BLOCK_SIZE, capacity_for_ranks
from kvbench.specs.formats import get_format, tracked_dtypes
from kvbench.specs.logcompare import Comparison, choose_startup, comparisons, no_room, read_log, start_note
from kvbench.specs.vllm_memory import NonKvEstimate, int_arg

__all__ = ["LogOverrides", "compare_log", "gpu_for_total", "predict_for_log", "resolve_model_for_log"]

# capacity's settings fields -> LogOverrides fields (only those the user typed override the log)
_FLAG_FIELDS = {
    "model": "model",
    "gpu": "gpu",
    "context": "context",
    "gpu_memory_utilization": "utilization",
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
    "weights": "weights",
    "vllm_version": "vllm_version",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "block_size": "block_size",
    "speculative": "speculative",
}


def overrides(settings, given: set[str] | None) -> LogOverrides:
    """The flags the user typed (`given`: settings field names; None: every flag not at its default) as overrides."""
    s = settings
    values = {}
    for field, key in _FLAG_FIELDS.items():
        value = getattr(s, field, None)
        if given is not None and field not in given:
            continue
        if given is None and field in ("tensor_parallel_size", "pipeline_parallel_size") and value == 1:
            continue
        if field == "weights" and value == "auto":
            continue
        values[key] = value
    kv = None if s.kv_dtype == ",".join(tracked_dtypes()) else s.kv_dtype  # the default: the log's dtype instead
    return LogOverrides(kv_dtype=kv, **values)


def compare_log(settings, given: set[str] | None = None) -> None:
    """`capacity --from-log`: `settings` are the command's CapacitySettings (kvbench/cli/commands/capacity_settings.py);
    `given` the settings the user typed on the command line."""
    s = settings
    path, picked = Path(s.from_log), s.start
    text = read_log(path)
    log, start, count = choose_startup(path, text, picked)
    note = start_note(path, count, start, picked)
    flags = overrides(s, given)
    cut = args_summary(log)
    try:
        pred = log_prediction(log, path, flags)
    except UsageError as exc:
        raise UsageError(f"{exc}; {cut}" if cut else str(exc)) from None
    spec, card, est, row, max_len = pred.astuple()
    version = flags.vllm_version or log.vllm_version or est.release.version
    # --kv-budget-gb replaces the log's pool in the KV accounting (never ignored); else the log's own pool
    if s.kv_budget_gb is not None:
        pool, pool_how = s.kv_budget_gb * 1e9, f"--kv-budget-gb {s.kv_budget_gb:g} GB replaces the pool"
        fmt = get_format(row.dtype)
        row = capacity_for_ranks(
            spec,
            [fmt],
            max_len,
            est,
            card,
            _block(pred),
            pool,
            vllm_version=version,
            mamba_cache_mode=pred.mamba_cache_mode,
        )[0]
    elif log.available_kv_gib:
        pool, pool_how = log.available_kv_gib * GiB, "the log's own pool (isolates the KV accounting)"
    else:
        pool, pool_how = est.stages[0].kv_pool.bytes, "kvbench's predicted pool (the log gives none)"
    _, kv = kv_terms(log, pred, get_format(row.dtype), (pool, pool_how), version)
    rows = comparisons(log, est, row.kv_tokens)
    no_room_line = no_room(log, est)
    if s.as_json:
        print_json({**_as_json(path, log, pred, rows, kv, count, start, note, cut), "no_room": no_room_line})
        return
    if note:
        err_console.print(escape(note))
    _print_header(path, log, pred)
    _print_inputs(pred.inputs)
    _print_terms(rows, est, row)
    print_kv_terms(kv)
    for line in (no_room_line, cut, *(f"malformed line, not read: {strip_control(m)!r}" for m in log.malformed)):
        if line:
            console.print(escape(line))


def _block(pred: LogPrediction) -> int:
    return int_arg(pred.inputs.value("block_size")) or VLLM_DEFAULT_BLOCK_SIZE


def _as_json(path, log, pred: LogPrediction, rows, kv, count, start, note, cut) -> dict:
    spec, card, est, _, max_len = pred.astuple()
    return {
        "log": str(path),
        "model": spec.name,
        "gpu": card.key,
        "max_model_len": max_len,
        "vllm_version": est.release.version,
        "logged_vllm_version": log.vllm_version,
        "startups": count,
        "start": start,
        "start_note": note,
        "inputs": {
            i.name: {"value": i.value, "source": i.source, "logged": i.logged, "assumed": i.assumed}
            for i in pred.inputs.values()
        },
        "assumed": [i.name for i in pred.inputs.assumed()],
        "speculative": pred.speculative.describe() if pred.speculative else None,
        "args_line": None
        if log.args_line is None
        else {
            "whole": log.args_line.whole,
            "last_key": log.args_line.last_key,
            "keys_read": list(log.args_line.values),
            "unreadable": log.args_line.unreadable,
        },
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
        "malformed": log.malformed,
    }


def _print_header(path: Path, log: StartupLog, pred: LogPrediction) -> None:
    spec, card, est, _, max_len = pred.astuple()
    shown = strip_control(log.model or spec.name)  # a log's text reaches the terminal without escape sequences
    version = strip_control(log.vllm_version or "version not in log")
    console.print(
        f"[bold]{escape(strip_control(str(path)))}[/]: {escape(shown)} on {card.name}, "
        f"TP {est.tensor_parallel_size} PP {est.pipeline_parallel_size}, max_model_len {max_len:,}, "
        f"utilization {est.utilization:g}; vLLM {escape(version)} (kvbench models {est.release.version})"
    )
    if pred.speculative:
        console.print(f"speculative decoding: {escape(pred.speculative.describe())}")


def _print_inputs(inputs: Inputs) -> None:
    """Where each setting came from; what the log did not say, with the value assumed."""
    table = Table(title="the server's settings, and where each comes from", title_justify="left")
    for col in ("setting", "value", "from"):
        table.add_column(col)
    for item in inputs.values():
        shown = "—" if item.value is None else strip_control(str(item.value))
        if item.logged is not None:
            shown += f" (the log says {strip_control(str(item.logged))})"
        table.add_row(item.name, escape(shown[:80]), escape(item.source))
    console.print(table)
    assumed = inputs.assumed()
    if assumed:
        console.print(
            "not in the log, assumed (pass the flag to set it): " + "; ".join(f"{i.name} = {i.value}" for i in assumed)
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
            escape(src),
        )
    console.print(table)
    parts = est.stages[0].activation_parts
    console.print("activation peak = " + " + ".join(f"{t.name} {t.bytes / GiB:.2f}" for t in parts) + " GiB")
