"""Metric math on hand-built requests: every expected number is derived here from the inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvbench.harness.client.backend import RequestResult
from kvbench.harness.client.loadresult import LoadResult
from kvbench.harness.client.metrics import distribution, itl_chunk_s, itl_token_s, summarize, tpot_s
from kvbench.harness.run.slo import SLO


def req(
    i,
    ttft,
    arrivals=None,
    tokens=None,
    completion=None,
    prompt=8,
    sent=0.0,
    intended=None,
    ok=True,
    end=None,
    requested=None,
    **kw,
):
    """A completed request: chunk arrivals in seconds after send (ttft = the first one)."""
    arrivals = [ttft] if arrivals is None else arrivals
    tokens = [1] * len(arrivals) if tokens is None else tokens
    if completion is None and all(t is not None for t in tokens):
        completion = sum(tokens)
    return RequestResult(
        index=i,
        requested_output_tokens=requested if requested is not None else (completion or 0),
        intended_send_s=sent if intended is None else intended,
        sent_s=sent,
        first_chunk_s=arrivals[0],
        ttft_s=arrivals[0],
        e2e_s=arrivals[-1],
        end_s=end if end is not None else arrivals[-1],
        chunk_arrivals_s=list(arrivals),
        chunk_tokens=list(tokens),
        prompt_tokens=prompt,
        completion_tokens=completion,
        ok=ok,
        **kw,
    )


def failed(i, label="http", status=500, sent=0.0):
    return RequestResult(
        index=i,
        sent_s=sent,
        intended_send_s=sent,
        end_s=0.01,
        ok=False,
        error_kind=label,
        error=f"HTTP {status}: boom",
        http_status=status,
    )


def load(results, duration, output_tokens=0, **kw):
    return LoadResult(results=results, duration_s=duration, started_at_monotonic=0.0, output_tokens=output_tokens, **kw)


def test_tpot_is_vllm_definition_and_needs_usage():
    r = req(0, 0.1, arrivals=[0.1, 0.2, 0.3, 0.5], tokens=[1, 1, 1, 1])
    assert tpot_s(r) == pytest.approx((0.5 - 0.1) / (4 - 1))
    assert tpot_s(req(1, 0.1, arrivals=[0.1], tokens=[1])) is None  # one token: no TPOT
    assert tpot_s(req(2, 0.1, arrivals=[0.1, 0.2], tokens=[None, None], completion=None)) is None  # usage unknown
    assert tpot_s(failed(3)) is None


def test_itl_per_token_spreads_chunk_gaps_and_averages_to_tpot():
    # Chunks of 3, 2 and 1 tokens: the first chunk's extra 2 tokens came with the first token.
    r = req(0, 0.1, arrivals=[0.1, 0.14, 0.15], tokens=[3, 2, 1])
    per_token = itl_token_s(r)
    assert per_token == pytest.approx([0.0, 0.0, 0.02, 0.02, 0.01])
    assert len(per_token) == r.completion_tokens - 1
    assert np.mean(per_token) == pytest.approx(tpot_s(r))
    assert itl_chunk_s(r) == pytest.approx([0.04, 0.01])
    assert itl_token_s(req(1, 0.1, arrivals=[0.1, 0.2], tokens=[1, None], completion=2)) is None


def test_percentiles_are_numpy_linear():
    values = np.arange(1, 101, dtype=float)  # 1..100 ms
    d = distribution(values)
    for p in (50, 90, 95, 99):
        assert d[f"p{p}"] == pytest.approx(np.percentile(values, p))
    assert d["p50"] == pytest.approx(50.5) and d["p99"] == pytest.approx(99.01)
    assert d["mean"] == pytest.approx(50.5) and d["n"] == 100
    empty = distribution([])
    assert empty["n"] == 0 and empty["p50"] is None and empty["mean"] is None


def test_summary_units_and_throughputs_from_usage():
    # Four completed requests with TTFTs of 10..40 ms and 5 tokens each in 5 chunks; one failure.
    rs = [req(i, 0.01 * (i + 1), arrivals=[0.01 * (i + 1) + 0.002 * k for k in range(5)], prompt=7) for i in range(4)]
    rs.append(failed(4))
    s = summarize(load(rs, duration=2.0, output_tokens=5))
    assert (s.completed, s.failed) == (4, 1)
    assert s.ttft_ms["mean"] == pytest.approx(25.0)  # ms, failure excluded
    assert s.ttft_ms["n"] == 4
    assert s.e2e_ms["p50"] == pytest.approx(np.median([10 + 8, 20 + 8, 30 + 8, 40 + 8]))
    assert s.tpot_ms["mean"] == pytest.approx(2.0)  # 8 ms over 4 gaps
    assert s.itl_chunk_ms["mean"] == pytest.approx(2.0) and s.itl_chunk_ms["n"] == 16
    assert s.request_throughput_rps == pytest.approx(4 / 2.0)
    assert s.output_throughput_tps == pytest.approx(20 / 2.0)
    assert s.total_token_throughput_tps == pytest.approx((20 + 28) / 2.0)
    assert s.failure_reasons == {"HTTP 500": 1}
    assert "boom" in s.failure_examples["HTTP 500"]
    assert not s.all_failed


def test_token_throughput_unknown_when_usage_missing():
    rs = [req(0, 0.01, arrivals=[0.01, 0.02], tokens=[None, None], completion=None, prompt=None)]
    s = summarize(load(rs, duration=1.0))
    assert s.completed == 1 and s.completion_tokens_unknown == 1
    assert s.output_throughput_tps is None and s.total_token_throughput_tps is None
    assert s.tpot_ms["n"] == 0 and s.itl_ms["n"] == 0
    assert s.itl_chunk_ms["n"] == 1  # chunk gaps need no token counts


def test_goodput_distserve_every_slo_inclusive_failures_count():
    rs = [
        req(0, 0.100, arrivals=[0.100, 0.110, 0.120]),  # TTFT 100, TPOT 10, E2E 120: exactly at the SLOs
        req(1, 0.101, arrivals=[0.101, 0.111, 0.121]),  # TTFT over
        req(2, 0.050, arrivals=[0.050, 0.080, 0.110]),  # TPOT 30: over
        req(3, 0.050, arrivals=[0.050], tokens=[1]),  # one token: TPOT counts as 0 for goodput
        failed(4),
    ]
    slo = SLO(ttft_ms=100, tpot_ms=10, e2e_ms=120)
    assert [slo.meets(r) for r in rs] == [True, False, False, True, False]
    s = summarize(load(rs, duration=4.0), slo)
    assert s.good_requests == 2
    assert s.goodput_rps == pytest.approx(2 / 4.0)
    assert s.goodput_fraction == pytest.approx(2 / 5)  # the failure is in the denominator
    assert s.slo == {"ttft_p95_ms": 100, "tpot_p95_ms": 10, "e2e_p95_ms": 120, "percentile": 95}
    # A TPOT SLO cannot be verified without the server's token count.
    unknown = req(5, 0.01, arrivals=[0.01, 0.02], tokens=[None, None], completion=None)
    assert not SLO(tpot_ms=1000).meets(unknown)
    assert SLO(ttft_ms=1000).meets(unknown)
    assert summarize(load(rs, duration=4.0)).goodput_rps is None  # no SLO, no goodput


def test_all_failed_detectable_and_serializable():
    s = summarize(load([failed(0), failed(1, "disconnect")], duration=1.0))
    assert s.all_failed and s.completed == 0 and s.failed == 2
    assert s.request_throughput_rps == 0.0
    assert s.ttft_ms["p50"] is None
    d = json.loads(json.dumps(s.as_dict(), allow_nan=False))
    assert d["all_failed"] is True
    assert d["failure_reasons"] == {"HTTP 500": 1, "disconnect": 1}
    assert summarize(load([], duration=0.0)).all_failed


def test_token_check_compares_chunks_with_usage():
    good = req(0, 0.01, arrivals=[0.01, 0.02, 0.03], tokens=[4, 4, 2], requested=10)
    lying = req(1, 0.01, arrivals=[0.01, 0.02], tokens=[1, 1], completion=5, requested=10)  # chunks say 2, usage 5
    short = req(2, 0.01, arrivals=[0.01], tokens=[3], requested=10, prompt=9, expected_prompt_tokens=8)
    s = summarize(load([good, lying, short], duration=1.0, output_tokens=10))
    tc = s.token_check
    assert tc["content_chunks"] == 6
    assert tc["usage_completion_tokens"] == 10 + 5 + 3
    assert tc["tokens_per_chunk_mean"] == pytest.approx(18 / 6)
    assert tc["chunks_as_tokens_error_pct"] == pytest.approx((6 - 18) / 18 * 100)
    assert tc["chunk_sum_vs_usage_mismatches"] == 1
    assert tc["short_outputs"] == 2
    assert tc["prompt_token_mismatches"] == 1


def test_schedule_lag_and_latency_from_intended_time():
    # Request 1 was due at 0 but went out at 0.5 s (a full concurrency cap): its lag is 500 ms.
    rs = [req(0, 0.1, sent=0.0, intended=0.0), req(1, 0.1, sent=0.5, intended=0.0)]
    s = summarize(load(rs, duration=1.0))
    assert s.schedule_lag_ms["max"] == pytest.approx(500.0)
    assert s.schedule_lag_ms["min"] == pytest.approx(0.0)
    assert s.e2e_ms["max"] == pytest.approx(100.0)
    assert s.e2e_from_intended_ms["max"] == pytest.approx(600.0)


def test_concurrency_is_instantaneous_in_flight():
    # Intervals [0,1], [0.5,1.5], [0.9,2.0], [1.2,1.3]: at most 3 overlap (at 0.9-1.0).
    spans = [(0.0, 1.0), (0.5, 1.0), (0.9, 1.1), (1.2, 0.1)]
    rs = [req(i, 0.05, sent=s, end=e) for i, (s, e) in enumerate(spans)]
    s = summarize(load(rs, duration=2.0))
    assert s.concurrency["max"] == 3
    area = 1.0 + 1.0 + 1.1 + 0.1
    assert s.concurrency["mean"] == pytest.approx(area / 2.0)
    # Back-to-back requests (one ends when the next starts) never count as overlapping.
    chain = [req(i, 0.05, sent=0.1 * i, end=0.1) for i in range(5)]
    assert summarize(load(chain, duration=0.5)).concurrency["max"] == 1


def test_summarize_accepts_the_stored_dict_form():
    rs = [req(0, 0.02, arrivals=[0.02, 0.03], tokens=[2, 2]), failed(1)]
    lr = load(rs, duration=1.0, output_tokens=4, mode={"kind": "concurrency", "concurrency": 2})
    stored = json.loads(json.dumps(lr.as_dict(), allow_nan=False))
    assert summarize(stored).as_dict() == summarize(lr).as_dict()
    assert stored["results"][0]["schedule_lag_s"] == 0.0


@pytest.mark.parametrize("bad", [dict(ttft_ms=0), dict(tpot_ms=-1)])
def test_slo_rejects_nonpositive(bad):
    with pytest.raises(ValueError):
        SLO(**bad)


def test_burst_delivered_streams_are_counted():
    held = req(0, 0.2, arrivals=[0.2, 0.2, 0.2002])  # every chunk within 1 ms: held back, then released
    streamed = req(1, 0.01, arrivals=[0.01, 0.02, 0.03])
    single = req(2, 0.01, arrivals=[0.01])  # one chunk says nothing about streaming
    assert summarize(load([held, streamed, single], duration=1.0)).burst_delivered_requests == 1
