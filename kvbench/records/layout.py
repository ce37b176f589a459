"""Where everything kvbench writes lies under --results: every path is built here, and none leaves the folder.

    results/<machine>/runs/<run id>.json          a run record (+ .requests/.series/.evals/.fidelity Parquet)
    results/<machine>/evals/<eval id>.json        a `kvbench eval` record
    results/<machine>/kernels/<UTC time>.json     a kernels record; accuracy/ the same for the accuracy study
    results/<machine>/logs/<name>/                vLLM and nightly logs (never committed)
    results/<machine>/machine.json                asv's machine file; results/benchmarks.json asv's suite

The machine is one safe path component (kvbench.specs.machine.check_machine_name); `inside` is the last check, on
the names (`..` included), for anything else that becomes part of a path.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from kvbench.core.errors import UsageError

RUNS_DIR = "runs"
EVALS_DIR = "evals"
LOGS_DIR = "logs"
KERNELS_DIR = "kernels"
ACCURACY_DIR = "accuracy"
DATED_KINDS = (KERNELS_DIR, ACCURACY_DIR)  # records named by the UTC time they started
ASV_MACHINE_FILE = "machine.json"


def inside(results_dir: Path | str, path: Path) -> Path:
    """`path`, refused in one line unless it lies inside results_dir (a record never escapes --results). Checked
    on the names (`..` included), not through symlinks: a machine folder linked to another disk stays usable."""
    root = Path(os.path.abspath(results_dir))
    if not Path(os.path.abspath(path)).is_relative_to(root):
        raise UsageError(f"{path} lies outside the results folder {results_dir}; check the machine name and run id")
    return Path(path)


def machine_dir(results_dir: Path | str, machine: str, *parts: str) -> Path:
    """results/<machine>[/parts...], inside results_dir."""
    return inside(results_dir, Path(results_dir, machine, *parts))


def record_path(results_dir: Path | str, machine: str, run_id: str) -> Path:
    """A run record: results/<machine>/runs/<run id>.json."""
    return machine_dir(results_dir, machine, RUNS_DIR, f"{run_id}.json")


def eval_path(results_dir: Path | str, machine: str, eval_id: str) -> Path:
    """A `kvbench eval` record: results/<machine>/evals/<eval id>.json."""
    return machine_dir(results_dir, machine, EVALS_DIR, f"{eval_id}.json")


def dated_path(results_dir: Path | str, machine: str, kind: str, when: datetime) -> Path:
    """A kernels or accuracy record: results/<machine>/<kind>/<UTC start, to the second>.json."""
    if kind not in DATED_KINDS:
        raise ValueError(f"unknown record kind {kind!r}; choose from: {', '.join(DATED_KINDS)}")
    return machine_dir(results_dir, machine, kind, f"{when:%Y%m%dT%H%M%SZ}.json")


def logs_dir(results_dir: Path | str, machine: str, name: str) -> Path:
    """A run's, an eval's or a night's logs: results/<machine>/logs/<name>/ (not committed)."""
    return machine_dir(results_dir, machine, LOGS_DIR, name)


def asv_machine_file(results_dir: Path | str, machine: str) -> Path:
    return machine_dir(results_dir, machine, ASV_MACHINE_FILE)
