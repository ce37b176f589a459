"""The one library entrypoint for a measured run: the harness measures a plan (kvbench.harness.runner.execute)
and the record is judged by the one verdict (kvbench.verdict.decide), which the harness never imports. The CLI
(`kvbench run`), the asv suite (kvbench/suite.py) and the nightly all run plans through here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvbench.harness.runner import execute as _measure
from kvbench.harness.runplan import Reporter, RunPlan
from kvbench.records import RunRecord


def execute(
    plan: RunPlan,
    reporter: Reporter | None = None,
    *,
    extra: dict | None = None,
    deadline_s: float | None = None,
    deadline_note: str | None = None,
    on_finish: Callable[[RunRecord], None] | None = None,
) -> tuple[RunRecord, Path]:
    """Run `plan` to its record, with the verdict and recommendation in it: (record, path). Raises what
    kvbench.harness.runner.execute raises (RunInterrupted, DiskFull) after the record is written."""
    from kvbench.verdict import decide

    return _measure(
        plan,
        reporter,
        decide=decide,
        extra=extra,
        deadline_s=deadline_s,
        deadline_note=deadline_note,
        on_finish=on_finish,
    )
