"""The trade-off curve and the bill, computed from measured phases: pure functions, no I/O.

A point is one closed-loop phase at concurrency c. Its axes, as the continuous GPU benchmarks draw them:
  * x: tokens/s per user (interactivity) = 1000 / median TPOT (ms); also the E2E-normalised form, the median
    over requests of output tokens / E2E (what a user waiting for the whole answer sees);
  * y: output tokens/s per GPU = output throughput / GPUs (and total tokens/s per GPU with the prompt tokens).
The Pareto front keeps the points no other point beats on both axes. The cost of a point, with a price
per GPU-hour given: USD per million output tokens = price x GPUs / (output tokens/s x 3600) x 1e6 (and per
million total tokens). Along the front, throughput as a function of interactivity is interpolated with a
monotone cubic (PCHIP), so a cost "at Z tokens/s per user" never overshoots between measured points.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class Point:
    concurrency: int
    phase: str
    output_tps_per_gpu: float | None
    total_tps_per_gpu: float | None
    user_tps: float | None  # 1000 / median TPOT
    user_tps_e2e: float | None  # median of output tokens / E2E over requests
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tpot_p50_ms: float | None
    tpot_p95_ms: float | None
    goodput_rps: float | None
    meets_slo: bool | None = None
    on_front: bool = False
    usd_per_m_output: float | None = None
    usd_per_m_total: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def point(concurrency: int, phase: str, summary: dict, gpus: int, meets_slo: bool | None = None) -> Point:
    """A front point from a phase summary (kvbench.harness.client.metrics.RunSummary as stored)."""
    tpot = (summary.get("tpot_ms") or {}).get("p50")
    out, total = summary.get("output_throughput_tps"), summary.get("total_token_throughput_tps")
    return Point(
        concurrency=concurrency,
        phase=phase,
        output_tps_per_gpu=out / gpus if out is not None else None,
        total_tps_per_gpu=total / gpus if total is not None else None,
        user_tps=1000.0 / tpot if tpot else None,
        user_tps_e2e=summary.get("user_tps_e2e_p50"),
        ttft_p50_ms=(summary.get("ttft_ms") or {}).get("p50"),
        ttft_p95_ms=(summary.get("ttft_ms") or {}).get("p95"),
        tpot_p50_ms=tpot,
        tpot_p95_ms=(summary.get("tpot_ms") or {}).get("p95"),
        goodput_rps=summary.get("goodput_rps"),
        meets_slo=meets_slo,
    )


def mark_front(points: list[Point]) -> list[Point]:
    """Set `on_front` on the points that no other point dominates (>= on both axes, > on one)."""
    usable = [p for p in points if p.user_tps is not None and p.output_tps_per_gpu is not None]
    for p in points:
        p.on_front = p in usable and not any(
            q is not p
            and q.user_tps >= p.user_tps
            and q.output_tps_per_gpu >= p.output_tps_per_gpu
            and (q.user_tps > p.user_tps or q.output_tps_per_gpu > p.output_tps_per_gpu)
            for q in usable
        )
    return points


def usd_per_million(tps_per_gpu: float | None, price_per_gpu_hour: float) -> float | None:
    """USD per 1e6 tokens at `tps_per_gpu` tokens/s on a GPU rented at `price_per_gpu_hour` USD/h."""
    if not tps_per_gpu or tps_per_gpu <= 0:
        return None
    return price_per_gpu_hour / (tps_per_gpu * 3600.0) * 1e6


def price(points: list[Point], price_per_gpu_hour: float | None) -> list[Point]:
    if price_per_gpu_hour is not None:
        for p in points:
            p.usd_per_m_output = usd_per_million(p.output_tps_per_gpu, price_per_gpu_hour)
            p.usd_per_m_total = usd_per_million(p.total_tps_per_gpu, price_per_gpu_hour)
    return points


def front_curve(points: list[Point]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(interactivity, output tokens/s per GPU, concurrency) of the front, by increasing interactivity."""
    front = sorted((p for p in points if p.on_front), key=lambda p: p.user_tps)
    if len(front) < 2:
        return None
    x = np.array([p.user_tps for p in front])
    keep = np.concatenate([[True], np.diff(x) > 0])  # PCHIP needs strictly increasing x
    return (
        x[keep],
        np.array([p.output_tps_per_gpu for p in front])[keep],
        np.array([p.concurrency for p in front], float)[keep],
    )


def at_interactivity(points: list[Point], user_tps: float) -> dict | None:
    """Output tokens/s per GPU and concurrency on the front at `user_tps` tokens/s per user (PCHIP), or None
    when the front does not reach it (no extrapolation)."""
    from scipy.interpolate import PchipInterpolator

    curve = front_curve(points)
    if curve is None:
        return None
    x, y, c = curve
    if not (x[0] <= user_tps <= x[-1]):
        return None
    return {
        "user_tps": user_tps,
        "output_tps_per_gpu": float(PchipInterpolator(x, y)(user_tps)),
        "concurrency": float(PchipInterpolator(x, c)(user_tps)),
    }


def best_under_slo(points: list[Point]) -> Point | None:
    """The measured point with the most output tokens/s per GPU among those that met the SLO."""
    ok = [p for p in points if p.meets_slo and p.output_tps_per_gpu is not None]
    return max(ok, key=lambda p: p.output_tps_per_gpu) if ok else None


def saving_pct(cost: float | None, baseline: float | None) -> float | None:
    """How much less `cost` is than `baseline`, in % (negative: more)."""
    if cost is None or not baseline or not math.isfinite(cost):
        return None
    return (1 - cost / baseline) * 100
