"""Versioned JSON records of `kvbench kernels` and `kvbench accuracy`, beside the machine's other results:

    results/<machine>/kernels/<UTC time>.json     schema kvbench.kernels/1
    results/<machine>/accuracy/<UTC time>.json    schema kvbench.accuracy/1
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from kvbench.harness import machine as harness
from kvbench.harness.records import write_atomic  # noqa: F401  (one atomic writer for every record)


def machine_name() -> str:
    """The harness's machine name (h200-141gb, h100-sxm-80gb, cpu-<model>).

    Where nvidia-ml-py is missing but torch sees a GPU, the name comes from torch's device name and
    memory instead, through the harness's own naming rule."""
    name = harness.machine_name()
    if name.startswith("cpu-") and not os.environ.get("KVBENCH_MACHINE"):
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return harness.gpu_machine_name(props.name, props.total_memory)
    return name


def environment() -> dict:
    """The harness's environment plus what kernels depend on: the torch device and the interpreter mode."""
    import torch

    env = harness.environment()
    env["cuda_runtime"] = torch.version.cuda
    env["triton_interpret"] = os.environ.get("TRITON_INTERPRET") == "1"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                         "sm_count": props.multi_processor_count, "memory_bytes": props.total_memory}
    else:
        env["device"] = {"name": "cpu"}
    return env


def utc_now() -> datetime:
    return datetime.now(UTC)


def record_path(results_dir: str | Path, kind: str, machine: str, when: datetime) -> Path:
    return Path(results_dir) / machine / kind / f"{when:%Y%m%dT%H%M%SZ}.json"
