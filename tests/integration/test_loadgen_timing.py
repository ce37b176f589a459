"""Truth checks against a fake server with known timing (its own process: no GIL shared with the client).

Lower bounds are strict: the fake never writes a chunk before its deadline (asyncio timers do not fire
early) and a request is sent before the server receives it, so a measured latency below the configured
one is a client bug. Upper bounds allow the fake's own measured lateness plus TOL_MS for the client and
loopback on a small CI box; they are asserted on medians, where one descheduled request cannot fail them.
They assume the box is not oversubscribed (two CPU hogs on two cores push client medians past 5 ms: then
no client can time to the millisecond, and these tests say so). So the module is marked `timing`, and the
Makefile runs it on its own after the parallel tiers, whose extra worker oversubscribes the cores on purpose.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from kvbench.harness.client.backend import OpenAIBackend
from kvbench.harness.client.metrics import summarize
from kvbench.harness.client.scheduler import Concurrency, Rate, arrival_schedule, run_load
from kvbench.harness.client.workload import Workload, make_prompts
from kvbench.testing.fakeserver import FakeServer

pytestmark = pytest.mark.timing

TOL_MS = 5.0
EPS_MS = 0.05  # float noise on the lower bounds


@pytest.fixture(scope="module")
def fake():
    with FakeServer(mode="process") as srv:
        yield srv


def run(url, prompts, output_tokens, mode, **kw):
    return asyncio.run(run_load(OpenAIBackend(url, "kvbench-fake"), prompts, output_tokens, mode, **kw))


def prompts(n, length=32, seed=0):
    return make_prompts(Workload(length, 1, n, seed=seed), 1000)


def test_latencies_match_the_configured_delays(fake):
    ttft, itl, per_chunk, out = 40.0, 10.0, 4, 24  # 6 chunks of 4 tokens
    fake.configure(ttft_s=ttft / 1e3, itl_s=itl / 1e3, tokens_per_chunk=per_chunk)
    lr = run(fake.base_url, prompts(16), out, Concurrency(4))
    s = summarize(lr)
    chunks = out // per_chunk
    e2e = ttft + (chunks - 1) * itl
    tpot = (e2e - ttft) / (out - 1)

    # How late the fake itself was (its log): on a loaded box the server, not the client, may be slow.
    log = fake.log()
    late_first = np.median([(e["writes_s"][0] - e["received_s"]) * 1e3 - ttft for e in log])
    late_last = np.median([(e["writes_s"][-1] - e["received_s"]) * 1e3 - e2e for e in log])
    assert late_first >= 0 and late_last >= 0  # the fake never writes early

    assert s.completed == 16 and s.failed == 0
    for r in lr.results:
        assert r.completion_tokens == out and r.prompt_tokens == 32  # from usage
        assert r.chunk_tokens == [per_chunk] * chunks
        assert r.ttft_s * 1e3 >= ttft - EPS_MS
        assert r.e2e_s * 1e3 >= e2e - EPS_MS
    assert ttft <= s.ttft_ms["p50"] <= ttft + late_first + TOL_MS
    assert e2e <= s.e2e_ms["p50"] <= e2e + late_last + TOL_MS
    assert s.tpot_ms["p50"] == pytest.approx(tpot, abs=TOL_MS / (out - 1))
    assert s.itl_chunk_ms["p50"] == pytest.approx(itl, abs=TOL_MS)
    assert s.itl_chunk_ms["n"] == 16 * (chunks - 1)
    # Per token: a 10 ms chunk gap over 4 tokens is 2.5 ms each; the first chunk's 3 extra tokens are 0.
    assert s.itl_ms["n"] == 16 * (out - 1)
    assert s.itl_ms["p50"] == pytest.approx(itl / per_chunk, abs=TOL_MS / per_chunk)
    assert s.itl_ms["min"] == 0.0
    assert s.itl_ms["mean"] == pytest.approx(s.tpot_ms["mean"])  # per-token ITL averages to TPOT
    tc = s.token_check
    assert tc["tokens_per_chunk_mean"] == per_chunk and tc["chunk_sum_vs_usage_mismatches"] == 0
    assert tc["chunks_as_tokens_error_pct"] == pytest.approx((chunks - out) / out * 100)


def test_client_timestamps_against_the_servers_own(fake):
    """Same CLOCK_MONOTONIC on both sides: the request must leave before the server gets it, and each
    chunk must arrive after the server wrote it. What remains is the client and loopback overhead."""
    fake.configure(ttft_s=0.03, itl_s=0.01, tokens_per_chunk=2)
    lr = run(fake.base_url, prompts(12), 10, Concurrency(3))
    log = {e["request_id"]: e for e in fake.log()}
    overheads, chunk_lags = [], []
    for r in lr.results:
        e = log[r.request_id]
        sent = lr.started_at_monotonic + r.sent_s
        assert e["received_s"] >= sent  # causality on one clock
        arrivals = [sent + t for t in r.chunk_arrivals_s]
        assert len(arrivals) == len(e["writes_s"]) == 5
        # The server stamps just before each write: no chunk can arrive before its stamp.
        chunk_lags += [(a - w) * 1e3 for a, w in zip(arrivals, e["writes_s"], strict=False)]
        overheads.append(r.ttft_s * 1e3 - (e["writes_s"][0] - e["received_s"]) * 1e3)
    assert min(chunk_lags) >= 0
    assert np.median(chunk_lags) < 2.0
    assert min(overheads) >= 0
    assert np.median(overheads) < 3.0


def test_fixed_concurrency_keeps_n_in_flight(fake):
    fake.configure(ttft_s=0.02, itl_s=0.005, tokens_per_chunk=1)
    n, total = 5, 30
    lr = run(fake.base_url, prompts(total), 8, Concurrency(n))
    s = summarize(lr)
    assert s.completed == total
    assert s.concurrency["max"] == n  # never more
    assert s.concurrency["mean"] > 0.85 * n  # and, apart from the tail, never fewer
    # The server saw the same: at most n open requests at any instant, and n at some instant.
    events = sorted(
        [(e["received_s"], 1) for e in fake.log()] + [(e["writes_s"][-1], -1) for e in fake.log()],
        key=lambda x: (x[0], x[1]),
    )
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak == n
    # Closed loop: the next request is due the moment a slot frees; the lag is the client's own delay
    # (how small it stays is a performance figure, tracked by benchmarks/bench_client.py, not asserted here).
    assert all(r.intended_send_s <= r.sent_s for r in lr.results)
    assert s.schedule_lag_ms["n"] == total


def test_poisson_schedule_has_the_right_rate_and_shape():
    n, rate = 4000, 50.0
    t = arrival_schedule(n, Rate(rate, seed=1))
    gaps = np.diff(np.concatenate([[0.0], t]))
    # Mean of 4000 exponential gaps: standard error 1/sqrt(4000) = 1.6 %; allow 4 standard errors.
    assert gaps.mean() == pytest.approx(1 / rate, rel=4 / math.sqrt(n))
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.07)  # exponential: CV 1
    assert np.array_equal(t, arrival_schedule(n, Rate(rate, seed=1)))  # seeded
    assert not np.array_equal(t, arrival_schedule(n, Rate(rate, seed=2)))
    bursty = np.diff(arrival_schedule(n, Rate(rate, burstiness=0.25, seed=1)))
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)  # gamma shape k: CV 1/sqrt(k)
    const = np.diff(arrival_schedule(10, Rate(rate, burstiness=math.inf)))
    assert np.allclose(const, 1 / rate)
    assert arrival_schedule(100, Rate(rate, seed=3, rescale=True))[-1] == pytest.approx(100 / rate)
    assert not arrival_schedule(5, Rate(math.inf)).any()


@pytest.mark.parametrize("burstiness", [1.0, 0.5, math.inf])
def test_vllm_rng_reproduces_vllm_bench_serve_schedule(monkeypatch, burstiness):
    """rng="vllm": the same send times `vllm bench serve --seed S --request-rate R` would use, read from
    vLLM's own get_request with its clock and sleep replaced by recorders (no real waiting)."""
    serve = pytest.importorskip("vllm.benchmarks.serve")
    import types

    slept = []

    async def record_sleep(s):
        slept.append(s)

    monkeypatch.setattr(serve, "time", types.SimpleNamespace(time=lambda: 0.0, perf_counter=lambda: 0.0))
    monkeypatch.setattr(serve, "asyncio", types.SimpleNamespace(sleep=record_sleep))
    n, rate, seed = 40, 12.0, 7

    async def drain():
        return [r async for r, _ in serve.get_request(list(range(n)), rate, burstiness)]

    state = np.random.get_state()
    try:
        np.random.seed(seed)  # what vLLM's main does with --seed before it builds the schedule
        assert len(asyncio.run(drain())) == n
    finally:
        np.random.set_state(state)
    # With the clock frozen at its start, each sleep is that request's delay from the run start.
    ours = arrival_schedule(n, Rate(rate, burstiness=burstiness, seed=seed, rescale=True, rng="vllm"))
    assert np.allclose(slept, ours, rtol=1e-12, atol=0)
    if not math.isinf(burstiness):  # a constant gap does not depend on the seed
        assert not np.allclose(
            ours, arrival_schedule(n, Rate(rate, burstiness=burstiness, seed=seed + 1, rescale=True, rng="vllm"))
        )


