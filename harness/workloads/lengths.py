"""Length and think-time distributions: the pydantic models a workload spec names, and how each is drawn.

A length is a whole number of tokens. In a spec it is either a plain integer (every request the same) or a
table with `dist` = one of:

- `uniform`: vLLM's `--random-range-ratio` semantics (vllm/benchmarks/datasets/utils.py
  `get_sampling_params`): integers drawn uniformly from [floor(mean * (1 - range_ratio)),
  ceil(mean * (1 + range_ratio))], both ends included, range_ratio in [0, 1).
- `normal`: mean and std in tokens, rounded to the nearest integer.
- `lognormal`: either `median` and `p90` (tokens; the form to use when a source reports percentiles) or
  `mean` and `sigma` (the mean in tokens and the sigma of the underlying normal). Exactly one pair.
- `histogram`: `edges` (ascending whole numbers, k + 1 of them) and `weights` (k, not all zero): a bin is
  chosen by weight, then a length uniformly within [edges[i], edges[i + 1]).

Every draw is clipped to [min, max] (min defaults to 1); the builder then clips to max_model_len.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

# Standard-normal quantile of 0.9: p90 = median * exp(Z90 * sigma) for a lognormal.
Z90 = 1.2815515655446004


class Strict(BaseModel):
    """Unknown keys, wrong types and non-finite numbers are refused (one line, see spec.explain)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def _whole(desc: str = "a whole number >= 1", ge: int = 1, default: Any = ...):
    return Field(default, ge=ge, description=desc)


class _Clip(Strict):
    min: int = _whole("a whole number >= 1 (the shortest length drawn)", default=1)
    max: int | None = _whole("a whole number >= 1 (the longest length drawn)", default=None)

    @model_validator(mode="after")
    def _order(self):
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def clip(self, values: np.ndarray) -> np.ndarray:
        return np.clip(values, self.min, self.max if self.max is not None else None).astype(np.int64)


class Fixed(_Clip):
    dist: Literal["fixed"] = "fixed"
    value: int = _whole()

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.clip(np.full(n, self.value, dtype=np.int64))

    @property
    def mean(self) -> float:
        return float(self.value)


class Uniform(_Clip):
    dist: Literal["uniform"]
    mean: int = _whole("a whole number >= 1 (vLLM's --random-input-len / --random-output-len)")
    range_ratio: float = Field(0.0, ge=0, lt=1, description="a number >= 0 and < 1 (vLLM's --random-range-ratio)")

    def bounds(self) -> tuple[int, int]:
        return math.floor(self.mean * (1 - self.range_ratio)), math.ceil(self.mean * (1 + self.range_ratio))

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        lo, hi = self.bounds()
        # The same call vLLM makes, so with the same generator state the same lengths come out.
        return self.clip(rng.integers(lo, hi + 1, size=n))


class Normal(_Clip):
    dist: Literal["normal"]
    mean: float = Field(gt=0, description="a number > 0 (tokens)")
    std: float = Field(ge=0, description="a number >= 0 (tokens)")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.clip(np.rint(rng.normal(self.mean, self.std, size=n)))


class LogNormal(_Clip):
    dist: Literal["lognormal"]
    median: float | None = Field(None, gt=0, description="a number > 0 (tokens), given with p90")
    p90: float | None = Field(None, gt=0, description="a number > median (tokens), given with median")
    mean: float | None = Field(None, gt=0, description="a number > 0 (tokens), given with sigma")
    sigma: float | None = Field(None, gt=0, description="a number > 0 (the underlying normal's sigma), given with mean")

    @model_validator(mode="after")
    def _one_pair(self):
        pct = self.median is not None or self.p90 is not None
        mom = self.mean is not None or self.sigma is not None
        half_pct = pct and (self.median is None or self.p90 is None)
        half_mom = mom and (self.mean is None or self.sigma is None)
        if pct == mom or half_pct or half_mom:
            raise ValueError("lognormal takes either median and p90, or mean and sigma (exactly one pair)")
        if pct and self.p90 <= self.median:
            raise ValueError(f"lognormal p90 ({self.p90:g}) must be > median ({self.median:g})")
        return self

    def params(self) -> tuple[float, float]:
        """(mu, sigma) of the underlying normal."""
        if self.median is not None:
            sigma = math.log(self.p90 / self.median) / Z90
            return math.log(self.median), sigma
        return math.log(self.mean) - self.sigma**2 / 2, self.sigma

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu, sigma = self.params()
        return self.clip(np.rint(rng.lognormal(mu, sigma, size=n)))


class Histogram(_Clip):
    dist: Literal["histogram"]
    edges: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=2, description="ascending whole numbers >= 1, one more than weights"
    )
    weights: list[Annotated[float, Field(ge=0)]] = Field(
        min_length=1, description="numbers >= 0, not all zero, one per bin"
    )

    @model_validator(mode="after")
    def _shape(self):
        if len(self.weights) != len(self.edges) - 1:
            raise ValueError(
                f"histogram needs one weight per bin: {len(self.edges)} edges make "
                f"{len(self.edges) - 1} bins, got {len(self.weights)} weights"
            )
        if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError(f"histogram edges must be strictly ascending, got {self.edges}")
        if sum(self.weights) <= 0:
            raise ValueError("histogram weights must not all be zero")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        w = np.asarray(self.weights, dtype=float)
        edges = np.asarray(self.edges, dtype=np.int64)
        bins = rng.choice(len(w), size=n, p=w / w.sum())
        lo, hi = edges[bins], edges[bins + 1]
        return self.clip(lo + np.floor(rng.random(n) * (hi - lo)).astype(np.int64))


def _int_is_fixed(value: Any) -> Any:
    # `prompt = 384` in a spec means every request has 384 tokens.
    if isinstance(value, int) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


Length = Annotated[
    Annotated[Fixed | Uniform | Normal | LogNormal | Histogram, Field(discriminator="dist")],
    BeforeValidator(_int_is_fixed),
]
LENGTH_FORM = (
    "a whole number >= 1, or a table with dist = fixed, uniform (mean, range_ratio), normal (mean, std), "
    "lognormal (median and p90, or mean and sigma) or histogram (edges, weights)"
)


# --- think time (multi-turn) ------------------------------------------------------------------------


class ConstantThink(Strict):
    dist: Literal["constant"] = "constant"
    seconds: float = Field(ge=0, le=3600, description="a number of seconds >= 0 and <= 3600")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.seconds, dtype=float)


class ExponentialThink(Strict):
    dist: Literal["exponential"]
    mean: float = Field(gt=0, le=3600, description="a number of seconds > 0 and <= 3600")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.mean, size=n)


class UniformThink(Strict):
    dist: Literal["uniform"]
    min: float = Field(ge=0, le=3600, description="a number of seconds >= 0 and <= 3600")
    max: float = Field(ge=0, le=3600, description="a number of seconds >= min and <= 3600")

    @model_validator(mode="after")
    def _order(self):
        if self.max < self.min:
            raise ValueError(f"think time max ({self.max:g}) must be >= min ({self.min:g})")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(self.min, self.max, size=n)


def _number_is_constant(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"dist": "constant", "seconds": float(value)}
    return value


ThinkTime = Annotated[
    Annotated[ConstantThink | ExponentialThink | UniformThink, Field(discriminator="dist")],
    BeforeValidator(_number_is_constant),
]
THINK_FORM = (
    "a number of seconds >= 0, or a table with dist = constant (seconds), exponential (mean) or uniform (min, max)"
)
