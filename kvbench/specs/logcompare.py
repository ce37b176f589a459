"""vLLM's start-up log read for `kvbench capacity --from-log`: the log file read with a bound, the start-up
chosen when a restarted server's log holds several, and its figures set against kvbench's prediction term by
term (kvbench/cli/commands/fromlog.py prints them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import UsageError
from kvbench.core.logparse import StartupLog, malformed_capacity, parse_startup_log, split_startups
from kvbench.core.scrub import strip_control
from kvbench.core.units import GiB
from kvbench.specs.vllm_memory import NonKvEstimate

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


def no_room(log: StartupLog, est: NonKvEstimate) -> str | None:
    """A word where vLLM found no room for the KV cache (its engine then refuses to start)."""
    if log.available_kv_gib is None or log.available_kv_gib > 0:
        return None
    predicted = est.stages[0].kv_pool.bytes / GiB
    return (
        f"vLLM found {log.available_kv_gib:g} GiB for the KV cache: weights and non-KV memory filled the "
        f"requested memory, so the engine did not start (kvbench predicts {predicted:.2f} GiB"
        + ("; it does not fit either)" if predicted <= 0 else ")")
    )


def start_note(path: Path, count: int, start: int, picked: int | None) -> str | None:
    """Which start-up of a log holding several was read (None when it holds one)."""
    return (
        f"{path} holds {count} vLLM start-ups: read start-up {start}"
        + (" (the last complete one; --start K reads another)" if picked is None else "")
        if count > 1
        else None
    )