def test_rate_rejects_an_unknown_rng():
    with pytest.raises(ValueError, match="rng must be one of pcg64, vllm"):
        Rate(1.0, rng="mt")


def test_rate_run_sends_on_schedule(fake):
    fake.configure(ttft_s=0.0, itl_s=0.0, tokens_per_chunk=1)
    mode = Rate(100.0, seed=5)
    lr = run(fake.base_url, prompts(60), 4, mode)
    s = summarize(lr)
    assert s.completed == 60
    sched = arrival_schedule(60, mode)
    assert [r.intended_send_s for r in lr.results] == pytest.approx(sched.tolist())  # the schedule, recorded
    assert all(r.schedule_lag_s >= 0 for r in lr.results)  # never sent early
    sent = sorted(r.sent_s for r in lr.results)
    assert s.achieved_send_rate_rps == pytest.approx(59 / (sent[-1] - sent[0]))
    assert s.schedule_lag_ms["max"] == pytest.approx(max(r.sent_s - r.intended_send_s for r in lr.results) * 1e3)


def test_concurrency_cap_shows_up_as_schedule_lag(fake):
    """Coordinated omission made visible: 12 requests due at once through 2 slots wait their turn, and the
    wait is reported, not folded away."""
    fake.configure(ttft_s=0.05, itl_s=0.0, tokens_per_chunk=1)
    lr = run(fake.base_url, prompts(12), 1, Rate(math.inf, max_concurrency=2))
    s = summarize(lr)
    assert s.completed == 12 and s.concurrency["max"] == 2
    lags = sorted(r.schedule_lag_s * 1e3 for r in lr.results)
    # Wave k (2 requests each) cannot start before k x 50 ms.
    for k in range(6):
        assert lags[2 * k] >= k * 50.0 - EPS_MS
    assert s.schedule_lag_ms["max"] >= 250.0 - EPS_MS
    # Service latency (from the actual send) leaves the queue out; the schedule-relative latency keeps it.
    for r in lr.results:
        assert r.e2e_s * 1e3 >= 50.0 - EPS_MS
    assert s.e2e_from_intended_ms["max"] >= 300.0 - EPS_MS
