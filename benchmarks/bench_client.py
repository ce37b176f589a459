"""asv: the load generator's client roofline, from kvbench.harness.client.overhead (a zero-compute fake server in
its own process; see that module for what "sustained" means).

asv treats lower as better, so the sustained rate is also tracked as its inverse, seconds per request, and
the higher-is-better tracks are named in asv.conf.json's regressions_first_commits.
"""

import math

from kvbench.harness.client.overhead import measure_client_overhead, measure_client_speed


def _nan_if_none(x):
    return math.nan if x is None else x


class ClientRoofline:
    version = "1"  # history survives cosmetic edits; bump when the measurement changes
    timeout = 600  # also bounds setup_cache (the whole measurement, ~30 s on 2 cores)
    rounds = 1
    repeat = 1
    number = 1

    def setup_cache(self):
        return measure_client_overhead().as_dict()

    def track_max_sustained_rate(self, r):
        return _nan_if_none(r["max_sustained_rate_rps"])

    track_max_sustained_rate.unit = "requests/s"

    def track_seconds_per_request_at_max_rate(self, r):
        best = r["max_sustained_rate_rps"]
        return 1.0 / best if best else math.nan

    track_seconds_per_request_at_max_rate.unit = "seconds"

    def track_ttft_overhead_vs_server_p50(self, r):
        return _nan_if_none(r["ttft_overhead_vs_server_ms"]["p50"]) / 1e3

    track_ttft_overhead_vs_server_p50.unit = "seconds"

    def track_ttft_overhead_vs_server_p99(self, r):
        return _nan_if_none(r["ttft_overhead_vs_server_ms"]["p99"]) / 1e3

    track_ttft_overhead_vs_server_p99.unit = "seconds"

    def track_ttft_overhead_vs_configured_p50(self, r):
        return _nan_if_none(r["ttft_overhead_ms"]["p50"]) / 1e3

    track_ttft_overhead_vs_configured_p50.unit = "seconds"

    def track_chunk_delivery_p99(self, r):
        return _nan_if_none(r["chunk_delivery_ms"]["p99"]) / 1e3

    track_chunk_delivery_p99.unit = "seconds"


class ClientSpeed:
    """kvbench's client alone against the zero-compute fake: closed-loop requests/s at concurrency 64 with
    16 output tokens (the setup scripts/client_vs_vllm.py compares with vllm bench serve), and the
    open-loop schedule lag P99 at 1,000 requests/s (Poisson), at normal priority and under SCHED_FIFO (as
    `kvbench run` runs the client on CPU machines; the same as normal where the OS refuses it)."""

    version = "1"
    timeout = 300  # also bounds setup_cache (~15 s on 2 cores)
    rounds = 1
    repeat = 1
    number = 1

    def setup_cache(self):
        return measure_client_speed()

    def track_closed_loop_requests_per_s(self, r):
        return _nan_if_none(r["closed_loop"]["requests_per_s"])

    track_closed_loop_requests_per_s.unit = "requests/s"

    def track_open_loop_schedule_lag_p99(self, r):
        return _nan_if_none(r["open_loop"]["schedule_lag_p99_ms"]) / 1e3

    track_open_loop_schedule_lag_p99.unit = "seconds"

    def track_open_loop_schedule_lag_p99_realtime(self, r):
        return _nan_if_none(r["open_loop_realtime"]["schedule_lag_p99_ms"]) / 1e3

    track_open_loop_schedule_lag_p99_realtime.unit = "seconds"
