"""Versioned JSON records of `kvbench kernels` and `kvbench accuracy`, beside the machine's other results:

results/<machine>/kernels/<UTC time>.json     schema kvbench.kernels/1
results/<machine>/accuracy/<UTC time>.json    schema kvbench.accuracy/1
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from kvbench import machine
from kvbench.machine import machine_name  # noqa: F401  (one machine identity for every record)

try:
    from kvbench.records import utc_now, write_atomic  # noqa: F401  (one clock, one atomic writer)
except ImportError:  # a bare GPU box running kernels/run_on_gpu.sh MODE=sweep has no rich or pyarrow

    def utc_now() -> datetime:
        return datetime.now(UTC)

    def write_atomic(path: Path, doc: dict) -> Path:
        """The JSON document written to a temporary file beside path, then renamed over it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, separators=(",", ":"), default=str)
        os.replace(tmp, path)
        return path


def environment() -> dict:
    """The harness's environment plus what kernels depend on: the torch device and the interpreter mode."""
    import torch

    env = machine.environment()
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


def header(started: datetime, mode: str, shape, card) -> dict:
    """What every kernels record opens with (the default grid's and the sweep's): schema, when, where, the
    attention shape and the catalog GPU (kernels/bench: AttnShape, a gpus.toml card or None)."""
    from kvbench.kernels import bench

    return {
        "schema": bench.SCHEMA,
        "created_at": started.isoformat(timespec="seconds"),
        "machine": machine_name(),
        "environment": environment(),
        "mode": mode,
        "status": "complete",
        "shape": {
            "model": shape.name,
            "num_heads": shape.num_heads,
            "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim,
            "block_size": shape.block_size,
        },
        "gpu_catalog": {"key": card.key, "name": card.name, "hbm_bandwidth_gbs": card.hbm_bandwidth_gbs}
        if card
        else None,
    }
