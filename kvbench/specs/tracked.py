"""The metrics kvbench tracks over time, from kvbench/data/metrics.toml (the single source of truth for
their names, labels, asv units, directions and where their numbers come from)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from kvbench.core.datafiles import load_toml
from kvbench.specs.formats import tracked_dtypes

KV_DTYPES = tracked_dtypes()  # the asv parameter (formats.toml `tracked`): the same on every machine
DIRECTIONS = ("higher", "lower")
MACHINE_KINDS = ("cpu", "gpu")
SOURCES = ("run", "accuracy", "prefix", "realmodel")
# asv benchmark class per source: `<module>.<class>.track_<metric>`
ASV_CLASSES = {
    "run": "bench_serving.Serving",
    "accuracy": "bench_accuracy.Accuracy",
    "prefix": "bench_serving.PrefixCache",
    "realmodel": "bench_serving.RealModel",  # a real pretrained model's own run (docs/guide/real-models.md)
}


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str  # the asv unit; values are stored in it
    direction: str  # "higher" or "lower" is better
    field: str  # run source: key of records.headline(); accuracy source: key of the accuracy numbers
    scale: float = 1.0  # field value x scale = value in `unit`
    source: str = "run"
    noise_pct: dict | None = None  # {machine kind: % change that is noise}; kvbench.analysis.regress's default floor
    noise_abs: float = 0.0  # absolute noise floor, in `unit`

    @property
    def benchmark(self) -> str:
        return f"{ASV_CLASSES[self.source]}.track_{self.name}"

    def from_field(self, value) -> float:
        """A headline number in the asv unit; None (not measured) becomes NaN."""
        if value is None:
            return math.nan
        return float(value) * self.scale

    def floor_pct(self, kind: str) -> float:
        """The default noise floor in % on a machine of this kind ("cpu" or "gpu")."""
        return float((self.noise_pct or {}).get(kind, 0.0))

    def is_worse(self, new: float, old: float) -> bool:
        return new < old if self.direction == "higher" else new > old


@cache
def metrics() -> tuple[Metric, ...]:
    out = []
    for name, spec in load_toml("metrics.toml")["metrics"].items():
        m = Metric(name=name, **spec)
        if m.direction not in DIRECTIONS:
            raise ValueError(f"metrics.toml: {name}: direction {m.direction!r}; choose from: {', '.join(DIRECTIONS)}")
        if set(m.noise_pct or {}) - set(MACHINE_KINDS):
            raise ValueError(
                f"metrics.toml: {name}: noise_pct keys {sorted(m.noise_pct)}; choose from: {', '.join(MACHINE_KINDS)}"
            )
        if m.source not in SOURCES:
            raise ValueError(f"metrics.toml: {name}: source {m.source!r}; choose from: {', '.join(SOURCES)}")
        out.append(m)
    return tuple(out)


def machine_kind(gpu) -> str:
    """ "gpu" for a machine whose asv `gpu` field names one, else "cpu"."""
    return "gpu" if isinstance(gpu, str) and gpu and gpu != "none" else "cpu"


def by_name() -> dict[str, Metric]:
    return {m.name: m for m in metrics()}


def by_benchmark() -> dict[str, Metric]:
    return {m.benchmark: m for m in metrics()}


def as_track(fn, metric: Metric):
    """Dress `fn` as the asv benchmark `track_<metric>`: name, doc, unit and a label that says the direction."""
    fn.__name__ = f"track_{metric.name}"
    fn.__doc__ = metric.label
    fn.unit = metric.unit
    fn.pretty_name = f"{metric.label} ({metric.unit}, {metric.direction} is better)"
    return fn


# asv names an existing environment after its interpreter's absolute path, so the same machine run from two
# checkouts (a CI runner, a second clone) would start two series, and committed file names would carry the
# path of the box that wrote them. kvbench files every point under one name instead (asvrun.stabilize).
STABLE_PYTHON = "kvbench-venv"
STABLE_ENV = "existing-pykvbench-venv"  # asv.environment.get_env_name("existing", STABLE_PYTHON, {}, {})


def one_env(name: str | None) -> str | None:
    """The environment a point or record belongs to: every `existing` environment is kvbench's one."""
    return STABLE_ENV if isinstance(name, str) and name.startswith("existing-") else name
