"""Repeated fixed-load phases: each headline metric's mean with a 95% t interval, and a dtype's paired
difference to auto (repeat i of the dtype against repeat i of auto: the same prompts, see phases.fixed_loads).

With n repeats the interval is mean ± t(0.975, n-1) x s / sqrt(n); n = 1 gives the value and no interval.
"""

from __future__ import annotations

import math

# headline metric -> where it sits in a phase summary: (field, percentile) for latencies, (field, None) else
METRICS = {
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_p95_ms": ("ttft_ms", "p95"),
    "tpot_p50_ms": ("tpot_ms", "p50"),
    "tpot_p95_ms": ("tpot_ms", "p95"),
    "itl_p95_ms": ("itl_ms", "p95"),
    "e2e_p95_ms": ("e2e_ms", "p95"),
    "output_throughput_tps": ("output_throughput_tps", None),
    "request_throughput_rps": ("request_throughput_rps", None),
    "goodput_rps": ("goodput_rps", None),
}


def value(summary, metric: str) -> float | None:
    field, p = METRICS[metric]
    v = getattr(summary, field) if not isinstance(summary, dict) else summary.get(field)
    if p is not None:
        v = v.get(p) if v is not None else None
    return float(v) if v is not None and math.isfinite(float(v)) else None


def half_width(std: float, n: int) -> float:
    """Half the 95% t interval of a mean of `n` values whose sample standard deviation is `std` (n >= 2)."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1)) * std / math.sqrt(n)


def interval(values: list[float]) -> dict:
    """{n, mean, std, ci_low, ci_high, values}: the mean and its 95% t interval (no interval for n = 1)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"n": n, "mean": mean, "std": None, "ci_low": None, "ci_high": None, "values": values}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = half_width(std, n)
    return {"n": n, "mean": mean, "std": std, "ci_low": mean - half, "ci_high": mean + half, "values": values}


def stats(summaries: list) -> dict[str, dict]:
    """Each headline metric over the repeats (metrics with a value in every repeat)."""
    out = {}
    for metric in METRICS:
        values = [value(s, metric) for s in summaries]
        if values and all(v is not None for v in values):
            out[metric] = interval(values)
    return out


def paired(dtype_values: list[float], auto_values: list[float]) -> dict | None:
    """The dtype minus auto, paired by repeat: mean difference, its 95% t interval, and the relative change;
    `beyond_noise` when the interval excludes 0."""
    pairs = [(a, b) for a, b in zip(dtype_values, auto_values, strict=False) if a is not None and b is not None]
    if len(pairs) < 2:
        return None
    diff = interval([a - b for a, b in pairs])
    base = sum(b for _, b in pairs) / len(pairs)
    return {
        **diff,
        "relative_pct": diff["mean"] / base * 100 if base else None,
        "beyond_noise": diff["ci_low"] is not None and (diff["ci_low"] > 0 or diff["ci_high"] < 0),
    }
