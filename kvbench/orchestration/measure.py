"""The one library entrypoint for a measured run: the harness measures a plan (kvbench.harness.run.runner.execute)
and the record is judged by the one verdict (kvbench.analysis.verdict.decide), which the harness never imports. The CLI
(`kvbench run`), the asv suite (kvbench/orchestration/suite.py) and the nightly all run plans through here.
"""

from __future__ import annotations

from pathlib import Path

from kvbench.harness.run import runner
from kvbench.harness.run.runplan import Reporter, RunOptions, RunPlan
from kvbench.records import RunRecord


def execute(
    plan: RunPlan, reporter: Reporter | None = None, options: RunOptions = RunOptions()
) -> tuple[RunRecord, Path]:
    """Run `plan` to its record, with the verdict and recommendation in it: (record, path). Raises what
    kvbench.harness.run.runner.execute raises (RunInterrupted, DiskFull) after the record is written."""
    from kvbench.analysis.verdict import decide

    return runner.execute(plan, reporter, options, decide=decide)
