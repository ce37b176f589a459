"""`kvbench capacity --from-log FILE`: vLLM's own start-up figures next to kvbench's prediction, term by term, and
where each of the server's settings came from (kvbench/commands/fromlog_inputs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from kvbench.capacity import VLLM_DEFAULT_BLOCK_SIZE, capacity_for_ranks
from kvbench.commands.fromlog_hybrid import kv_terms, print_kv_terms, terms_as_json
from kvbench.commands.fromlog_inputs import Inputs, args_summary
from kvbench.commands.fromlog_predict import (
    LogOverrides,
    LogPrediction,
    gpu_for_total,
    log_prediction,
    predict_for_log,
    resolve_model_for_log,
)
from kvbench.errors import UsageError
from kvbench.formats import get_format, tracked_dtypes
from kvbench.logparse import StartupLog, malformed_capacity, parse_startup_log, split_startups
from kvbench.output import console, err_console, print_json
from kvbench.scrub import strip_control
from kvbench.units import GiB
from kvbench.vllm_memory import NonKvEstimate, int_arg

__all__ = ["LogOverrides", "compare_log", "gpu_for_total", "predict_for_log", "resolve_model_for_log"]

MAX_LOG_BYTES = 256 << 20  # a start-up log is kilobytes; a request log of days is not what --from-log reads
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
        bad = malformed_capacity(text.splitlines())
        if bad is not None:
            raise UsageError(
                f"{path}: the capacity line is malformed ({strip_control(bad)!r}); vLLM writes "
                "'GPU KV cache size: N tokens, Maximum concurrency for L tokens per request: X.XXx'"
            )
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
    return [
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
    """`capacity --from-log`: `settings` are the command's CapacitySettings (kvbench/commands/capacity_settings.py);
    `given` the settings the user typed on the command line."""
    s = settings
    path, picked = Path(s.from_log), s.start
    text = read_log(path)
    log, start, count = choose_startup(path, text, picked)
    note = _start_note(path, count, start, picked)
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
    no_room = _no_room(log, est)
    if s.as_json:
        print_json({**_as_json(path, log, pred, rows, kv, count, start, note, cut), "no_room": no_room})
        return
    if note:
        err_console.print(escape(note))
    _print_header(path, log, pred)
    _print_inputs(pred.inputs)
    _print_terms(rows, est, row)
    print_kv_terms(kv)
    for line in (no_room, cut, *(f"malformed line, not read: {strip_control(m)!r}" for m in log.malformed)):
        if line:
            console.print(escape(line))


def _no_room(log: StartupLog, est: NonKvEstimate) -> str | None:
    """A word where vLLM found no room for the KV cache (its engine then refuses to start)."""
    if log.available_kv_gib is None or log.available_kv_gib > 0:
        return None
    predicted = est.stages[0].kv_pool.bytes / GiB
    return (
        f"vLLM found {log.available_kv_gib:g} GiB for the KV cache: weights and non-KV memory filled the "
        f"requested memory, so the engine did not start (kvbench predicts {predicted:.2f} GiB"
        + ("; it does not fit either)" if predicted <= 0 else ")")
    )


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


def _start_note(path: Path, count: int, start: int, picked: int | None) -> str | None:
    """Which start-up of a log holding several was read (None when it holds one)."""
    return (
        f"{path} holds {count} vLLM start-ups: read start-up {start}"
        + (" (the last complete one; --start K reads another)" if picked is None else "")
        if count > 1
        else None
    )


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
