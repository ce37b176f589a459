"""LoadResult: one run's raw measurements, as the scheduler returns them and records store them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvbench.harness.client.backend import RequestResult


@dataclass
class LoadResult:
    """One run's raw measurements. `results` holds every request that was sent, in index order."""

    results: list[RequestResult]
    duration_s: float  # from the run origin to the end of the last request (or the stall/interrupt)
    started_at_monotonic: float  # perf_counter() at the run origin; request times are relative to it
    interrupted: bool = False  # cancelled (Ctrl-C): partial
    stalled: bool = False  # ended by the no-progress timeout: partial
    mode: dict[str, Any] = field(default_factory=dict)
    requested: int = 0  # prompts given
    not_sent: int = 0  # never sent because the run ended early
    output_tokens: int | None = 0  # None: one per request (see the results' requested_output_tokens)
    api: str = "completions"
    stall_timeout_s: float | None = None
    started_at_unix: float | None = None  # wall clock, metadata only
    prompt_lengths_exact: bool | None = None
    # The client's event-loop thread during the run (see clientsched): its scheduling policy, seconds on
    # CPU and seconds it was runnable but waiting for a CPU (None where the OS does not say).
    client_policy: str | None = None
    client_cpu_s: float | None = None
    client_runqueue_wait_s: float | None = None
    warmup: list[RequestResult] = field(default_factory=list)  # excluded from every statistic

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("results", "warmup")}
        d["results"] = [r.as_dict() for r in self.results]
        d["warmup"] = [r.as_dict() for r in self.warmup]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoadResult:
        d = dict(d)
        d["results"] = [RequestResult.from_dict(r) for r in d.get("results", [])]
        d["warmup"] = [RequestResult.from_dict(r) for r in d.get("warmup", [])]
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})
