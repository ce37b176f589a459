"""The trade-off curve, the bill, energy and repeats: pure functions checked against values worked by hand."""

from __future__ import annotations

import math

import pytest

from kvbench.core import front, telemetry
from kvbench.harness.run.phases import sweep_ladder
from kvbench.harness.server import energy
from kvbench.records import repeats

# -- energy ---------------------------------------------------------------------------------------------------


def samples(ts, watts, gpu=0):
    # NvmlSampler rows: t, gpu, memory, power, sm, mem, clocks..., temperature
    return [[t, gpu, 0.0, w, 0.0, 0.0, 0.0, 0.0, 0.0] for t, w in zip(ts, watts, strict=False)]


FIELDS = list(telemetry.FIELDS)  # as a record stores them


def test_constant_and_linear_power_integrate_exactly():
    ts = [i * 0.1 for i in range(101)]  # 10 Hz for 10 s
    flat = energy.nvml_energy(samples(ts, [300.0] * len(ts)), FIELDS, 2.0, 7.0)
    assert flat.valid and flat.joules == pytest.approx(1500.0) and flat.avg_watts == pytest.approx(300.0)
    ramp = energy.nvml_energy(samples(ts, [100 + 20 * t for t in ts]), FIELDS, 0.0, 10.0)  # ∫(100 + 20t) = 1000 + 1000
    assert ramp.joules == pytest.approx(2000.0)
    two = energy.nvml_energy(samples(ts, [100.0] * 101) + samples(ts, [50.0] * 101, gpu=1), FIELDS, 0.0, 10.0)
    assert two.devices == 2 and two.joules == pytest.approx(1500.0)  # GPUs summed
    assert ramp.per_token(1000, 4000).j_per_output_token == pytest.approx(2.0)
    assert ramp.j_per_total_token == pytest.approx(0.5)


def test_window_edges_are_interpolated_between_samples():
    ts = [0.0, 1.0, 2.0]
    e = energy.nvml_energy(samples(ts, [0.0, 100.0, 100.0]), FIELDS, 0.5, 1.5)
    # power 50 W at 0.5 s rising to 100 W at 1 s, flat to 1.5 s: 37.5 + 50 J
    assert e.joules == pytest.approx(87.5)


def test_gaps_and_poor_coverage_make_energy_invalid():
    ts = [i * 0.1 for i in range(30)] + [5.0 + i * 0.1 for i in range(51)]  # a 2.1 s hole between 2.9 and 5.0
    gap = energy.nvml_energy(samples(ts, [200.0] * len(ts)), FIELDS, 0.0, 10.0)
    assert not gap.valid and "gap" in gap.reason and gap.max_gap_s == pytest.approx(2.1)
    late = energy.nvml_energy(samples([6.0 + i * 0.1 for i in range(41)], [200.0] * 41), FIELDS, 0.0, 10.0)
    assert not late.valid and "cover" in late.reason and late.coverage == pytest.approx(0.4)
    assert not energy.nvml_energy([], FIELDS, 0.0, 1.0).valid


def test_rapl_counters_wrap_and_say_when_absent(tmp_path):
    e = energy.rapl_energy([(900_000_000, 1_000_000_000)], [(100_000_000, 1_000_000_000)], 10.0)
    assert e.valid and e.joules == pytest.approx(200.0) and e.avg_watts == pytest.approx(20.0)
    missing = energy.unavailable(tmp_path / "no-powercap")
    assert not missing.valid and missing.source == "unavailable" and "no RAPL" in missing.reason
    domain = tmp_path / "intel-rapl:0"
    domain.mkdir()
    (domain / "energy_uj").write_text("123\n")
    (domain / "max_energy_range_uj").write_text("1000\n")
    assert energy.rapl_read(energy.rapl_domains(tmp_path)) == [(123, 1000)]


# -- the front and the bill ---------------------------------------------------------------------------------


def pt(c, out_tps, tpot_ms, met=True):
    summary = {
        "output_throughput_tps": out_tps,
        "total_token_throughput_tps": out_tps * 4,
        "tpot_ms": {"p50": tpot_ms, "p95": tpot_ms},
        "ttft_ms": {"p50": 10.0, "p95": 20.0},
        "goodput_rps": 1.0,
    }
    return front.point(c, f"sweep-c{c}", summary, gpus=2, meets_slo=met)


