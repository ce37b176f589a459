"""The shapes of offered load: closed-loop concurrency, open-loop rates, timed replays, sessions, and the
arrival schedule a rate or replay gives (drawn up front, seeded, so lag shows up instead of hiding)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Concurrency:
    """Closed loop: keep `concurrency` requests in flight; a new one is sent as soon as one finishes."""

    concurrency: int

    def __post_init__(self):
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    @property
    def max_in_flight(self) -> int:
        return self.concurrency

    def describe(self) -> dict[str, Any]:
        return {"kind": "concurrency", "concurrency": self.concurrency}


RNGS = ("pcg64", "vllm")


@dataclass(frozen=True)
class Rate:
    """Open loop: arrivals at `rate` requests/s with gamma-distributed gaps.

    burstiness: the gamma shape, as vLLM's `--burstiness`: 1 is a Poisson process, < 1 burstier, > 1 more
        regular, `math.inf` a constant 1/rate gap. `rate=math.inf` sends everything at t=0.
    max_concurrency: optional cap on requests in flight; requests wait for a slot (their lag grows).
    seed: the schedule's seed.
    rescale: stretch the schedule so the last send is at exactly num_requests/rate, as vLLM does (removes
        seed-dependent drift in the achieved rate; the gaps are then no longer exactly gamma).
    rng: "pcg64" (numpy's default generator) or "vllm": numpy's legacy global generator seeded the way
        `vllm bench serve --seed` seeds it, so with the same seed (and rescale=True) the schedule is exactly
        the one vLLM's client sends: a comparison of the two clients then meets the same arrival bursts.
    """

    rate: float  # requests/s
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    rescale: bool = False
    rng: str = "pcg64"

    def __post_init__(self):
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.rng not in RNGS:
            raise ValueError(f"rng must be one of {', '.join(RNGS)}, got {self.rng!r}")

    @property
    def max_in_flight(self) -> int | None:
        return self.max_concurrency

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "rate",
            "rate_rps": _num(self.rate),
            "burstiness": _num(self.burstiness),
            "max_concurrency": self.max_concurrency,
            "seed": self.seed,
            "rescale": self.rescale,
            "rng": self.rng,
        }


def _num(x: float) -> float | str:
    return "inf" if math.isinf(x) else x  # JSON has no infinity


@dataclass(frozen=True)
class Timed:
    """Open loop on given send times (trace replay): request i is due `times[i]` seconds after the start.
    Like `Rate`, lateness shows as schedule lag; `max_concurrency` caps requests in flight."""

    times: tuple[float, ...]
    max_concurrency: int | None = None

    def __post_init__(self):
        if any(not (t >= 0 and math.isfinite(t)) for t in self.times):
            raise ValueError("send times must be finite and >= 0")
        if list(self.times) != sorted(self.times):
            raise ValueError("send times must not decrease")

    @property
    def max_in_flight(self) -> int | None:
        return self.max_concurrency

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "timed",
            "requests": len(self.times),
            "duration_s": self.times[-1] if self.times else 0.0,
            "max_concurrency": self.max_concurrency,
        }


@dataclass(frozen=True)
class Sessions:
    """Multi-turn conversations: each session's requests (indices) in order, turn k + 1 sent when turn k has
    finished and its think time has passed; at most `max_concurrent` sessions at once."""

    sessions: tuple[tuple[int, ...], ...]
    think_s: tuple[float, ...]  # per request index: the wait before it (0 for a session's first turn)
    max_concurrent: int

    def __post_init__(self):
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")

    @property
    def max_in_flight(self) -> int:
        return self.max_concurrent

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "sessions",
            "sessions": len(self.sessions),
            "turns": sum(len(s) for s in self.sessions),
            "max_concurrent": self.max_concurrent,
            "concurrency": self.max_concurrent,
        }


def arrival_schedule(n: int, rate: Rate | Timed) -> np.ndarray:
    """Intended send times (seconds from the run start) of `n` requests; the first gap is drawn too."""
    if n <= 0:
        return np.zeros(0)
    if isinstance(rate, Timed):
        return np.asarray(rate.times[:n], dtype=float)
    if math.isinf(rate.rate):
        return np.zeros(n)
    if math.isinf(rate.burstiness):
        gaps = np.full(n, 1.0 / rate.rate)
    else:
        # vLLM draws its gaps one by one from the global generator right after `np.random.seed(seed)`;
        # a fresh RandomState gives the same stream without touching the global one.
        rng = np.random.RandomState(rate.seed) if rate.rng == "vllm" else np.random.default_rng(rate.seed)
        gaps = rng.gamma(shape=rate.burstiness, scale=1.0 / (rate.rate * rate.burstiness), size=n)
    times = np.cumsum(gaps)
    if rate.rescale and times[-1] > 0:
        times *= (n / rate.rate) / times[-1]
    return times
