"""Measured max concurrency: the highest concurrency whose P95 TTFT and P95 TPOT meet an SLO.

Bracketing then bisection: double the concurrency from `start` until a probe misses the SLO (or the cap
is reached), then bisect between the last pass and the first miss. With a cap of C this takes about
2*log2(C) probes; `max_probes` bounds it. A miss is re-probed once before it counts (`confirm_misses`),
so one noisy probe on a shared machine does not end the search early.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Objective:
    """SLO on P95s, in ms; None means no bound on that metric."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None

    def check(self, summary) -> tuple[bool, str]:
        """(met, why) for a run summary (kvbench.harness.metrics.RunSummary)."""
        if summary.completed == 0 or summary.failed:
            return False, f"{summary.failed} of {summary.completed + summary.failed} requests failed"
        reasons = []
        ttft, tpot = summary.ttft_ms.get("p95"), summary.tpot_ms.get("p95")
        if self.ttft_p95_ms is not None and (ttft is None or ttft > self.ttft_p95_ms):
            reasons.append(f"TTFT P95 {ttft:.1f} ms > {self.ttft_p95_ms:g} ms")
        if self.tpot_p95_ms is not None and (tpot is None or tpot > self.tpot_p95_ms):
            reasons.append(f"TPOT P95 {tpot:.2f} ms > {self.tpot_p95_ms:g} ms")
        return (not reasons), "; ".join(reasons) or "met"


@dataclass
class Probe:
    concurrency: int
    met: bool
    why: str
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None


@dataclass
class SearchResult:
    max_concurrency: int  # 0 when even 1 misses the SLO
    capped: bool  # the cap was reached while still meeting the SLO: the true limit may be higher
    probes: list[Probe] = field(default_factory=list)


async def search(
    probe: Callable[[int], Awaitable[object]],
    objective: Objective,
    cap: int,
    start: int = 1,
    max_probes: int = 12,
    confirm_misses: bool = True,
) -> SearchResult:
    """`probe(c)` runs load at concurrency c and returns its summary."""
    probes: list[Probe] = []

    async def once(c: int) -> bool:
        summary = await probe(c)
        met, why = objective.check(summary)
        probes.append(Probe(c, met, why, summary.ttft_ms.get("p95"), summary.tpot_ms.get("p95")))
        return met

    async def run(c: int) -> bool:
        if await once(c):
            return True
        return confirm_misses and len(probes) < max_probes and await once(c)

    cap = max(1, cap)
    good, bad = 0, None
    c = min(max(1, start), cap)
    while len(probes) < max_probes:
        if await run(c):
            good = c
            if c >= cap:
                return SearchResult(good, True, probes)
            c = min(c * 2, cap)
        else:
            bad = c
            break
    while bad is not None and bad - good > 1 and len(probes) < max_probes:
        mid = (good + bad) // 2
        if await run(mid):
            good = mid
        else:
            bad = mid
    return SearchResult(good, False, probes)
