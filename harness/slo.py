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

DEFAULT_MAX_PROBES = 5
NEAR = 0.15  # a ratio within 15% of 1 is re-probed: on a shared 2-core box P95s move by tens of percent


@dataclass(frozen=True)
class Objective:
    """SLO on P95s, in ms; None means no bound on that metric."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None

    def ratio(self, summary) -> float:
        """Worst P95 / its bound over the bounded metrics (<= 1 meets); inf when a request failed or a P95 is
        missing; 0 with no bound at all."""
        if summary.completed == 0 or summary.failed:
            return math.inf
        worst = 0.0
        for value, bound in ((summary.ttft_ms.get("p95"), self.ttft_p95_ms), (summary.tpot_ms.get("p95"), self.tpot_p95_ms)):
            if bound is None:
                continue
            if value is None:
                return math.inf
            worst = max(worst, value / bound)
        return worst

    def check(self, summary) -> tuple[bool, str]:
        """(met, why) for a run summary (kvbench.harness.metrics.RunSummary)."""
        if summary.completed == 0 or summary.failed:
            return False, f"{summary.failed} of {summary.completed + summary.failed} requests failed"
        reasons = []
        ttft, tpot = summary.ttft_ms.get("p95"), summary.tpot_ms.get("p95")
        if self.ttft_p95_ms is not None and (ttft is None or ttft > self.ttft_p95_ms):
            reasons.append(f"TTFT P95 {ttft:.1f} ms > {self.ttft_p95_ms:g} ms" if ttft is not None else "no TTFT P95")
        if self.tpot_p95_ms is not None and (tpot is None or tpot > self.tpot_p95_ms):
            reasons.append(f"TPOT P95 {tpot:.2f} ms > {self.tpot_p95_ms:g} ms" if tpot is not None else "no TPOT P95")
        return (not reasons), "; ".join(reasons) or "met"


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
    objective: Objective,
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
        met, why = objective.check(summary)
        r = objective.ratio(summary)
        ratios.setdefault(c, []).append(r)
        probes.append(Probe(c, met, why, summary.ttft_ms.get("p95"), summary.tpot_ms.get("p95"),
                            r if math.isfinite(r) else None, repeat))
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
