"""Measured max concurrency: the highest concurrency whose P95 TTFT and P95 TPOT meet an SLO, in few probes.

Every probe costs minutes on a GPU, so the search starts where the answer usually is and interpolates:

1. Start at the hint: the engine's reported capacity (or the capacity model's). With the KV cache as the
   limit, the SLO holds up to it; above it requests queue for a free slot and TTFT climbs steeply.
2. Bracket: above a passing hint gallop (+1, +2, +4, ...), since the knee sits a few requests past a full
   cache; without a hint, from 1 step to where the measured latency ratio (worst P95 / its bound)
   extrapolates to 1 (at most 4x); below a miss, to where it interpolates to 1 from the last pass (or from
   zero latency at zero concurrency).
3. Narrow the bracket by regula falsi on the measured ratios, falling back to bisection when the ratios
   cannot say (a failed probe, an infinite ratio) or when one side stops moving.
4. A probe whose ratio sits within `near` of 1 is re-probed once and decided on the mean ratio: only
   decisions that noise could flip cost a second probe.

`max_probes` bounds the whole search (5 by default).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from kvbench.core.datafiles import load_toml

PERCENTILES = (50, 90, 95, 99)  # the percentiles every latency distribution carries (kvbench.harness.client.metrics)
DEFAULT_MAX_PROBES = load_toml("run_defaults.toml")["run"]["max_probes"]
NEAR = 0.15  # a ratio within 15% of 1 is re-probed: on a shared 2-core box P95s move by tens of percent


def _get(obj, key: str):
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def tpot_s(r) -> float | None:
    """vLLM's TPOT of one request (a backend.RequestResult), or None (not completed, usage unknown, or a single
    output token). Here, below metrics, so that an SLO can check one request without importing the metrics."""
    if not r.ok or r.ttft_s is None or r.e2e_s is None or r.completion_tokens is None or r.completion_tokens <= 1:
        return None
    return (r.e2e_s - r.ttft_s) / (r.completion_tokens - 1)


@dataclass(frozen=True)
class SLO:
    """A service-level objective: bounds in ms that a request must meet (TTFT, TPOT as vLLM defines it, E2E;
    None = not constrained) and the percentile of a run's requests that must meet them (P95).

    Per request (`meets`): goodput counts the completed requests within every bound (DistServe). Per run
    (`check`, `ratio`): the run's P<percentile> of each bounded metric is within its bound; this is what the
    SLO search decides on. Records store it as {"ttft_p95_ms", "tpot_p95_ms", "e2e_p95_ms", "percentile"}."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    percentile: int = 95

    def __post_init__(self):
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"SLO {name} must be a finite number > 0, got {v}")
        if self.percentile not in PERCENTILES:
            raise ValueError(f"SLO percentile must be one of {', '.join(map(str, PERCENTILES))}, got {self.percentile}")

    @property
    def empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None

    def _bounds(self):
        return (
            ("ttft_ms", self.ttft_ms, "TTFT", 1),
            ("tpot_ms", self.tpot_ms, "TPOT", 2),
            ("e2e_ms", self.e2e_ms, "E2E", 0),
        )

    # -- one request ---------------------------------------------------------------------------------------

    def meets(self, r) -> bool:
        """A completed request within every bound (a request of one output token has TPOT 0, as in vLLM;
        without the server's token count its TPOT cannot be verified, so it does not count)."""
        if not r.ok:
            return False
        if self.ttft_ms is not None and not (r.ttft_s is not None and r.ttft_s * 1e3 <= self.ttft_ms):
            return False
        if self.e2e_ms is not None and not (r.e2e_s is not None and r.e2e_s * 1e3 <= self.e2e_ms):
            return False
        if self.tpot_ms is not None:
            if r.completion_tokens is None:
                return False
            t = tpot_s(r) if r.completion_tokens > 1 else 0.0
            if t is None or t * 1e3 > self.tpot_ms:
                return False
        return True

    # -- one run -------------------------------------------------------------------------------------------

    def ratio(self, summary) -> float:
        """Worst P<percentile> / its bound over the bounded metrics (<= 1 meets); inf when a request failed or
        a percentile is missing; 0 with no bound at all. `summary`: a RunSummary, a stored one, or a dict."""
        if not _get(summary, "completed") or _get(summary, "failed"):
            return math.inf
        worst = 0.0
        for key, bound, _, _ in self._bounds():
            if bound is None:
                continue
            value = (_get(summary, key) or {}).get(f"p{self.percentile}")
            if value is None:
                return math.inf
            worst = max(worst, value / bound)
        return worst

    def check(self, summary) -> tuple[bool, str]:
        """(met, why) for a run's summary."""
        completed, failed = _get(summary, "completed") or 0, _get(summary, "failed") or 0
        if completed == 0 or failed:
            return False, f"{failed} of {completed + failed} requests failed"
        reasons = []
        for key, bound, label, digits in self._bounds():
            value = (_get(summary, key) or {}).get(f"p{self.percentile}")
            if bound is not None and (value is None or value > bound):
                reasons.append(
                    f"{label} P{self.percentile} {value:.{digits}f} ms > {bound:g} ms"
                    if value is not None
                    else f"no {label} P{self.percentile}"
                )
        return (not reasons), "; ".join(reasons) or "met"

    # -- records -------------------------------------------------------------------------------------------

    def as_dict(self) -> dict:
        p = self.percentile
        return {
            f"ttft_p{p}_ms": self.ttft_ms,
            f"tpot_p{p}_ms": self.tpot_ms,
            f"e2e_p{p}_ms": self.e2e_ms,
            "percentile": p,
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> SLO | None:
        """From a record, a config or flags: {"ttft_p95_ms": .., "tpot_p95_ms": ..} (and e2e, percentile)."""
        if not d:
            return None
        p = int(d.get("percentile") or 95)
        return cls(d.get(f"ttft_p{p}_ms"), d.get(f"tpot_p{p}_ms"), d.get(f"e2e_p{p}_ms"), p)


@dataclass
class Probe:
    concurrency: int
    met: bool
    why: str
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    ratio: float | None = None  # worst P95 / bound (None: not finite)
    repeat: bool = False  # a second probe at the same concurrency (near the SLO)


@dataclass
class SearchResult:
    max_concurrency: int  # 0 when even 1 misses the SLO
    capped: bool  # the cap was reached while still meeting the SLO: the true limit may be higher
    probes: list[Probe] = field(default_factory=list)
    start: int = 1  # where the search started (the hint)


async def search(
    probe: Callable[[int], Awaitable[object]],
    slo: SLO,
    cap: int,
    hints: Sequence[float | None] = (),
    max_probes: int = DEFAULT_MAX_PROBES,
    near: float = NEAR,
) -> SearchResult:
    """`probe(c)` runs load at concurrency c and returns its summary; `hints` are concurrencies the answer
    is likely at (the engine's capacity first); the first usable one, floored into [1, cap], starts."""
    cap = max(1, int(cap))
    probes: list[Probe] = []
    ratios: dict[int, list[float]] = {}

    async def once(c: int, repeat: bool) -> float:
        summary = await probe(c)
        met, why = slo.check(summary)
        r = slo.ratio(summary)
        ratios.setdefault(c, []).append(r)
        pct = f"p{slo.percentile}"
        probes.append(
            Probe(
                c,
                met,
                why,
                (_get(summary, "ttft_ms") or {}).get(pct),
                (_get(summary, "tpot_ms") or {}).get(pct),
                r if math.isfinite(r) else None,
                repeat,
            )
        )
        return r

    async def decide(c: int) -> tuple[bool, float]:
        r = await once(c, False)
        if math.isfinite(r) and abs(r - 1) <= near and len(probes) < max_probes:
            await once(c, True)
        rs = ratios[c]
        mean = sum(rs) / len(rs)
        return mean <= 1, mean

    usable = [h for h in hints if h is not None and math.isfinite(h) and h >= 1]
    c = min(cap, int(usable[0])) if usable else 1
    start = c
    good, bad = 0, None
    r_good, r_bad = 0.0, math.inf
    last_side = None
    while len(probes) < max_probes:
        met, r = await decide(c)
        if met:
            good, r_good = c, r
            if c >= cap:
                return SearchResult(good, True, probes, start)
        else:
            bad, r_bad = c, r
        if bad is not None and bad - good <= 1:
            break
        side = "good" if met else "bad"
        if bad is None and usable:
            # Above a passing hint, gallop: +1, +2, +4, ... Past a full KV cache the waiting requests' TTFT
            # grows faster than linearly, so a ratio-based extrapolation would overshoot the knee.
            step = 2 ** sum(1 for p in probes if not p.repeat and p.concurrency > start)
            c = min(cap, c + step)
        elif bad is None:  # still bracketing upwards from 1: extrapolate where the ratio reaches 1 (at most 4x)
            grow = 1 / r if 0 < r < 1 else 4.0
            c = min(cap, max(c + 1, min(int(c * grow), 4 * c)))
        else:
            c = _next_inside(good, r_good, bad, r_bad, bisect=side == last_side)
        last_side = side
    return SearchResult(good, False, probes, start)


def _next_inside(good: int, r_good: float, bad: int, r_bad: float, bisect: bool) -> int:
    """The next concurrency strictly between good and bad: where the ratio interpolates to 1 (regula
    falsi), or the midpoint when the ratios cannot say or one side has moved twice in a row."""
    mid = (good + bad) // 2
    if bisect or not (math.isfinite(r_good) and math.isfinite(r_bad)) or r_bad <= r_good:
        return mid
    guess = good + (1 - r_good) * (bad - good) / (r_bad - r_good)
    return min(bad - 1, max(good + 1, int(guess)))
