"""Versioned JSON records of `kvbench kernels` and `kvbench accuracy`, beside the machine's other results:

results/<machine>/kernels/<UTC time>.json     schema kvbench.kernels/1
results/<machine>/accuracy/<UTC time>.json    schema kvbench.accuracy/1
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from kvbench.harness import machine as harness
from kvbench.harness.machine import machine_name  # noqa: F401  (one machine identity for every record)
from kvbench.harness.records import utc_now, write_atomic  # noqa: F401  (one clock, one atomic writer)


def environment() -> dict:
    """The harness's environment plus what kernels depend on: the torch device and the interpreter mode."""
    import torch

    env = harness.environment()
    env["cuda_runtime"] = torch.version.cuda
    env["triton_interpret"] = os.environ.get("TRITON_INTERPRET") == "1"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory,
        }
    else:
        env["device"] = {"name": "cpu"}
    return env


def record_path(results_dir: str | Path, kind: str, machine: str, when: datetime) -> Path:
    return Path(results_dir) / machine / kind / f"{when:%Y%m%dT%H%M%SZ}.json"
