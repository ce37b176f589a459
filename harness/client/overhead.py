"""The client's own limits, measured against the fake server: the client roofline.

- Highest sustained request rate: constant-rate schedules (no randomness in what is asked) against a
  zero-compute fake, doubling the rate until the client falls behind, then bisecting. A rate is
  sustained when every request completes, the achieved send rate is within `min_rate_fraction` of the
  target, completions keep pace, and the schedule lag P99 stays under `lag_p99_bound_ms`.
- Closed-loop throughput and open-loop schedule lag at fixed settings (concurrency 64 and 16 output tokens;
  1,000 requests/s): the figures `scripts/client_vs_vllm.py` compares with `vllm bench serve`'s client.
- Timing overhead: against a fake with known delays, what the client adds to TTFT, both against the
  configured delay and against the server's own stamps of when it received the request and wrote the
  first chunk (one CLOCK_MONOTONIC for both processes), and how long each chunk takes from the server's
  write to the client's timestamp.

The fake runs in its own process. The roofline's fake serves on uvloop and writes each response at once,
so the client, not the fake, is the bottleneck; the timing fake stays on asyncio, whose timers never
fire early.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvbench.harness.client.backend import OpenAIBackend
from kvbench.harness.client.metrics import distribution, summarize
from kvbench.harness.client.scheduler import Concurrency, Rate, run_load
from kvbench.testing.fakeserver import FakeConfig, FakeServer


@dataclass
class RatePoint:
    rate_rps: float  # target
    requests: int
    completed: int
    failed: int
    achieved_send_rate_rps: float | None
    completion_rate_rps: float | None  # completed / run duration
    schedule_lag_p50_ms: float | None
    schedule_lag_p99_ms: float | None
    sustained: bool
    why: str  # what failed, when not sustained


@dataclass
class OverheadReport:
    max_sustained_rate_rps: float | None  # None: not even the first rate was sustained
    rate_points: list[RatePoint]
    ttft_overhead_ms: dict  # measured TTFT minus the configured TTFT
    ttft_overhead_vs_server_ms: dict  # measured TTFT minus (server first write - server receipt)
    chunk_delivery_ms: dict  # client timestamp minus server write, per chunk
    settings: dict = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _rate_point(url: str, rate: float, a: dict) -> RatePoint:
    n = max(a["min_requests"], int(rate * a["seconds_per_point"]))
    prompts = [[(i * 7 + k) % 1000 + 3 for k in range(a["prompt_tokens"])] for i in range(n)]
    backend = OpenAIBackend(url, "kvbench-fake", request_timeout_s=60)
    lr = await run_load(backend, prompts, a["output_tokens"], Rate(rate, burstiness=math.inf), stall_timeout_s=10)
    s = summarize(lr)
    completion_rate = s.completed / lr.duration_s if lr.duration_s > 0 else None
    lag_p99 = s.schedule_lag_ms["p99"]
    why = []
    if s.failed or s.not_sent:
        why.append(f"{s.failed + s.not_sent} requests failed or unsent")
    if s.achieved_send_rate_rps is None or s.achieved_send_rate_rps < a["min_rate_fraction"] * rate:
        why.append(f"sent {s.achieved_send_rate_rps or 0:.0f}/s of {rate:.0f}/s")
    if completion_rate is None or completion_rate < a["min_rate_fraction"] * rate * (n - 1) / n:
        why.append(f"completed {completion_rate or 0:.0f}/s")
    if lag_p99 is None or lag_p99 > a["lag_p99_bound_ms"]:
        why.append(f"lag P99 {lag_p99 or float('nan'):.1f} ms > {a['lag_p99_bound_ms']:g} ms")
    return RatePoint(
        rate_rps=rate,
        requests=n,
        completed=s.completed,
        failed=s.failed,
        achieved_send_rate_rps=s.achieved_send_rate_rps,
        completion_rate_rps=completion_rate,
        schedule_lag_p50_ms=s.schedule_lag_ms["p50"],
        schedule_lag_p99_ms=lag_p99,
        sustained=not why,
        why="; ".join(why),
    )


async def max_sustained_rate(
    url: str,
    *,
    start_rps: float = 100.0,
    max_rps: float = 50_000.0,
    refine_steps: int = 2,
    seconds_per_point: float = 2.0,
    min_requests: int = 50,
    output_tokens: int = 16,
    prompt_tokens: int = 16,
    lag_p99_bound_ms: float = 10.0,
    min_rate_fraction: float = 0.95,
) -> tuple[float | None, list[RatePoint]]:
    """Double the rate from start_rps until a point is not sustained, then bisect (geometric) between the
    last sustained and the first failed rate `refine_steps` times."""
    a = dict(
        seconds_per_point=seconds_per_point,
        min_requests=min_requests,
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        lag_p99_bound_ms=lag_p99_bound_ms,
        min_rate_fraction=min_rate_fraction,
    )
    points: list[RatePoint] = []
    good, bad = None, None
    rate = start_rps
    while rate <= max_rps:
        p = await _rate_point(url, rate, a)
        points.append(p)
        if not p.sustained:
            bad = rate
            break
        good = rate
        rate *= 2
    if good is not None and bad is not None:
        for _ in range(refine_steps):
            mid = math.sqrt(good * bad)
            p = await _rate_point(url, mid, a)
            points.append(p)
            if p.sustained:
                good = mid
            else:
                bad = mid
    return good, points


def _token_prompts(n: int, tokens: int, salt: int) -> list[list[int]]:
    return [[(i * 7 + k * 13 + salt) % 1000 + 3 for k in range(tokens)] for i in range(n)]


async def _load(url: str, model: str, prompts: Sequence | None, shape: tuple, warmup: int, mode, **kw):
    """(prompts sent, the load's result, its summary) of one load of kvbench's client: `prompts`, or `requests`
    token-id prompts of `prompt_tokens` (shape: requests, prompt_tokens, output_tokens), after `warmup` others."""
    requests, prompt_tokens, output_tokens = shape
    prompts = list(prompts) if prompts is not None else _token_prompts(requests, prompt_tokens, 0)
    warm = _token_prompts(warmup, prompt_tokens, 500)
    backend = OpenAIBackend(url, model, request_timeout_s=60)
    lr = await run_load(backend, prompts, output_tokens, mode, stall_timeout_s=10, warmup_prompts=warm, **kw)
    return prompts, lr, summarize(lr)


async def closed_loop_rate(
    url: str,
    prompts: Sequence | None = None,
    *,
    model: str = "kvbench-fake",
    requests: int = 4000,
    concurrency: int = 64,
    output_tokens: int = 16,
    prompt_tokens: int = 16,
    warmup: int | None = None,
) -> dict[str, Any]:
    """Requests/s that kvbench's client completes at a fixed concurrency (closed loop), as
    completed / run duration (origin to the end of the last request: vLLM's definition too).

    prompts: what to send (default: `requests` token-id prompts of `prompt_tokens`); warmup: that many
    requests first, outside the figure (default: one per connection), so connections are open."""
    warm = concurrency if warmup is None else warmup
    prompts, lr, s = await _load(
        url, model, prompts, (requests, prompt_tokens, output_tokens), warm, Concurrency(concurrency)
    )
    return {
        "requests_per_s": s.request_throughput_rps,
        "requests": len(prompts),
        "completed": s.completed,
        "failed": s.failed + s.not_sent,
        "output_tokens": s.total_completion_tokens,
        "duration_s": lr.duration_s,
        "client_cpu_s": lr.client_cpu_s,
    }


async def open_loop_lag(
    url: str,
    prompts: Sequence | None = None,
    *,
    model: str = "kvbench-fake",
    rate_rps: float = 1000.0,
    burstiness: float = 1.0,
    requests: int = 3000,
    output_tokens: int = 16,
    prompt_tokens: int = 16,
    seed: int = 0,
    warmup: int = 64,
    realtime: bool = False,
) -> dict[str, Any]:
    """Schedule lag (actual minus intended send time) of kvbench's client at `rate_rps` open loop, gamma
    arrivals of shape `burstiness` (1: Poisson, inf: constant gaps), no concurrency cap; realtime: the
    client under SCHED_FIFO, as `kvbench run` runs it on CPU machines by default."""
    mode = Rate(rate_rps, burstiness=burstiness, seed=seed)
    shape = (requests, prompt_tokens, output_tokens)
    prompts, lr, s = await _load(url, model, prompts, shape, warmup, mode, realtime=realtime)
    lag = s.schedule_lag_ms
    return {
        "rate_rps": rate_rps,
        "burstiness": "inf" if math.isinf(burstiness) else burstiness,  # JSON has no infinity
        "requests": len(prompts),
        "completed": s.completed,
        "failed": s.failed + s.not_sent,
        "achieved_send_rate_rps": s.achieved_send_rate_rps,
        "schedule_lag_p50_ms": lag["p50"],
        "schedule_lag_p99_ms": lag["p99"],
        "schedule_lag_max_ms": lag["max"],
        "client_cpu_s": lr.client_cpu_s,
        "client_policy": lr.client_policy,
    }


def measure_client_speed(
    *,
    requests: int = 4000,
    concurrency: int = 64,
    output_tokens: int = 16,
    rate_rps: float = 1000.0,
    rate_requests: int = 3000,
) -> dict[str, Any]:
    """Closed-loop requests/s and open-loop (Poisson) schedule lag, at normal priority and under SCHED_FIFO
    (where permitted), of kvbench's client against the zero-compute fake in its own process (on uvloop, so
    the client is the bottleneck). Synchronous."""

    async def main():
        with FakeServer(FakeConfig(), mode="process", uvloop=True) as fake:
            url, out = fake.base_url, output_tokens
            closed = await closed_loop_rate(url, requests=requests, concurrency=concurrency, output_tokens=out)
            kw = dict(rate_rps=rate_rps, requests=rate_requests, output_tokens=out)
            lag = await open_loop_lag(url, **kw)
            lag_rt = await open_loop_lag(url, **kw, realtime=True)
        return {"closed_loop": closed, "open_loop": lag, "open_loop_realtime": lag_rt}

    return asyncio.run(main())


async def timing_overhead(
    server: FakeServer,
    *,
    ttft_s: float = 0.02,
    itl_s: float = 0.005,
    output_tokens: int = 16,
    concurrency: int = 4,
    requests: int = 60,
) -> dict[str, dict]:
    """What the client adds to latencies, from a fake with known delays (its log gives its own stamps)."""
    server.configure(ttft_s=ttft_s, itl_s=itl_s, tokens_per_chunk=1)
    prompts = [[(i * 13 + k) % 1000 + 3 for k in range(16)] for i in range(requests)]
    lr = await run_load(
        OpenAIBackend(server.base_url, "kvbench-fake"),
        prompts,
        output_tokens,
        Concurrency(concurrency),
        stall_timeout_s=10,
    )
    log = {e["request_id"]: e for e in await asyncio.to_thread(server.log, True)}
    vs_config, vs_server, delivery = [], [], []
    for r in lr.results:
        e = log.get(r.request_id)
        if not r.ok or e is None:
            continue
        vs_config.append((r.ttft_s - ttft_s) * 1e3)
        vs_server.append((r.ttft_s - (e["writes_s"][0] - e["received_s"])) * 1e3)
        sent = lr.started_at_monotonic + r.sent_s
        delivery += [(sent + t - w) * 1e3 for t, w in zip(r.chunk_arrivals_s, e["writes_s"], strict=False)]
    return {
        "ttft_overhead_ms": distribution(vs_config),
        "ttft_overhead_vs_server_ms": distribution(vs_server),
        "chunk_delivery_ms": distribution(delivery),
    }


def measure_client_overhead(*, client_uvloop: bool = False, **rate_kw: Any) -> OverheadReport:
    """Start the fakes, measure the roofline and the timing overhead, stop the fakes. Synchronous: it runs
    its own event loop (asyncio, or uvloop for the client when client_uvloop)."""

    async def main():
        with FakeServer(FakeConfig(), mode="process", uvloop=True) as fast:
            best, points = await max_sustained_rate(fast.base_url, **rate_kw)
        with FakeServer(FakeConfig(), mode="process") as timed:
            timing = await timing_overhead(timed)
        return best, points, timing

    if client_uvloop:
        import uvloop

        best, points, timing = uvloop.run(main())
    else:
        best, points, timing = asyncio.run(main())
    return OverheadReport(
        max_sustained_rate_rps=best,
        rate_points=points,
        settings={
            # the rate search's effective parameters: its defaults, then what the caller changed
            **{
                k: v.default
                for k, v in inspect.signature(max_sustained_rate).parameters.items()
                if v.default is not inspect.Parameter.empty
            },
            **rate_kw,
            "client_loop": "uvloop" if client_uvloop else "asyncio",
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        **timing,
    )


if __name__ == "__main__":  # python -m kvbench.harness.client.overhead: one report as JSON
    import json
    import sys

    report = measure_client_overhead(client_uvloop="--uvloop" in sys.argv)
    print(json.dumps(report.as_dict(), indent=1))
