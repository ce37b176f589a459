"""Trace replay: a Mooncake-style JSONL trace of timestamps, lengths and shared block hashes."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from kvbench.core.errors import UsageError
from kvbench.harness.client.workload import Prompt
from kvbench.harness.workloads.context import _Context, _rng
from kvbench.harness.workloads.datasets import validated_lines
from kvbench.harness.workloads.plan import PlannedRequest


class _TraceLine(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
    timestamp: float = Field(ge=0, description="a number of milliseconds >= 0")
    input_length: int = Field(ge=1, description="a whole number >= 1")
    output_length: int = Field(ge=1, description="a whole number >= 1")
    hash_ids: list[int] = Field(default_factory=list, description="a list of whole numbers >= 0")


def read_trace(path: str) -> list[tuple[int, _TraceLine]]:
    """(line number, record) for every record of a Mooncake-style trace; one-line errors."""
    out, last = [], None
    for lineno, where, rec in validated_lines(path, _TraceLine):
        if any(h < 0 for h in rec.hash_ids):
            raise UsageError(f"{where}: hash_ids must be whole numbers >= 0")
        if last is not None and rec.timestamp < last:
            raise UsageError(
                f"{where}: timestamp {rec.timestamp:g} is earlier than the line before ({last:g}); "
                "a trace is replayed in file order, so timestamps must not decrease"
            )
        last = rec.timestamp
        out.append((lineno, rec))
    if not out:
        raise UsageError(
            f"{path}: no records (one JSON object per line: timestamp, input_length, output_length, hash_ids)"
        )
    return out


def _trace(ctx: _Context, num_requests):
    """Mooncake's format (FAST'25 trace release, kvcache-ai/Mooncake FAST25-release/README.md): `timestamp`
    (ms since the first request), `input_length`, `output_length`, `hash_ids` (remapped block hashes). A
    hash id stands for one block of `block_tokens` tokens (512 in Mooncake's traces: len(hash_ids) =
    ceil(input_length / 512) there; NVIDIA Dynamo's trace tools assume the same default block size).

    Block h's tokens are drawn from (seed, stream, h) alone, and request i's prompt is its hash ids' blocks in
    order, the last one cut to the input length, then request-unique tokens for any length the hash ids do
    not cover: requests sharing leading hash ids share exactly those leading tokens."""
    s = ctx.spec
    records = read_trace(s.path)
    n = ctx.n(num_requests, natural=len(records))
    trace_timing(s, records, n)  # refuses a replay longer than the spec allows
    t0 = records[0][1].timestamp
    blocks: dict[int, list[int]] = {}
    reqs, clipped, mismatched, ignored = [], 0, 0, 0
    for i, (lineno, rec) in enumerate(records[:n]):
        length, out, cut = ctx.fit(rec.input_length, rec.output_length)
        clipped += cut
        mismatched += len(rec.hash_ids) != math.ceil(rec.input_length / s.block_tokens)
        ids: list[int] = []
        for j, h in enumerate(rec.hash_ids):
            take = min(s.block_tokens, length - j * s.block_tokens)
            if take <= 0:
                ignored += len(rec.hash_ids) - j
                break
            if h not in blocks:
                blocks[h] = ctx.ids(_rng(ctx.seed, ctx.stream, "block", h), s.block_tokens)
            ids += blocks[h][:take]
        if len(ids) < length:
            ids += ctx.ids(_rng(ctx.seed, ctx.stream, "unique", i), length - len(ids))
        reqs.append(
            PlannedRequest(
                i,
                Prompt(ids, length, True),
                out,
                hash_ids=tuple(rec.hash_ids),
                send_at_s=(rec.timestamp - t0) / 1000.0 * s.time_scale,
                source=lineno - 1,
                token_ids=tuple(ids),
            )
        )
    if clipped:
        ctx.notes.append(f"{clipped} of {n} trace requests clipped to max_model_len {ctx.mml} (prompt tail cut)")
    if mismatched:
        ctx.notes.append(
            f"{mismatched} of {n} trace records have len(hash_ids) != "
            f"ceil(input_length / {s.block_tokens}): is block_tokens the trace's block size?"
        )
    return ctx.plan(reqs)


def trace_timing(spec, records: list | None = None, num_requests: int | None = None) -> str:
    """How long replaying the trace's first `num_requests` records (default: all) takes, and its longest idle
    gap, in one line; a UsageError when that is more than the spec's max_span_s or more records than it holds."""
    records = records if records is not None else read_trace(spec.path)
    n = num_requests or spec.num_requests or len(records)
    if n > len(records):
        raise UsageError(
            f"{spec.path} holds {len(records)} requests; {n} were asked for (a trace is replayed, not resampled)"
        )
    at = [(rec.timestamp - records[0][1].timestamp) / 1000.0 * spec.time_scale for _, rec in records[:n]]
    span = at[-1]
    if span > spec.max_span_s:
        raise UsageError(
            f"{spec.path}: replaying {n:,} requests takes {_duration(span)} at time_scale {spec.time_scale:g}, more "
            f"than max_span_s = {spec.max_span_s:g} s; raise max_span_s (trace:FILE,max_span=SECONDS), lower "
            "time_scale or replay fewer requests"
        )
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    widest = max(range(len(gaps)), key=gaps.__getitem__) if gaps else None
    gap = f"; longest idle gap {_duration(gaps[widest])} before request {widest + 2}" if widest is not None else ""
    return f"trace replay: {n:,} requests over {_duration(span)}{gap}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:,.1f} min ({seconds:,.0f} s)"
    return f"{seconds / 3600:,.1f} h ({seconds:,.0f} s)"