def test_pareto_front_and_cost_per_million_tokens():
    pts = [pt(1, 1000, 5), pt(2, 1800, 6), pt(4, 1700, 8), pt(8, 3000, 10), pt(16, 3200, 20, met=False)]
    front.mark_front(pts)
    assert [p.concurrency for p in pts if p.on_front] == [1, 2, 8, 16]  # c=4 is beaten by c=2 on both axes
    assert pts[0].output_tps_per_gpu == 500 and pts[0].user_tps == 200  # per GPU (2), 1000 / 5 ms
    front.price(pts, 3.6)
    # 3.6 USD per GPU-hour at 500 tokens/s per GPU: 3.6 / (500 x 3600) x 1e6 = 2 USD per million
    assert pts[0].usd_per_m_output == pytest.approx(2.0) and pts[0].usd_per_m_total == pytest.approx(0.5)
    assert front.best_under_slo(pts).concurrency == 8  # c=16 missed the SLO


def test_interactivity_is_read_off_the_front_monotonically():
    pts = front.mark_front([pt(1, 1000, 5), pt(2, 1800, 6), pt(8, 3000, 10), pt(16, 3200, 20)])
    x, y, _ = front.front_curve(pts)
    assert list(x) == sorted(x)
    mid = front.at_interactivity(pts, 150.0)  # between 100 (c=8) and 166.7 (c=2) tokens/s per user
    assert 900 <= mid["output_tps_per_gpu"] <= 1500 and 2 <= mid["concurrency"] <= 8
    dense = [front.at_interactivity(pts, u)["output_tps_per_gpu"] for u in range(50, 200, 5)]
    assert all(a >= b - 1e-9 for a, b in zip(dense, dense[1:], strict=False))  # PCHIP: no overshoot between points
    assert front.at_interactivity(pts, 500.0) is None  # no extrapolation beyond the measured front
    assert front.saving_pct(0.75, 1.0) == pytest.approx(25.0) and front.saving_pct(None, 1.0) is None


def test_sweep_ladder_doubles_past_the_knee_and_includes_it():
    assert sweep_ladder(16) == [1, 2, 4, 8, 16, 32]
    assert sweep_ladder(12) == [1, 2, 4, 8, 12, 16]
    assert sweep_ladder(None) == [1, 2, 4, 8, 16]
    assert sweep_ladder(5, top=8) == [1, 2, 4, 5, 8]
    assert sweep_ladder(27, top=64) == [1, 2, 4, 8, 16, 27, 32]  # the cap bounds the ladder, the knee ends it
    assert sweep_ladder(100, top=24) == [1, 2, 4, 8, 16]


# -- repeats ------------------------------------------------------------------------------------------------


def test_repeat_interval_and_paired_difference():
    st = repeats.interval([10.0, 12.0, 14.0])
    # mean 12, s = 2, t(0.975, 2) = 4.3027: half-width 4.3027 x 2 / sqrt(3) = 4.968
    assert st["mean"] == 12 and st["std"] == pytest.approx(2.0)
    assert st["ci_high"] - st["mean"] == pytest.approx(4.3027 * 2 / math.sqrt(3), rel=1e-4)
    assert repeats.interval([5.0])["ci_low"] is None
    d = repeats.paired([11.0, 13.0, 15.0], [10.0, 12.0, 14.0])  # every pair +1: no spread, beyond noise
    assert d["mean"] == pytest.approx(1.0) and d["beyond_noise"] and d["relative_pct"] == pytest.approx(100 / 12)
    noisy = repeats.paired([11.0, 9.0, 13.0], [10.0, 12.0, 11.0])
    assert not noisy["beyond_noise"]
    summaries = [{"ttft_ms": {"p50": v, "p95": 2 * v}, "output_throughput_tps": 100 * v} for v in (1.0, 2.0, 3.0)]
    out = repeats.stats(summaries)
    assert out["ttft_p95_ms"]["mean"] == 4.0 and out["output_throughput_tps"]["values"] == [100.0, 200.0, 300.0]
    assert "goodput_rps" not in out  # a metric missing in a repeat has no interval
