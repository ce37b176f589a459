"""What a night records: the statuses of its steps, entries and the night, and each step's and entry's result."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class StepStatus(StrEnum):
    """A step of the night (history point, gate, dashboard)."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"  # disabled in the config, or the budget was spent
    REGRESSION = "regression"  # the gate found one
    NOT_RUN = "not run"  # the gate could not judge


class EntryStatus(StrEnum):
    """One matrix entry (one kvbench run)."""

    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"


class NightStatus(StrEnum):
    OK = "ok"
    REGRESSION = "regression"  # only regressions: every run itself went fine
    FAILED = "failed"


@dataclass
class StepResult:
    name: str
    status: StepStatus
    detail: str = ""
    seconds: float = 0.0
    log: str | None = None
    data: dict = field(default_factory=dict)


@dataclass
class EntryResult:
    name: str
    status: EntryStatus
    estimate_s: float
    seconds: float = 0.0
    record: str | None = None
    dtypes: dict[str, str] = field(default_factory=dict)  # dtype -> harness status
    errors: dict[str, str] = field(default_factory=dict)  # dtype -> first line of its error
    expected: dict[str, str] = field(default_factory=dict)  # dtype -> why its failure is known (config)
    error: str | None = None
    quality_breach: bool = False  # a dtype failed the run's quality gate (accuracy vs auto, at load, canaries)
